#!/usr/bin/env python3
"""PyTorch's causal attention (F.scaled_dot_product_attention) timed per backend at the shapes
bench/gpu_attention times Trident's kernels, with the same fields: one JSON line per (shape,
backend) on stdout.

  python3 bench/attention_sdpa.py [--device cuda] [--dtype bf16] [--iters 20] \\
      [--backends flash,cudnn,efficient] B:T:NH:KVH:HS ...

Useful FLOPs of causal attention (FlashAttention's convention): forward 4*B*NH*T^2*HS/2,
backward 2.5x the forward. The backward is timed as out.backward(dout) alone (the forward
before it, untimed, keeps its graph); grouped-query shapes use enable_gqa where PyTorch has it
(2.5+), else K and V are repeated per query head outside the timed calls. A backend PyTorch
cannot run at a shape (say cuDNN on an older build) prints {"backend": ..., "error": ...}.
On --device cpu only the "math" backend exists (a smoke test of the script).
"""

import argparse
import json
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shapes", nargs="+", metavar="B:T:NH:KVH:HS")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--backends", default="flash,cudnn,efficient",
                   help="comma-separated: flash, cudnn, efficient, math (cuda)")
    a = p.parse_args()
    shapes = []
    for s in a.shapes:
        try:
            B, T, NH, KVH, HS = (int(x) for x in s.split(":"))
        except ValueError:
            p.error(f"'{s}' is not B:T:NH:KVH:HS")
        if min(B, T, NH, KVH, HS) < 1 or NH % KVH:
            p.error(f"'{s}': sizes must be positive and KVH divide NH")
        shapes.append((B, T, NH, KVH, HS))
    a.shapes = shapes
    a.backends = ["math"] if a.device == "cpu" else a.backends.split(",")
    return a


args = parse_args()
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

if args.device == "cuda" and not torch.cuda.is_available():
    print(json.dumps({"skipped": "no CUDA device"}))
    sys.exit(0)
DTYPE = torch.bfloat16 if args.dtype == "bf16" else torch.float32
DEV = torch.device(args.device)


def backend_context(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    which = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "math": SDPBackend.MATH, "cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None)}[name]
    if which is None:
        raise RuntimeError(f"this PyTorch ({torch.__version__}) has no {name} backend")
    return sdpa_kernel([which])


def sync():
    if args.device == "cuda":
        torch.cuda.synchronize()


def median_ms(fn, iters):
    for _ in range(3):
        fn()
    sync()
    ms = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def run(shape, backend):
    B, T, NH, KVH, HS = shape
    g = torch.Generator(device=DEV).manual_seed(1)
    q = torch.randn(B, NH, T, HS, device=DEV, dtype=DTYPE, generator=g, requires_grad=True)
    k = torch.randn(B, KVH, T, HS, device=DEV, dtype=DTYPE, generator=g, requires_grad=True)
    v = torch.randn(B, KVH, T, HS, device=DEV, dtype=DTYPE, generator=g, requires_grad=True)
    dout = torch.randn(B, NH, T, HS, device=DEV, dtype=DTYPE, generator=g)
    gqa = {}
    if KVH != NH:
        try:
            F.scaled_dot_product_attention(q[:, :, :1], k[:, :, :1], v[:, :, :1],
                                           enable_gqa=True)
            gqa = {"enable_gqa": True}
        except TypeError:  # before PyTorch 2.5: repeat the kv heads (untimed)
            k = k.detach().repeat_interleave(NH // KVH, dim=1).requires_grad_()
            v = v.detach().repeat_interleave(NH // KVH, dim=1).requires_grad_()
    row = {"impl": "pytorch-sdpa", "backend": backend, "dtype": args.dtype, "B": B, "T": T,
           "NH": NH, "KVH": KVH, "HS": HS, "torch": torch.__version__}
    try:
        with backend_context(backend):
            def forward():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
            fwd = median_ms(lambda: forward(), args.iters)
            outs = []

            def backward():
                outs[-1].backward(dout)

            # Each timed backward needs a fresh forward graph, built before the clock starts.
            ms = []
            for i in range(args.iters + 3):
                q.grad = k.grad = v.grad = None
                outs.append(forward())
                sync()
                t0 = time.perf_counter()
                backward()
                sync()
                if i >= 3:
                    ms.append((time.perf_counter() - t0) * 1e3)
                outs.clear()
            bwd = statistics.median(ms)
    except RuntimeError as e:
        row["error"] = str(e).splitlines()[0][:200]
        return row
    fwd_flops = 4.0 * B * NH * T * T * HS / 2.0
    row.update({"fwd_ms": round(fwd, 4), "bwd_ms": round(bwd, 4),
                "fwd_bwd_ms": round(fwd + bwd, 4),
                "fwd_tflops": round(fwd_flops / fwd * 1e-9, 1),
                "bwd_tflops": round(2.5 * fwd_flops / bwd * 1e-9, 1),
                "fwd_bwd_tflops": round(3.5 * fwd_flops / (fwd + bwd) * 1e-9, 1)})
    return row


def main():
    if args.device == "cuda":
        print(f"attention_sdpa.py: {torch.cuda.get_device_name()}, torch {torch.__version__}",
              file=sys.stderr)
    for shape in args.shapes:
        for backend in args.backends:
            print(json.dumps(run(shape, backend)), flush=True)


if __name__ == "__main__":
    main()
