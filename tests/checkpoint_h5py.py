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


def expected_shapes(layers, width, vocab, seq):
    shapes = {
        "embedding/token/weight": (vocab, width),
        "embedding/position/weight": (seq, width),
        "final_ln/weight": (width,),
        "final_ln/bias": (width,),
    }
    for layer in range(layers):
        p = "layers/%03d/" % layer
        shapes.update({
            p + "ln1/weight": (width,), p + "ln1/bias": (width,),
            p + "attn/qkv/weight": (3 * width, width), p + "attn/qkv/bias": (3 * width,),
            p + "attn/proj/weight": (width, width), p + "attn/proj/bias": (width,),
            p + "ln2/weight": (width,), p + "ln2/bias": (width,),
            p + "mlp/fc1/weight": (4 * width, width), p + "mlp/fc1/bias": (4 * width,),
            p + "mlp/fc2/weight": (width, 4 * width), p + "mlp/fc2/bias": (width,),
        })
    return shapes


def check(path):
    with h5py.File(path, "r") as f:
        attrs = f.attrs
        shapes = expected_shapes(int(attrs["model_layers"]), int(attrs["model_width"]),
                                 int(attrs["model_vocab_size"]), int(attrs["model_seq_len"]))
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
