#!/usr/bin/env python3
"""PyTorch reference for Trident's single-rank training-step benchmark.

Trains a GPT-2 (pre-LN blocks, fused qkv Linear, causal attention, GELU tanh, learned
positions, LM head tied to the token embedding) in fp32 with AdamW on random tokens, and
reports tokens/s and achieved GFLOP/s as one JSON line on stdout. --arch llama trains a Llama
instead (RMSNorm, RoPE in the Hugging Face "rotate half" convention, grouped-query attention
with --kv-heads, SwiGLU MLP of --ffn, no biases, the head tied as Llama 3.2 1B's is): the
shapes of configs/llama_3.2_1b.toml with --shape llama1b.

--compile wraps the model in torch.compile (Inductor: fused elementwise and norm kernels,
SDPA's flash/cuDNN attention kept), the reference a user compares against, beside eager.

--device cuda runs it on the GPU (eager; bench/gpu_check.sh). --dtype bf16 is standard mixed
precision: fp32 parameters (the master weights), gradients and AdamW state, the forward and
the loss under torch.autocast(bfloat16), so matmuls and attention take bf16 inputs with fp32
accumulation, and layer norms, softmax and the cross-entropy run in fp32 (autocast's policy).
On CUDA, AdamW is the fused implementation where PyTorch has one (else foreach), TF32 is off,
and each step is timed between two torch.cuda.synchronize() calls. The defaults (--device cpu
--dtype fp32) are the CPU benchmark as before.

FLOPs per training step (the same formula as bench/train_bench.sh and the docs):
    total = 3 * tokens * (L*(24*C^2 + 4*T*C) + 2*C*V)
  forward per token and layer: 2*(3C*C + C*C + 4C*C + 4C*C) = 24*C^2 for the four linear
  layers (qkv, attention out, MLP up, MLP down), 2*2*T*C for Q.K^T and A.V counted over the
  full T x T (no causal discount); 2*C*V for the LM head; backward = 2 x forward, hence 3x.
  Embedding, layer norms, softmax, GELU, the loss and the optimizer are not counted.

Threads: OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS must be set before torch
is imported (the OpenBLAS that Debian's torch calls reads its thread count when it is
loaded; torch.set_num_threads alone does not stop it using every core). --threads sets them
here, before the import, unless they are already set in the environment to the same value;
bench/train_bench.sh also sets them in the subprocess's environment.

  /usr/bin/python3 bench/torch_gpt.py --shape small --threads 1 [--warmup 2 --steps 5]
  /usr/bin/python3 bench/torch_gpt.py --layers 12 --heads 12 --width 768 --vocab 50304 \
      --seq 1024 --batch 1 --threads 2
  python3 bench/torch_gpt.py --shape 124m --batch 16 --device cuda --dtype bf16 --warmup 3 --steps 15
  python3 bench/torch_gpt.py --shape llama1b --device cuda --dtype bf16 --compile

Llama FLOPs (the trainer's own formula, model/model_stats.cpp): per token and layer forward
2*(C*(NH + 2*KVH)*HS + NH*HS*C + 3*C*F) for the linear layers, 4*T*NH*HS for attention, and
2*C*V for the head; x3 for training.
"""

import argparse
import contextlib
import json
import math
import os
import re
import statistics
import sys
import time

SHAPES = {
    # name: (layers, heads, width, vocab, seq, micro-batch[, arch, kv heads, ffn])
    "124m": (12, 12, 768, 50304, 1024, 1),
    "small": (4, 4, 256, 50304, 256, 4),
    # Llama 3.2 1B's shapes with GPT-2's padded vocabulary (the GPU check's random tokens).
    "llama1b": (16, 32, 2048, 50304, 2048, 4, "llama", 8, 8192),
}


def flops_per_step(a):
    """Training FLOPs of one step of a's shape (the trainer's formula, see the docstring)."""
    tokens = a.batch * a.seq
    C, T, V, L = a.width, a.seq, a.vocab, a.layers
    if a.arch == "gpt2":
        return 3 * tokens * (L * (24 * C * C + 4 * T * C) + 2 * C * V)
    hs = C // a.heads
    linear = 2 * (C * (a.heads + 2 * a.kv_heads) * hs + a.heads * hs * C + 3 * C * a.ffn)
    return 3 * tokens * (L * (linear + 4 * T * a.heads * hs) + 2 * C * V)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), help="preset shape (default: small)")
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--width", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--batch", type=int, help="micro-batch (sequences per step)")
    p.add_argument("--arch", choices=("gpt2", "llama"))
    p.add_argument("--kv-heads", type=int, help="llama: key/value heads (default: --heads)")
    p.add_argument("--ffn", type=int, help="llama: SwiGLU hidden size (default 8/3 width, "
                                           "rounded up to 256)")
    p.add_argument("--rope-theta", type=float, default=500000.0, help="llama (default 5e5)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (default 5)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: autocast(bfloat16) over fp32 master weights (default fp32)")
    p.add_argument("--verbose", action="store_true", help="per-step times on stderr")
    p.add_argument("--profile-out", metavar="FILE",
                   help="after the timed steps, profile 2 more (torch.profiler, device "
                        "activity) and write the kernels' device time per step to FILE")
    a = p.parse_args()
    base = SHAPES[a.shape or ("small" if a.layers is None else "124m")]
    names = ("layers", "heads", "width", "vocab", "seq", "batch", "arch", "kv_heads", "ffn")
    for name, default in zip(names, base):
        if getattr(a, name) is None:
            setattr(a, name, default)
    if a.arch is None:
        a.arch = "gpt2"
    if a.kv_heads is None:
        a.kv_heads = a.heads
    if a.ffn is None:
        a.ffn = (8 * a.width // 3 + 255) // 256 * 256 if a.arch == "llama" else 4 * a.width
    if a.width % a.heads:
        p.error("width must be a multiple of heads")
    if a.heads % a.kv_heads:
        p.error("--kv-heads must divide --heads")
    if a.arch == "gpt2" and (a.kv_heads != a.heads or a.ffn != 4 * a.width):
        p.error("--kv-heads and --ffn are llama's (gpt2: multi-head, 4 * width)")
    if a.steps < 1 or a.warmup < 0 or a.threads < 1:
        p.error("need --steps >= 1, --warmup >= 0, --threads >= 1")
    return a


def pin_threads(n):
    """Set the thread-count variables before torch (and its BLAS) is loaded."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        cur = os.environ.get(var)
        if cur is not None and cur != str(n):
            print(f"torch_gpt.py: warning: {var}={cur} in the environment, overriding "
                  f"with {n}", file=sys.stderr)
        os.environ[var] = str(n)


args = parse_args()
if "torch" in sys.modules:
    sys.exit("torch_gpt.py: torch was imported before the thread count was pinned")
pin_threads(args.threads)

import torch  # noqa: E402  (must follow pin_threads)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)
try:
    torch.set_num_interop_threads(1)
except RuntimeError:
    pass
if args.device == "cuda":
    if not torch.cuda.is_available():
        sys.exit(f"torch_gpt.py: --device cuda, but torch {torch.__version__} sees no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 matmuls in fp32 (the default anyway)
    torch.backends.cudnn.allow_tf32 = False
DEVICE = torch.device(args.device)

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")  # torch >= 2.0; 1.13 has none


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, seq):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)  # fused q, k, v
        self.proj = nn.Linear(width, width)
        if not HAS_SDPA:
            mask = torch.ones(seq, seq, dtype=torch.bool).triu(1)  # True above the diagonal
            self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        h = self.heads
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, h, C // h).transpose(1, 2)  # (B, h, T, d)
        k = k.view(B, T, h, C // h).transpose(1, 2)
        v = v.view(B, T, h, C // h).transpose(1, 2)
        if HAS_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // h))
            att = att.masked_fill(self.mask[:T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, width, heads, seq):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, seq)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, layers, heads, width, vocab, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads, seq) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        # GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2L).
        for name, prm in self.named_parameters():
            if prm.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(prm, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(prm)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class RMSNorm(nn.Module):
    def __init__(self, width, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(seq, head_size, theta):
    inv = 1.0 / (theta ** (torch.arange(0, head_size, 2, dtype=torch.float64) / head_size))
    ang = torch.outer(torch.arange(seq, dtype=torch.float64), inv)  # (T, HS/2)
    ang = torch.cat((ang, ang), dim=-1)  # rotate-half pairs (i, i + HS/2)
    return ang.cos().float(), ang.sin().float()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, width, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.hs = heads, kv_heads, width // heads
        self.qkv = nn.Linear(width, (heads + 2 * kv_heads) * self.hs, bias=False)
        self.proj = nn.Linear(width, width, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(
            [self.heads * self.hs, self.kv_heads * self.hs, self.kv_heads * self.hs], dim=2)
        q = q.view(B, T, self.heads, self.hs).transpose(1, 2)
        k = k.view(B, T, self.kv_heads, self.hs).transpose(1, 2)
        v = v.view(B, T, self.kv_heads, self.hs).transpose(1, 2)
        q = (q * cos + rotate_half(q) * sin).to(v.dtype)
        k = (k * cos + rotate_half(k) * sin).to(v.dtype)
        if self.kv_heads != self.heads:  # each kv head serves heads / kv_heads query heads
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class LlamaBlock(nn.Module):
    def __init__(self, width, heads, kv_heads, ffn):
        super().__init__()
        self.norm1 = RMSNorm(width)
        self.attn = LlamaAttention(width, heads, kv_heads)
        self.norm2 = RMSNorm(width)
        self.gate_up = nn.Linear(width, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, width, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        if not HAS_SDPA:
            sys.exit("torch_gpt.py: --arch llama needs torch >= 2.0 "
                     "(scaled_dot_product_attention)")
        self.wte = nn.Embedding(a.vocab, a.width)
        self.blocks = nn.ModuleList(LlamaBlock(a.width, a.heads, a.kv_heads, a.ffn)
                                    for _ in range(a.layers))
        self.norm = RMSNorm(a.width)
        self.lm_head = nn.Linear(a.width, a.vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as Llama 3.2 1B
        cos, sin = rope_tables(a.seq, a.width // a.heads, a.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name, prm in self.named_parameters():
            if prm.dim() >= 2:
                std = (0.02 / math.sqrt(2 * a.layers)
                       if name.endswith(("proj.weight", "down.weight")) else 0.02)
                nn.init.normal_(prm, 0.0, std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_model(a):
    if a.arch == "llama":
        return Llama(a)
    return GPT(a.layers, a.heads, a.width, a.vocab, a.seq)


def make_optimizer(model, lr):
    """Returns (optimizer, implementation): "fused" (CUDA, where PyTorch has it), "foreach"
    or "default"."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1},
              {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=lr, betas=(0.9, 0.95), eps=1e-8)
    if args.device == "cuda":
        try:
            return torch.optim.AdamW(groups, fused=True, **kw), "fused"
        except (TypeError, RuntimeError):  # torch without a fused AdamW
            pass
    try:
        return torch.optim.AdamW(groups, foreach=True, **kw), "foreach"
    except TypeError:  # torch without the foreach argument
        return torch.optim.AdamW(groups, **kw), "default"


def sync():
    if args.device == "cuda":
        torch.cuda.synchronize()


def autocast():
    if args.dtype == "bf16":
        return torch.autocast(device_type=args.device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_step(model, opt, x, y):
    """One training step on the batch (x, y); returns the loss."""
    opt.zero_grad(set_to_none=True)
    with autocast():
        loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def profile_steps(path, steps, step):
    """Time of every kernel (GPU) or operator (CPU) over `steps` more steps, per step, largest
    first, into `path`."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CUDA] if args.device == "cuda" else [ProfilerActivity.CPU]
    sync()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    # Self time: a kernel's own on the GPU; an operator's own (children excluded) on the CPU.
    if args.device == "cuda":
        what = "device time"
        self_us = lambda e: getattr(e, "self_device_time_total",
                                    getattr(e, "self_cuda_time_total", 0.0))
    else:
        what, self_us = "CPU self time", lambda e: e.self_cpu_time_total
    rows = []
    for e in prof.key_averages():
        us = self_us(e)
        if us > 0:
            rows.append((us / steps, e.count // steps, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    with open(path, "w") as f:
        f.write(f"# PyTorch {torch.__version__}: {what} per step over {steps} profiled "
                f"steps: {total / 1e3:.3f} ms in {sum(r[1] for r in rows)} calls\n")
        f.write("#   ms/step   share  calls/step  name\n")
        for us, n, key in rows:
            f.write(f"{us / 1e3:11.3f}  {100 * us / max(total, 1e-9):5.1f}%  {n:10d}  {key[:160]}\n")


def main():
    torch.manual_seed(args.seed)
    model = make_model(args).to(DEVICE)
    model.train()
    opt, adamw_impl = make_optimizer(model, args.lr)
    n_params = sum(p.numel() for p in model.parameters())
    if args.compile:
        if not hasattr(torch, "compile"):
            sys.exit(f"torch_gpt.py: --compile needs torch >= 2.0 (this is {torch.__version__})")
        model = torch.compile(model)  # the first (warm-up) steps compile
    gen = torch.Generator().manual_seed(args.seed + 1)

    def batch():
        t = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    times, losses = [], []
    for step in range(args.warmup + args.steps):
        x, y = (t.to(DEVICE) for t in batch())
        sync()
        t0 = time.perf_counter()
        loss = train_step(model, opt, x, y)
        sync()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if step >= args.warmup:
            times.append(dt)
        if args.verbose:
            print(f"step {step}: {dt:.3f} s  loss {losses[-1]:.4f}"
                  f"{'  (warm-up)' if step < args.warmup else ''}", file=sys.stderr)

    if args.profile_out:
        profile_steps(args.profile_out, 2,
                      lambda: train_step(model, opt, *(t.to(DEVICE) for t in batch())))

    tokens = args.batch * args.seq
    flops = flops_per_step(args)
    med = statistics.median(times)
    best = min(times)
    out = {
        "impl": "pytorch",
        "torch": torch.__version__,
        "torch_python": sys.executable,
        # What its CPU matmuls run on: the BLAS it was built with and its vector ISA (torch >= 2).
        "torch_blas": (re.findall(r"BLAS_INFO=([^,\s]+)", torch.__config__.show()) or [None])[0],
        "torch_cpu_capability": (torch.backends.cpu.get_cpu_capability()
                                 if hasattr(torch.backends, "cpu") else None),
        "threads": args.threads,
        "torch_threads": torch.get_num_threads(),
        "device": args.device,
        "dtype": args.dtype,
        "arch": args.arch, "compiled": args.compile,
        "layers": args.layers, "heads": args.heads, "width": args.width,
        "kv_heads": args.kv_heads, "ffn": args.ffn,
        "vocab": args.vocab, "seq": args.seq, "batch": args.batch,
        "params": n_params,
        "tokens_per_step": tokens,
        "flops_per_step": flops,
        "warmup": args.warmup, "steps": args.steps,
        "step_s_median": round(med, 6),
        "step_s_min": round(best, 6),
        "tokens_per_s": round(tokens / med, 2),          # from the median step
        "tokens_per_s_best": round(tokens / best, 2),
        "gflops": round(flops / med * 1e-9, 2),
        "gflops_best": round(flops / best * 1e-9, 2),
        "sdpa": HAS_SDPA,
        "adamw_foreach": adamw_impl == "foreach",
        "adamw": adamw_impl,
        "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4),
    }
    if args.device == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
        out["cuda"] = torch.version.cuda
        out["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
