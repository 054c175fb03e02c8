#!/usr/bin/python3
"""Reads a Trident checkpoint with h5py alone (no Trident code) and checks it against the
config it was written with: every parameter and optimizer dataset has the global shape the
config implies, every dataset's checksum and the root's attributes_checksum are what
docs/checkpoint-format.md says. Also: `offset FILE DATASET` prints the byte offset of a
dataset's data in the file (for the corruption test), and `tamper` damages a checkpoint in the
ways the tests need.

  checkpoint_h5py.py check FILE      exit 0 if every shape and checksum is right, else print
                                     the problems
  checkpoint_h5py.py offset FILE DATASET
  checkpoint_h5py.py same-weights A B   exit 0 if A and B hold the same /model datasets with
                                     bitwise equal values (import of an export), else print
                                     the differences; B's optimizer moments must be zeros
  checkpoint_h5py.py same-values A B TOLERANCE   exit 0 if A and B (e.g. written by different
                                     parallel layouts) pass `check` and hold the same datasets
                                     (model and optimizer) with the same shapes, at the same
                                     step, each dataset's values within TOLERANCE times its
                                     largest magnitude in B; prints the worst dataset
  checkpoint_h5py.py same-fp8-state A B TOLERANCE   exit 0 if A and B hold the same FP8
                                     scaling state datasets (/fp8, train.fp8_recipe =
                                     "delayed"; at least one), every value within TOLERANCE
                                     of the larger magnitude of the pair (the state holds
                                     scales of ~1e7 beside amaxes of ~1e-3)
  checkpoint_h5py.py tamper FILE delete-checksum DATASET
  checkpoint_h5py.py tamper FILE checksum-type DATASET string|float
  checkpoint_h5py.py tamper FILE delete DATASET
  checkpoint_h5py.py tamper FILE set DATASET FLAT_INDEX VALUE [rechecksum]
        (rechecksum: store the checksum of the new values, so that only the value is wrong)
  checkpoint_h5py.py tamper FILE attr NAME INTEGER [reseal]
        (reseal: store the attributes_checksum of the new attributes)
  checkpoint_h5py.py tamper FILE attr-string NAME TEXT [reseal]
"""
import sys
import tomllib

import h5py
import numpy as np

U = np.uint64


def mix64(z):
    z = (z ^ (z >> U(30))) * U(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> U(27))) * U(0x94D049BB133111EB)
    return z ^ (z >> U(31))


def checksum(values):
    """The checksum of a whole dataset (docs/checkpoint-format.md, "Integrity")."""
    bits = np.ascontiguousarray(values, dtype="<f4").ravel().view("<u4").astype(U)
    index = np.arange(bits.size, dtype=U)
    with np.errstate(over="ignore"):
        return int(mix64(index * U(0x9E3779B97F4A7C15) ^ bits).sum(dtype=U))


def text(value):
    """A string attribute's text: h5py reads Trident's fixed-length strings as bytes
    (docs/checkpoint-format.md), variable-length ones (files before 2026-12-07) as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def attributes_checksum(attrs):
    """FNV-1a 64 over `name NUL kind NUL value NUL` of every attribute but attributes_checksum,
    in byte order of the names (docs/checkpoint-format.md, "Attributes")."""
    h = 0xCBF29CE484222325
    for name in sorted(attrs.keys(), key=lambda k: k.encode()):
        if name == "attributes_checksum":
            continue
        v = attrs[name]
        if isinstance(v, (bytes, str)):
            kind, value = "s", text(v)
        elif isinstance(v, np.unsignedinteger) and v.dtype.itemsize == 8:
            kind, value = "u", str(int(v))
        elif isinstance(v, (np.integer, int)):
            kind, value = "i", str(int(v))
        elif isinstance(v, (np.floating, float)):
            kind, value = "f", "%.17g" % float(v)
        else:
            raise ValueError("attribute %s of type %s" % (name, type(v)))
        for field in (name, kind, value):
            for b in field.encode() + b"\0":
                h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def model_config(attrs):
    """The [model] table of the run's resolved config (the root's `config` attribute)."""
    config = text(attrs["config"]) if "config" in attrs else ""
    return tomllib.loads(config).get("model", {}) if config else {}


def moe_layers(attrs):
    """{layer: experts} of a mixture of experts: every model.moe_layer_interval-th layer."""
    model = model_config(attrs)
    experts, interval = int(model.get("moe_experts", 0)), int(model.get("moe_layer_interval", 1))
    if experts == 0:
        return {}
    return {layer: experts for layer in range(int(attrs["model_layers"])) if layer % interval == 0}


def expected_shapes(attrs):
    """Every parameter's global shape, from the model attributes of the root (checkpoints
    written before the architecture keys existed are gpt2 with its defaults), a mixture of
    experts' from the config's model table."""
    layers, width = int(attrs["model_layers"]), int(attrs["model_width"])
    vocab, seq, heads = int(attrs["model_vocab_size"]), int(attrs["model_seq_len"]), int(attrs["model_heads"])
    arch = text(attrs["model_arch"]) if "model_arch" in attrs else "gpt2"
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
    moe = moe_layers(attrs)
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
        if layer in moe:  # the router and the stacked experts in place of the MLP
            e = moe[layer]
            for name in list(shapes):
                if name.startswith(p + "mlp/"):
                    del shapes[name]
            shapes[p + "mlp/router/weight"] = (e, width)
            if arch == "gpt2":
                shapes.update({
                    p + "mlp/experts/fc1/weight": (e * ffn, width), p + "mlp/experts/fc1/bias": (e * ffn,),
                    p + "mlp/experts/fc2/weight": (e * width, ffn), p + "mlp/experts/fc2/bias": (e * width,),
                })
            else:
                shapes.update({
                    p + "mlp/experts/gate_up/weight": (2 * e * ffn, width),
                    p + "mlp/experts/down/weight": (e * width, ffn),
                })
    return shapes


def fp8_state_shapes(attrs):
    """The FP8 scaling state's datasets of a run with train.precision = "fp8" and
    train.fp8_recipe = "delayed" (docs/checkpoint-format.md): one per layer whose linear layers
    run in FP8, 12 rows (qkv, proj, up, down; each x, w, dy) of the scale, the steps recorded
    and the amax history; a MoE layer's 6 + 6 E rows (qkv, proj, every expert's up, then every
    expert's down)."""
    config = attrs["config"]
    train = tomllib.loads(text(config))["train"]
    if train.get("precision") != "fp8" or train.get("fp8_recipe", "current") != "delayed":
        return {}
    layers = int(attrs["model_layers"])
    first = int(train.get("fp8_skip_first_layers", 1))
    last = int(train.get("fp8_skip_last_layers", 1))
    history = int(train.get("fp8_amax_history", 1024))
    moe = moe_layers(attrs)
    return {"fp8/layers/%03d" % layer: (3 * (2 + 2 * moe[layer]) if layer in moe else 12, 2 + history)
            for layer in range(layers) if first <= layer < layers - last}


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
        fp8 = fp8_state_shapes(attrs)
        if fp8 and next(iter(fp8)) in f:  # all or none
            for name, shape in fp8.items():
                if name not in f:
                    problems.append("missing " + name)
                elif f[name].shape != shape or f[name].dtype != "float32":
                    problems.append("%s has shape %s and dtype %s, expected %s float32" % (
                        name, f[name].shape, f[name].dtype, shape))
        extra = set(found) - {r + "/" + n for r in ("model", "optim/exp_avg", "optim/exp_avg_sq")
                              for n in shapes} - set(fp8)
        problems += ["unexpected dataset " + e for e in sorted(extra)]
        for name in found:
            d = f[name]
            if "checksum" not in d.attrs:
                problems.append("%s has no checksum" % name)
            elif checksum(d[...]) != int(d.attrs["checksum"]):
                problems.append("%s: checksum mismatch" % name)
        if int(attrs["format_version"]) >= 2 and \
                int(attrs["attributes_checksum"]) != attributes_checksum(attrs):
            problems.append("root attributes: attributes_checksum mismatch")
        for line in problems:
            print(line)
        print("%d datasets checked, %d problems; step %d, layout %s" % (
            len(found), len(problems), int(attrs["step"]), text(attrs["layout"])))
        return 1 if problems else 0


def tamper(path, action, args):
    with h5py.File(path, "r+") as f:
        if action == "delete-checksum":
            del f[args[0]].attrs["checksum"]
        elif action == "checksum-type":
            d = f[args[0]]
            old = int(d.attrs["checksum"])
            d.attrs["checksum"] = str(old) if args[1] == "string" else float(old)
        elif action == "delete":
            del f[args[0]]
        elif action == "delete-attr":
            del f.attrs[args[0]]
            if args[1:] == ["reseal"]:
                f.attrs.modify("attributes_checksum", np.uint64(attributes_checksum(f.attrs)))
        elif action == "set":
            d = f[args[0]]
            values = d[...]
            values.reshape(-1)[int(args[1])] = float(args[2])
            d[...] = values
            if args[3:] == ["rechecksum"]:
                d.attrs.modify("checksum", np.uint64(checksum(values)))
        elif action in ("attr", "attr-string"):
            value = np.int64(int(args[1])) if action == "attr" else args[1]
            f.attrs[args[0]] = value
            if args[2:] == ["reseal"]:
                f.attrs.modify("attributes_checksum", np.uint64(attributes_checksum(f.attrs)))
        else:
            sys.exit("unknown tamper action " + action)


def same_weights(a_path, b_path):
    problems = []
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        def datasets(f, root):
            names = []
            f[root].visititems(lambda n, o: names.append(root + "/" + n)
                               if isinstance(o, h5py.Dataset) else None)
            return sorted(names)
        names_a, names_b = datasets(a, "/model"), datasets(b, "/model")
        if names_a != names_b:
            problems.append(f"datasets differ: only in A {sorted(set(names_a) - set(names_b))}, "
                            f"only in B {sorted(set(names_b) - set(names_a))}")
        for name in sorted(set(names_a) & set(names_b)):
            x, y = a[name][...], b[name][...]
            if x.shape != y.shape or not np.array_equal(x.view("<u4"), y.view("<u4")):
                problems.append(f"{name}: values differ")
        for name in datasets(b, "/optim"):
            if np.any(b[name][...] != 0):
                problems.append(f"{b_path}: {name} is not zero")
    for p in problems:
        print(p)
    if not problems:
        print(f"same weights: {len(names_a)} datasets bitwise equal")
    return 1 if problems else 0


def same_values(a_path, b_path, tolerance):
    """A and B hold the same global tensors: every dataset, its checksum recomputed (check),
    compared element by element; the difference is relative to the dataset's largest |B|."""
    if check(a_path) or check(b_path):
        print("same-values: a checkpoint fails the check above")
        return 1
    problems, worst, worst_name, compared, elements = [], 0.0, "", 0, 0
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        def datasets(f):
            names = []
            f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
            return sorted(names)
        names_a, names_b = datasets(a), datasets(b)
        if names_a != names_b:
            problems.append(f"datasets differ: only in A {sorted(set(names_a) - set(names_b))}, "
                            f"only in B {sorted(set(names_b) - set(names_a))}")
        if int(a.attrs["step"]) != int(b.attrs["step"]):
            problems.append(f"steps differ: {int(a.attrs['step'])} and {int(b.attrs['step'])}")
        for name in sorted(set(names_a) & set(names_b)):
            x = a[name][...].astype(np.float64)
            y = b[name][...].astype(np.float64)
            if x.shape != y.shape:
                problems.append(f"{name}: shapes {x.shape} and {y.shape}")
                continue
            scale = float(np.max(np.abs(y))) if y.size else 0.0
            diff = float(np.max(np.abs(x - y))) if y.size else 0.0
            relative = diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))
            if relative > tolerance:
                problems.append(f"{name}: differs by {relative:.3e} of its largest value")
            if relative >= worst:
                worst, worst_name = relative, name
            compared += 1
            elements += y.size
    if compared == 0:
        problems.append("no datasets compared")
    return report(problems, f"same values: {compared} datasets, {elements} elements compared; "
                            f"worst {worst_name} {worst:.3e} of its largest value (tolerance "
                            f"{tolerance:g})")


def report(problems, summary):
    """Prints the problems and the summary with their count; the exit status."""
    for p in problems:
        print(p)
    print(f"{summary}; {len(problems)} problems")
    return 1 if problems else 0


def same_fp8_state(a_path, b_path, tolerance):
    """A and B hold the same FP8 scaling state (both pass `check`), value by value."""
    if check(a_path) or check(b_path):
        print("same-fp8-state: a checkpoint fails the check above")
        return 1
    problems, worst, compared = [], 0.0, 0
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        names = sorted(fp8_state_shapes(b.attrs))
        for name in names:
            if name not in a or name not in b:
                problems.append(f"{name} missing in {'A' if name not in a else 'B'}")
                continue
            x = a[name][...].astype(np.float64)
            y = b[name][...].astype(np.float64)
            size = np.maximum(np.abs(x), np.abs(y))
            relative = np.where(size > 0, np.abs(x - y) / np.where(size > 0, size, 1), 0.0)
            if float(relative.max()) > tolerance:
                at = np.unravel_index(int(relative.argmax()), relative.shape)
                problems.append(f"{name}{list(at)}: {x[at]:.9g} and {y[at]:.9g}")
            worst = max(worst, float(relative.max()))
            compared += y.size
    if compared == 0:
        problems.append("no FP8 state compared")
    return report(problems, f"same FP8 state: {compared} values compared, worst {worst:.3e} "
                            f"(tolerance {tolerance:g})")


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "same-fp8-state":
        sys.exit(same_fp8_state(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    if len(sys.argv) == 5 and sys.argv[1] == "same-values":
        sys.exit(same_values(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    if len(sys.argv) == 4 and sys.argv[1] == "same-weights":
        sys.exit(same_weights(sys.argv[2], sys.argv[3]))
    if len(sys.argv) >= 4 and sys.argv[1] == "tamper":
        tamper(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    if len(sys.argv) == 3 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2]))
    if len(sys.argv) == 4 and sys.argv[1] == "offset":
        with h5py.File(sys.argv[2], "r") as f:
            print(f[sys.argv[3]].id.get_offset())
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
