#!/usr/bin/python3
"""Reads a Trident checkpoint with h5py alone (no Trident code) and checks it against the
config it was written with: every parameter and optimizer dataset has the global shape the
config implies (docs/checkpoint-format.md). Also: `offset FILE DATASET` prints the byte offset
of a dataset's data in the file (for the corruption test).

  checkpoint_h5py.py check FILE      exit 0 if every shape is right, else print the mismatches
  checkpoint_h5py.py offset FILE DATASET
"""
import sys

import h5py


def expected_shapes(attrs):
    """Every parameter's global shape, from the model attributes of the root (checkpoints
    written before the architecture keys existed are gpt2 with its defaults)."""
    layers, width = int(attrs["model_layers"]), int(attrs["model_width"])
    vocab, seq, heads = int(attrs["model_vocab_size"]), int(attrs["model_seq_len"]), int(attrs["model_heads"])
    arch = attrs["model_arch"] if "model_arch" in attrs else "gpt2"
    arch = arch.decode() if isinstance(arch, bytes) else str(arch)
    kv_heads = int(attrs["model_kv_heads"]) if "model_kv_heads" in attrs else heads
    ffn = int(attrs["model_ffn_width"]) if "model_ffn_width" in attrs else 4 * width
    tied = bool(int(attrs["model_tie_embeddings"])) if "model_tie_embeddings" in attrs else True
    qkv = width + 2 * kv_heads * (width // heads)  # rows of q (all heads), then k, then v
    shapes = {"embedding/token/weight": (vocab, width)}
    if not tied:
        shapes["lm_head/weight"] = (vocab, width)
    if arch == "gpt2":
        shapes.update({"embedding/position/weight": (seq, width),
                       "final_ln/weight": (width,), "final_ln/bias": (width,)})
    else:
        shapes["final_norm/weight"] = (width,)
    for layer in range(layers):
        p = "layers/%03d/" % layer
        if arch == "gpt2":
            shapes.update({
                p + "ln1/weight": (width,), p + "ln1/bias": (width,),
                p + "attn/qkv/weight": (qkv, width), p + "attn/qkv/bias": (qkv,),
                p + "attn/proj/weight": (width, width), p + "attn/proj/bias": (width,),
                p + "ln2/weight": (width,), p + "ln2/bias": (width,),
                p + "mlp/fc1/weight": (ffn, width), p + "mlp/fc1/bias": (ffn,),
                p + "mlp/fc2/weight": (width, ffn), p + "mlp/fc2/bias": (width,),
            })
        else:
            shapes.update({
                p + "attn_norm/weight": (width,),
                p + "attn/qkv/weight": (qkv, width),
                p + "attn/proj/weight": (width, width),
                p + "mlp_norm/weight": (width,),
                p + "mlp/gate_up/weight": (2 * ffn, width),
                p + "mlp/down/weight": (width, ffn),
            })
    return shapes


def check(path):
    with h5py.File(path, "r") as f:
        attrs = f.attrs
        shapes = expected_shapes(attrs)
        problems = []
        found = []
        f.visititems(lambda name, obj: found.append(name) if isinstance(obj, h5py.Dataset) else None)
        for root in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
            for name, shape in shapes.items():
                ds = root + "/" + name
                if ds not in f:
                    problems.append("missing " + ds)
                elif f[ds].shape != shape:
                    problems.append("%s has shape %s, expected %s" % (ds, f[ds].shape, shape))
                elif f[ds].dtype != "float32":
                    problems.append("%s has dtype %s" % (ds, f[ds].dtype))
        extra = set(found) - {r + "/" + n for r in ("model", "optim/exp_avg", "optim/exp_avg_sq")
                              for n in shapes}
        problems += ["unexpected dataset " + e for e in sorted(extra)]
        for line in problems:
            print(line)
        print("%d datasets checked, %d problems; step %d, layout %s" % (
            len(found), len(problems), int(attrs["step"]), attrs["layout"]))
        return 1 if problems else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2]))
    if len(sys.argv) == 4 and sys.argv[1] == "offset":
        with h5py.File(sys.argv[2], "r") as f:
            print(f[sys.argv[3]].id.get_offset())
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
