#!/usr/bin/env python3
"""PyTorch's CPU matmul in fp32 and bf16 at given shapes, beside `bench_sgemm --bf16`.

Each shape MxNxK[:XY] (X, Y in N, T: A, B stored transposed, as bench_sgemm's --shapes) is
timed as torch.mm in fp32 and on bf16 tensors (bf16 inputs, fp32 accumulation; the result is
bf16, as torch.mm gives it), the inputs converted beforehand (bench_sgemm's "pre-rounded").
Best of --reps repetitions, each looping for --min-time seconds; --cpu-time times by the
process's CPU time over the threads (as bench_sgemm --cpu-time: on shared cores time slices
spent elsewhere do not count). Prints one line per shape: GFLOP/s fp32, bf16, the ratio.

Threads: OMP_NUM_THREADS and MKL_NUM_THREADS are set before torch is imported.

  /work/torch-venv/bin/python bench/torch_matmul.py --threads 1 --cpu-time \\
      --shapes 1024x2304x768:NT,1024x768x2304:NN,2304x768x1024:TN
"""
import argparse
import os
import time


def parse_shape(text):
    dims, _, ops = text.partition(":")
    m, n, k = (int(x) for x in dims.split("x"))
    ops = ops or "NN"
    if len(ops) != 2 or any(c not in "NT" for c in ops):
        raise SystemExit(f"torch_matmul.py: bad shape '{text}' (want MxNxK or MxNxK:XY)")
    return m, n, k, ops


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--min-time", type=float, default=0.1)
    p.add_argument("--cpu-time", action="store_true")
    args = p.parse_args()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)

    def now():
        return time.process_time() / args.threads if args.cpu_time else time.perf_counter()

    def best_seconds(fn):
        fn()
        fn()
        best = float("inf")
        for _ in range(args.reps):
            calls, t0 = 0, now()
            while True:
                fn()
                calls += 1
                elapsed = now() - t0
                if elapsed >= args.min_time:
                    break
            best = min(best, elapsed / calls)
        return best

    torch.manual_seed(1234)
    print(f"torch {torch.__version__}, {args.threads} thread(s), "
          f"{'cpu' if args.cpu_time else 'wall'} clock")
    for m, n, k, ops in (parse_shape(s) for s in args.shapes.split(",")):
        # Stored as bench_sgemm stores them: A is K x M when transposed, B is N x K.
        a = torch.rand(k, m) * 2 - 1 if ops[0] == "T" else torch.rand(m, k) * 2 - 1
        b = torch.rand(n, k) * 2 - 1 if ops[1] == "T" else torch.rand(k, n) * 2 - 1
        op_a = (lambda x: x.t()) if ops[0] == "T" else (lambda x: x)
        op_b = (lambda x: x.t()) if ops[1] == "T" else (lambda x: x)
        a32, b32 = op_a(a), op_b(b)
        a16, b16 = op_a(a.bfloat16()), op_b(b.bfloat16())
        flops = 2.0 * m * n * k
        fp32 = flops / best_seconds(lambda: torch.mm(a32, b32)) * 1e-9
        bf16 = flops / best_seconds(lambda: torch.mm(a16, b16)) * 1e-9
        print(f"  {m:6d} x {n:6d} x {k:6d} {ops}  fp32 {fp32:8.2f}  bf16 {bf16:8.2f} "
              f"({bf16 / fp32:.2f}x) GFLOP/s")


if __name__ == "__main__":
    main()
