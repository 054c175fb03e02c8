#!/usr/bin/env python3
"""Independent reference check of a Trident checkpoint against Hugging Face `transformers`.

Loads the weights of a Trident checkpoint (.h5) into the matching Hugging Face model
(LlamaForCausalLM for model.arch = "llama", GPT2LMHeadModel for "gpt2"), runs it in float64 on
exactly the validation windows Trident evaluates, and prints HF's mean loss beside the
val_loss Trident logged in metrics.jsonl for the checkpoint's step.

A by-hand tool, not part of the build or the tests; torch and transformers are not project
dependencies. Setup (CPU wheels from PyPI, in a venv outside the repository):

    python3 -m venv /work/hfref_venv
    /work/hfref_venv/bin/pip install torch transformers h5py numpy

Use (from the repository root, so that the data.val glob stored in the checkpoint resolves):

    build/app/trident train --config configs/llama_tiny.toml --set train.steps=30 \
        --set eval.interval=30 --set checkpoint.dir=/tmp/hfref/ckpt --set log.dir=/tmp/hfref/run
    /work/hfref_venv/bin/python data_tools/hf_reference.py /tmp/hfref/ckpt/step_00000030.h5

Options: --val GLOB (default: data.val of the stored config), --metrics FILE (default:
<log.dir>/metrics.jsonl of the stored config), --tol (exit status 1 when the relative
difference exceeds it; default 1e-5), --rope-fp64 (llama: compute HF's rotary cos/sin in
float64; stock transformers computes the angles in float32 even in a float64 model).

What the check relies on (lib/train/trainer.cpp, lib/data/dataset.cpp, docs/data.md):
  * The eval after step s runs after that step's optimizer update, and the checkpoint written
    at step s (step_<s>.h5, attribute step = s) is written after that eval: same weights.
  * Validation window ids: for eval batch b < eval.steps and sample i < global_batch,
    k = (b * global_batch + i) mod W (no shuffling; W = number of val windows). Window k of a
    shard of n tokens covers tokens [k*T, k*T + T + 1), a shard has (n - 1) // T windows,
    windows never cross shards, shards are taken in byte-wise sorted order of the glob.
  * val_loss = mean over micro-batches of the mean token cross-entropy (then averaged over
    data-parallel replicas); all micro-batches have micro_batch * T tokens, so it is the
    mean cross-entropy over all eval.steps * global_batch * T predicted tokens.
"""
import argparse
import glob
import json
import os
import sys
import tomllib

import h5py
import numpy as np
import torch

SHARD_MAGIC, SHARD_VERSION, HEADER_INTS = 20240520, 1, 256
# llm.c's two layouts: magic -> (version, token dtype).
SHARD_LAYOUTS = {SHARD_MAGIC: (SHARD_VERSION, "<u2"), 20240801: (7, "<u4")}


# ---------------------------------------------------------------------------------------------
# checkpoint

def mix64(z):
    U = np.uint64
    z = (z ^ (z >> U(30))) * U(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> U(27))) * U(0x94D049BB133111EB)
    return z ^ (z >> U(31))


def checksum(values):
    """docs/checkpoint-format.md: sum of mix64(i * golden ^ float32 bits), mod 2^64."""
    U = np.uint64
    bits = np.ascontiguousarray(values, dtype="<f4").ravel().view("<u4").astype(U)
    index = np.arange(bits.size, dtype=U)
    with np.errstate(over="ignore"):
        return int(mix64(index * U(0x9E3779B97F4A7C15) ^ bits).sum(dtype=U))


class Checkpoint:
    def __init__(self, path):
        self.path = path
        self.file = h5py.File(path, "r")
        self.step = int(self.file.attrs["step"])
        # Trident's string attributes are fixed-length (h5py: bytes); before 2026-12-07 they
        # were variable-length (str).
        text = lambda v: v.decode() if isinstance(v, bytes) else str(v)
        self.layout = text(self.file.attrs.get("layout", "?"))
        self.config = tomllib.loads(text(self.file.attrs["config"]))
        self.used = set()

    def tensor(self, name, shape):
        """The parameter `name` (model.md naming, e.g. layers.3.attn.qkv.weight) as float64."""
        parts = name.split(".")
        if parts[0] == "layers":
            parts[1] = "%03d" % int(parts[1])
        path = "/model/" + "/".join(parts)
        if path not in self.file:
            raise SystemExit(f"{self.path}: no dataset {path}")
        d = self.file[path]
        if tuple(d.shape) != tuple(shape):
            raise SystemExit(f"{self.path}: {path} has shape {d.shape}, expected {tuple(shape)}")
        values = d[...]
        if "checksum" in d.attrs and checksum(values) != int(d.attrs["checksum"]):
            raise SystemExit(f"{self.path}: {path}: checksum mismatch")
        self.used.add(path)
        return torch.from_numpy(values.astype(np.float64))

    def unused(self):
        names = []
        self.file["/model"].visititems(
            lambda n, o: names.append("/model/" + n) if isinstance(o, h5py.Dataset) else None)
        return sorted(set(names) - self.used)


# ---------------------------------------------------------------------------------------------
# model config (lib/config/config.hpp)

class Shape:
    def __init__(self, cfg):
        m = cfg["model"]
        self.arch = m.get("arch", "gpt2")
        self.L = int(m["layers"])
        self.NH = int(m["heads"])
        self.KVH = int(m.get("kv_heads", 0)) or self.NH
        self.C = int(m["width"])
        self.V = int(m["vocab_size"])
        self.T = int(m["seq_len"])
        self.HS = self.C // self.NH
        llama = self.arch == "llama"
        # ffn_size(): ffn_width, else 4C (gpt2) or 8C/3 rounded up to a multiple of 256 (llama).
        F = int(m.get("ffn_width", 0))
        if F <= 0:
            F = (8 * self.C // 3 + 255) // 256 * 256 if llama else 4 * self.C
        self.F = F
        # The loader's default: tied for gpt2, untied for llama.
        self.tied = bool(m.get("tie_embeddings", not llama))
        self.eps = float(m.get("norm_eps", 1e-5))
        self.theta = float(m.get("rope_theta", 10000.0))
        self.H = self.NH * self.HS
        self.K = self.KVH * self.HS

    def describe(self):
        return (f"arch {self.arch}: {self.L} layers, width {self.C}, {self.NH} heads of {self.HS}, "
                f"{self.KVH} kv heads, MLP {self.F}, vocabulary {self.V}, seq_len {self.T}, "
                f"{'tied' if self.tied else 'untied'} LM head")


def put(param, value):
    if tuple(param.shape) != tuple(value.shape):
        raise SystemExit(f"internal: HF parameter {tuple(param.shape)} vs {tuple(value.shape)}")
    with torch.no_grad():
        param.copy_(value)


# ---------------------------------------------------------------------------------------------
# Hugging Face models

def build_llama(ck, s, rope_fp64):
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_cfg = LlamaConfig(
        vocab_size=s.V, hidden_size=s.C, intermediate_size=s.F, num_hidden_layers=s.L,
        num_attention_heads=s.NH, num_key_value_heads=s.KVH, head_dim=s.HS, hidden_act="silu",
        max_position_embeddings=max(s.T, 2048), rms_norm_eps=s.eps, rope_theta=s.theta,
        tie_word_embeddings=s.tied, attention_bias=False, mlp_bias=False,
        attention_dropout=0.0)
    hf_cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(hf_cfg).double().eval()
    rope = model.model.rotary_emb
    # The rotary base actually in use (the rope_theta keyword moved into rope_parameters in v5).
    want = 1.0 / (s.theta ** (torch.arange(0, s.HS, 2, dtype=torch.float64) / s.HS))
    got = rope.inv_freq.double()
    if not torch.allclose(got, want, rtol=1e-6, atol=0):
        raise SystemExit(f"HF inv_freq {got.tolist()} != theta {s.theta}'s {want.tolist()}")
    if rope_fp64:
        rope.inv_freq = want.clone()

        def forward(x, position_ids):
            freqs = position_ids[..., None].double() * rope.inv_freq.double()
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        rope.forward = forward

    C, H, K, F = s.C, s.H, s.K, s.F
    put(model.model.embed_tokens.weight, ck.tensor("embedding.token.weight", [s.V, C]))
    for l, layer in enumerate(model.model.layers):
        p = f"layers.{l}."
        put(layer.input_layernorm.weight, ck.tensor(p + "attn_norm.weight", [C]))
        qkv = ck.tensor(p + "attn.qkv.weight", [H + 2 * K, C])      # rows [q | k | v]
        put(layer.self_attn.q_proj.weight, qkv[:H])
        put(layer.self_attn.k_proj.weight, qkv[H:H + K])
        put(layer.self_attn.v_proj.weight, qkv[H + K:])
        put(layer.self_attn.o_proj.weight, ck.tensor(p + "attn.proj.weight", [C, H]))
        put(layer.post_attention_layernorm.weight, ck.tensor(p + "mlp_norm.weight", [C]))
        gate_up = ck.tensor(p + "mlp.gate_up.weight", [2 * F, C])     # rows [gate | up]
        put(layer.mlp.gate_proj.weight, gate_up[:F])
        put(layer.mlp.up_proj.weight, gate_up[F:])
        put(layer.mlp.down_proj.weight, ck.tensor(p + "mlp.down.weight", [C, F]))
    put(model.model.norm.weight, ck.tensor("final_norm.weight", [C]))
    return finish_head(model, ck, s)


def build_gpt2(ck, s):
    from transformers import GPT2Config, GPT2LMHeadModel

    if s.KVH != s.NH:
        raise SystemExit("gpt2 with kv_heads != heads has no GPT2LMHeadModel equivalent")
    hf_cfg = GPT2Config(
        vocab_size=s.V, n_positions=s.T, n_embd=s.C, n_layer=s.L, n_head=s.NH, n_inner=s.F,
        activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False,
        bos_token_id=None, eos_token_id=None, tie_word_embeddings=s.tied)
    hf_cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(hf_cfg).double().eval()

    C, F = s.C, s.F
    t = model.transformer
    put(t.wte.weight, ck.tensor("embedding.token.weight", [s.V, C]))
    put(t.wpe.weight, ck.tensor("embedding.position.weight", [s.T, C]))
    # HF GPT-2's Conv1D stores [in, out]: the transpose of Trident's [out, in].
    for l, block in enumerate(t.h):
        p = f"layers.{l}."
        put(block.ln_1.weight, ck.tensor(p + "ln1.weight", [C]))
        put(block.ln_1.bias, ck.tensor(p + "ln1.bias", [C]))
        put(block.attn.c_attn.weight, ck.tensor(p + "attn.qkv.weight", [3 * C, C]).T)
        put(block.attn.c_attn.bias, ck.tensor(p + "attn.qkv.bias", [3 * C]))
        put(block.attn.c_proj.weight, ck.tensor(p + "attn.proj.weight", [C, C]).T)
        put(block.attn.c_proj.bias, ck.tensor(p + "attn.proj.bias", [C]))
        put(block.ln_2.weight, ck.tensor(p + "ln2.weight", [C]))
        put(block.ln_2.bias, ck.tensor(p + "ln2.bias", [C]))
        put(block.mlp.c_fc.weight, ck.tensor(p + "mlp.fc1.weight", [F, C]).T)
        put(block.mlp.c_fc.bias, ck.tensor(p + "mlp.fc1.bias", [F]))
        put(block.mlp.c_proj.weight, ck.tensor(p + "mlp.fc2.weight", [C, F]).T)
        put(block.mlp.c_proj.bias, ck.tensor(p + "mlp.fc2.bias", [C]))
    put(t.ln_f.weight, ck.tensor("final_ln.weight", [C]))
    put(t.ln_f.bias, ck.tensor("final_ln.bias", [C]))
    return finish_head(model, ck, s)


def finish_head(model, ck, s):
    head = model.get_output_embeddings().weight
    emb = model.get_input_embeddings().weight
    if s.tied:
        if head.data_ptr() != emb.data_ptr():
            put(head, emb.detach())   # not tied by this transformers version: copy
    else:
        if head.data_ptr() == emb.data_ptr():
            raise SystemExit("HF tied the LM head although tie_word_embeddings=False")
        put(head, ck.tensor("lm_head.weight", [s.V, s.C]))
    left = ck.unused()
    if left:
        raise SystemExit(f"checkpoint datasets not used: {left}")
    return model


# ---------------------------------------------------------------------------------------------
# validation windows (lib/data/dataset.cpp)

def read_shard(path):
    raw = np.fromfile(path, dtype=np.uint8)
    header = raw[:HEADER_INTS * 4].view("<i4")
    layout = SHARD_LAYOUTS.get(int(header[0]))
    if layout is None or header[1] != layout[0]:
        raise SystemExit(f"{path}: not a token shard (magic {header[0]}, version {header[1]})")
    n = int(header[2])
    tokens = raw[HEADER_INTS * 4:].view(layout[1])
    if tokens.size != n:
        raise SystemExit(f"{path}: header says {n} tokens, file has {tokens.size}")
    return tokens


def eval_windows(pattern, s, global_batch, eval_steps):
    paths = sorted(glob.glob(pattern), key=lambda p: p.encode()) if glob.has_magic(pattern) \
        else [pattern]
    if not paths:
        raise SystemExit(f"no file matches {pattern!r}")
    shards = [read_shard(p) for p in paths]
    counts = [(t.size - 1) // s.T if t.size > 0 else 0 for t in shards]
    first = np.concatenate([[0], np.cumsum(counts)])
    W = int(first[-1])
    ids = [(b * global_batch + i) % W for b in range(eval_steps) for i in range(global_batch)]
    rows = []
    for k in ids:
        sh = int(np.searchsorted(first, k, side="right") - 1)
        start = (k - int(first[sh])) * s.T
        rows.append(shards[sh][start:start + s.T + 1].astype(np.int64))
    windows = torch.from_numpy(np.stack(rows))
    if int(windows.max()) >= s.V:
        raise SystemExit(f"a validation token is >= vocab_size {s.V}")
    return paths, W, ids, windows


# ---------------------------------------------------------------------------------------------

def trident_val_loss(metrics, step):
    found = None
    with open(metrics) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if r.get("step") == step and "val_loss" in r:
                found = r["val_loss"]  # the last record wins (a resumed run appends)
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", help="a Trident checkpoint, e.g. CKPT_DIR/step_00000030.h5")
    ap.add_argument("--val", help="validation shard path or glob (default: the stored data.val)")
    ap.add_argument("--metrics", help="metrics.jsonl (default: <stored log.dir>/metrics.jsonl)")
    ap.add_argument("--tol", type=float, default=1e-5, help="relative tolerance (default 1e-5)")
    ap.add_argument("--rope-fp64", action="store_true",
                    help="llama: HF rotary cos/sin in float64 (stock HF computes them in fp32)")
    ap.add_argument("--chunk", type=int, default=16, help="windows per forward pass")
    args = ap.parse_args()

    torch.set_default_dtype(torch.float64)
    ck = Checkpoint(args.checkpoint)
    cfg = ck.config
    s = Shape(cfg)
    global_batch = int(cfg["train"]["global_batch"])
    eval_steps = int(cfg["eval"]["steps"])
    val = args.val or cfg["data"]["val"]
    if isinstance(val, list):  # a blend (docs/data.md): its windows are not a plain glob's
        if len(val) != 1:
            raise SystemExit("the stored data.val is a blend; give one shard glob with --val")
        val = val[0]
    metrics = args.metrics or os.path.join(cfg["log"]["dir"], "metrics.jsonl")

    print(f"checkpoint: {ck.path} (step {ck.step}, layout {ck.layout})")
    print(s.describe())
    if s.arch == "llama":
        print(f"norm_eps {s.eps:g}, rope_theta {s.theta:g}"
              + (", HF rotary in float64" if args.rope_fp64 else ", HF rotary as shipped (fp32 angles)"))
        model = build_llama(ck, s, args.rope_fp64)
    elif s.arch == "gpt2":
        model = build_gpt2(ck, s)
    else:
        raise SystemExit(f"unknown model.arch {s.arch!r}")
    print(f"HF model: {type(model).__name__}, {sum(p.numel() for p in model.parameters()):,} "
          f"parameters (tied head counted once), dtype {next(model.parameters()).dtype}")

    paths, W, ids, windows = eval_windows(val, s, global_batch, eval_steps)
    print(f"val: {', '.join(paths)}: {W} windows of {s.T}+1 tokens; eval reads "
          f"{eval_steps} x {global_batch} = {len(ids)} windows: "
          + (f"{ids[0]}..{ids[-1]}" if ids == list(range(ids[0], ids[0] + len(ids))) else str(ids)))

    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, windows.shape[0], args.chunk):
            w = windows[i:i + args.chunk]
            logits = model(input_ids=w[:, :-1]).logits
            logp = torch.log_softmax(logits.double(), dim=-1)
            nll = -logp.gather(-1, w[:, 1:, None]).squeeze(-1)
            total += float(nll.sum())
            count += nll.numel()
    hf = total / count

    tri = trident_val_loss(metrics, ck.step) if os.path.exists(metrics) else None
    print(f"HF loss (float64, {count} tokens): {hf:.12f}")
    if tri is None:
        print(f"Trident val_loss: not found (no record of step {ck.step} with val_loss in "
              f"{metrics}; set eval.interval so an eval happens at the checkpoint's step)")
        return 2
    rel = abs(hf - tri) / abs(tri)
    print(f"Trident val_loss (step {ck.step}, {metrics}): {tri:.12f}")
    print(f"relative difference: {rel:.3e}  ({'OK' if rel <= args.tol else 'FAIL'}, "
          f"tolerance {args.tol:g})")
    return 0 if rel <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
