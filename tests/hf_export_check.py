#!/usr/bin/env python3
"""Checks a `trident export --format hf` directory against the checkpoint it came from.

    hf_export_check.py CKPT.h5 OUT_DIR [--dtype f32|bf16] [--sharded]

Independent of Trident's C++: the Hugging Face names, shapes and transpositions are written
out here again (as in data_tools/hf_reference.py), the tensors are read with
safetensors.numpy.load_file (f32) or from the raw bytes (bf16, which numpy lacks) and the
checkpoint with h5py. Checks: config.json's fields against the stored config; the files'
format (8-byte header length, header padded with spaces to a multiple of 8, __metadata__
{"format": "pt"}, tensors back to back in name order); exactly the expected names, their
shapes and every value (bf16: the round-to-nearest-even of the float32 value); sharded
exports: model-0000i-of-0000N.safetensors and model.safetensors.index.json with
metadata.total_size and a weight_map naming every tensor's file. Exit 0 on success, 1 with
one line per problem otherwise. Needs the repository's .venv (safetensors).
"""
import argparse
import json
import os
import re
import struct
import sys
import tomllib

import h5py
import numpy as np
from safetensors.numpy import load_file

from checkpoint_h5py import text  # a string attribute's text (bytes or str)

problems = []


def check(cond, what):
    if not cond:
        problems.append(what)
    return cond


def model_shape(cfg):
    m = cfg["model"]
    arch = m.get("arch", "gpt2")
    C, NH = int(m["width"]), int(m["heads"])
    KVH = int(m.get("kv_heads", 0)) or NH
    F = int(m.get("ffn_width", 0))
    if F <= 0:
        F = (8 * C // 3 + 255) // 256 * 256 if arch == "llama" else 4 * C
    tied = bool(m.get("tie_embeddings", arch != "llama"))
    return arch, int(m["layers"]), C, NH, KVH, F, int(m["vocab_size"]), int(m["seq_len"]), tied


def expected_tensors(f, cfg):
    """{hf name: float32 array} from the checkpoint."""
    arch, L, C, NH, KVH, F, V, T, tied = model_shape(cfg)
    E = int(cfg["model"].get("moe_experts", 0))
    HS = C // NH
    H, K = NH * HS, KVH * HS

    def ds(name):
        parts = name.split(".")
        if parts[0] == "layers":
            parts[1] = "%03d" % int(parts[1])
        return f["/model/" + "/".join(parts)][...]

    out = {}
    if arch == "gpt2":
        out["transformer.wte.weight"] = ds("embedding.token.weight")
        out["transformer.wpe.weight"] = ds("embedding.position.weight")
        for l in range(L):
            p, h = f"layers.{l}.", f"transformer.h.{l}."
            out[h + "ln_1.weight"] = ds(p + "ln1.weight")
            out[h + "ln_1.bias"] = ds(p + "ln1.bias")
            out[h + "attn.c_attn.weight"] = ds(p + "attn.qkv.weight").T   # Conv1D: [in, out]
            out[h + "attn.c_attn.bias"] = ds(p + "attn.qkv.bias")
            out[h + "attn.c_proj.weight"] = ds(p + "attn.proj.weight").T
            out[h + "attn.c_proj.bias"] = ds(p + "attn.proj.bias")
            out[h + "ln_2.weight"] = ds(p + "ln2.weight")
            out[h + "ln_2.bias"] = ds(p + "ln2.bias")
            out[h + "mlp.c_fc.weight"] = ds(p + "mlp.fc1.weight").T
            out[h + "mlp.c_fc.bias"] = ds(p + "mlp.fc1.bias")
            out[h + "mlp.c_proj.weight"] = ds(p + "mlp.fc2.weight").T
            out[h + "mlp.c_proj.bias"] = ds(p + "mlp.fc2.bias")
        out["transformer.ln_f.weight"] = ds("final_ln.weight")
        out["transformer.ln_f.bias"] = ds("final_ln.bias")
    else:
        out["model.embed_tokens.weight"] = ds("embedding.token.weight")
        for l in range(L):
            p, h = f"layers.{l}.", f"model.layers.{l}."
            qkv = ds(p + "attn.qkv.weight")
            out[h + "self_attn.q_proj.weight"] = qkv[:H]
            out[h + "self_attn.k_proj.weight"] = qkv[H:H + K]
            out[h + "self_attn.v_proj.weight"] = qkv[H + K:]
            out[h + "self_attn.o_proj.weight"] = ds(p + "attn.proj.weight")
            if E > 0:   # Mixtral: w1 gate, w3 up, w2 down of each expert; the router is the gate
                moe = h + "block_sparse_moe."
                out[moe + "gate.weight"] = ds(p + "mlp.router.weight")
                gate_up, down = ds(p + "mlp.experts.gate_up.weight"), ds(p + "mlp.experts.down.weight")
                for e in range(E):
                    out[moe + f"experts.{e}.w1.weight"] = gate_up[2 * e * F:(2 * e + 1) * F]
                    out[moe + f"experts.{e}.w3.weight"] = gate_up[(2 * e + 1) * F:(2 * e + 2) * F]
                    out[moe + f"experts.{e}.w2.weight"] = down[e * C:(e + 1) * C]
            else:
                gate_up = ds(p + "mlp.gate_up.weight")
                out[h + "mlp.gate_proj.weight"] = gate_up[:F]
                out[h + "mlp.up_proj.weight"] = gate_up[F:]
                out[h + "mlp.down_proj.weight"] = ds(p + "mlp.down.weight")
            out[h + "input_layernorm.weight"] = ds(p + "attn_norm.weight")
            out[h + "post_attention_layernorm.weight"] = ds(p + "mlp_norm.weight")
        out["model.norm.weight"] = ds("final_norm.weight")
    if not tied:
        out["lm_head.weight"] = ds("lm_head.weight")
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def to_bf16_bits(a):
    u = a.astype("<f4").view("<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")   # round to nearest even


def read_file(path, dtype):
    """{name: (dtype, shape, raw or float32 array)} after checking the file's layout."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    check(n % 8 == 0, f"{path}: header length {n} is not a multiple of 8")
    text = raw[8:8 + n].decode()
    check(text == text.rstrip(" ") + " " * (len(text) - len(text.rstrip(" "))),
          f"{path}: header padding is not spaces")
    header = json.loads(text)
    check(header.get("__metadata__") == {"format": "pt"}, f"{path}: __metadata__ {header.get('__metadata__')}")
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: k.encode())
    offset = 0
    for k in names:
        e = header[k]
        check(list(e.keys()) == ["dtype", "shape", "data_offsets"], f"{path}: {k}: keys {list(e.keys())}")
        check(e["data_offsets"][0] == offset, f"{path}: {k} starts at {e['data_offsets'][0]}, expected {offset} (name order, back to back)")
        offset = e["data_offsets"][1]
    check(8 + n + offset == len(raw), f"{path}: {len(raw)} bytes, header and data make {8 + n + offset}")
    out = {}
    if dtype == "f32":
        loaded = load_file(path)
        for k in names:
            out[k] = loaded[k]
    else:
        for k in names:
            e = header[k]
            b, end = e["data_offsets"]
            out[k] = np.frombuffer(raw[8 + n + b:8 + n + end], dtype="<u2").reshape(e["shape"])
    for k in names:
        check(header[k]["dtype"] == ("F32" if dtype == "f32" else "BF16"), f"{path}: {k} has dtype {header[k]['dtype']}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("out_dir")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--sharded", action="store_true",
                    help="expect model-0000i-of-0000N.safetensors files and an index")
    args = ap.parse_args()

    with h5py.File(args.checkpoint, "r") as f:
        cfg = tomllib.loads(text(f.attrs["config"]))
        want = expected_tensors(f, cfg)
    arch, L, C, NH, KVH, F, V, T, tied = model_shape(cfg)

    hf = json.load(open(os.path.join(args.out_dir, "config.json")))
    torch_dtype = "float32" if args.dtype == "f32" else "bfloat16"
    common = {"vocab_size": V, "tie_word_embeddings": tied, "torch_dtype": torch_dtype}
    if arch == "gpt2":
        fields = dict(common, architectures=["GPT2LMHeadModel"], model_type="gpt2", n_embd=C,
                      n_layer=L, n_head=NH, n_positions=T, n_inner=F,
                      activation_function="gelu_new", layer_norm_epsilon=1e-5)
    else:
        m = cfg["model"]
        fields = dict(common, architectures=["LlamaForCausalLM"], model_type="llama",
                      hidden_size=C, intermediate_size=F, num_hidden_layers=L,
                      num_attention_heads=NH, num_key_value_heads=KVH, head_dim=C // NH,
                      max_position_embeddings=T, rms_norm_eps=float(m.get("norm_eps", 1e-5)),
                      rope_theta=float(m.get("rope_theta", 10000.0)), hidden_act="silu",
                      attention_bias=False, mlp_bias=False)
        if int(m.get("moe_experts", 0)) > 0:
            for key in ("attention_bias", "mlp_bias"):
                del fields[key]
            fields.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                          num_local_experts=int(m["moe_experts"]),
                          num_experts_per_tok=int(m.get("moe_top_k", 2)), sliding_window=None,
                          router_jitter_noise=0.0)
            check("router_aux_loss_coef" not in hf,
                  "config.json: router_aux_loss_coef written (Trident's loss is another one)")
    for key, value in fields.items():
        check(hf.get(key) == value, f"config.json: {key} = {hf.get(key)!r}, expected {value!r}")

    # Which file holds which tensor.
    index_path = os.path.join(args.out_dir, "model.safetensors.index.json")
    if not args.sharded:
        check(not os.path.exists(index_path), "an index file although not sharded")
        files = {"model.safetensors": None}
    else:
        index = json.load(open(index_path))
        check(set(index.keys()) == {"metadata", "weight_map"}, f"index keys {sorted(index)}")
        files = {}
        for name, file in index["weight_map"].items():
            files.setdefault(file, set()).add(name)
        N = len(files)
        check(N > 1, f"an index with {N} file(s)")
        check(sorted(files) == ["model-%05d-of-%05d.safetensors" % (i + 1, N) for i in range(N)],
              f"shard files {sorted(files)}")
        check(not os.path.exists(os.path.join(args.out_dir, "model.safetensors")),
              "model.safetensors beside the shards")
        size = 4 if args.dtype == "f32" else 2
        total = sum(a.size * size for a in want.values())
        check(index["metadata"].get("total_size") == total,
              f"metadata.total_size {index['metadata'].get('total_size')}, expected {total}")
        params = sum(a.size for a in want.values())
        check(index["metadata"].get("total_parameters") == params,
              f"metadata.total_parameters {index['metadata'].get('total_parameters')}, expected {params}")
        check(set(index["weight_map"]) == set(want), "weight_map names differ from the model's")
    got = {}
    for file, names in files.items():
        content = read_file(os.path.join(args.out_dir, file), args.dtype)
        if names is not None:
            check(set(content) == names, f"{file}: holds {sorted(content)}, the index says {sorted(names)}")
        got.update(content)

    check(set(got) == set(want), f"names: missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}")
    for name in sorted(set(got) & set(want)):
        a, b = got[name], want[name]
        if not check(tuple(a.shape) == tuple(b.shape), f"{name}: shape {a.shape}, expected {b.shape}"):
            continue
        if args.dtype == "f32":
            same = np.array_equal(a.view("<u4"), b.view("<u4"))
        else:
            same = np.array_equal(a, to_bf16_bits(b))
        check(same, f"{name}: values differ from the checkpoint's")

    for p in problems:
        print("FAIL:", p)
    if not problems:
        print(f"OK: {len(got)} tensors in {len(files)} file(s) match {args.checkpoint} ({args.dtype})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
