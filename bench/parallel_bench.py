#!/usr/bin/python3
"""Parallel benchmarks of Trident on one machine (not tests; figures measured side by side).

  bench/parallel_bench.py bubble    pipeline bubble, PP = 2 and 4, m = 1..16, 1F1B vs GPipe,
                                    measured beside (p-1)/(m+p-1), with peak activation memory
  bench/parallel_bench.py speedup [--rounds N]
                                    the same global batch on 1 rank and on 2 ranks as DP = 2,
                                    TP = 2 (blocking, and with parallel.tp_overlap; without
                                    and with sequence parallelism) and PP = 2
                                    (m = 8; even split, parallel.pipeline_balance = flops, and
                                    flops with parallel.schedule = zb-h1 and zb-h2): speedup and
                                    communication share. Every layout runs once per round
                                    (default 3, alternating order; ~35 s a round) and its
                                    fastest round counts, the baselines' too: the VM's speed
                                    moves by 10-20 % between runs a minute apart, and a
                                    baseline measured once moves a whole column with it.

Expects a Release build in build/ (scripts/build.sh). Writes its synthetic corpus and runs
under build/bench-parallel/. On a 2-core machine PP = 4 oversubscribes the cores (4 ranks on 2
cores, MPICH busy-polling): its measured bubble then includes time-slicing, which the table
says.
"""
import json
import os
import re
import statistics
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIDENT = os.path.join(ROOT, "build", "app", "trident")
WORK = os.path.join(ROOT, "build", "bench-parallel")


def write_shard(path, n, seed):
    x = seed
    tokens = []
    for i in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        tokens.append((x >> 33) % 256)
    with open(path, "wb") as f:
        header = [20240520, 1, n] + [0] * 253
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % n, *tokens))


def run(ranks, sets, name):
    run_dir = os.path.join(WORK, name)
    subprocess.run(["rm", "-rf", run_dir], check=True)
    cmd = ["timeout", "600", "mpiexec", "-n", str(ranks), TRIDENT, "train", "--config",
           os.path.join(ROOT, "configs", "tiny.toml"),
           "--set", "data.train=" + os.path.join(WORK, "train.bin"),
           "--set", "data.val=" + os.path.join(WORK, "train.bin"),
           "--set", "eval.interval=0", "--set", "log.interval=1",
           "--set", "log.dir=" + run_dir] + sum((["--set", s] for s in sets), [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("trident failed (%s):\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    rows = [r for r in rows if "type" not in r]  # step rows only
    return out.stdout, rows


def median_after_warmup(rows, key, skip=2):
    values = [r[key] for r in rows[skip:]] or [rows[-1][key]]
    return statistics.median(values)


def bubble():
    print("| PP | m | schedule | bubble measured (stage 0 / max) | "
          "theory (simulated, F = B = W: (p-1)/(m+p-1), zb-h1/h2 (p-1)/(3m+p-1)) | "
          "peak micro-batches held (stage 0) | peak activations MB (stage 0) | ms/step |")
    print("|---|---|---|---|---|---|---|---|")
    for pp in (2, 4):
        for m in (1, 2, 4, 8, 16):
            for schedule in ("1f1b", "gpipe", "zb-h1", "zb-h2"):
                sets = ["parallel.pipeline=%d" % pp, "parallel.schedule=" + schedule,
                        "train.micro_batch=1", "train.global_batch=%d" % m, "train.steps=6",
                        "train.threads=1", "optim.warmup_steps=1"]
                out, rows = run(pp, sets, "bubble_pp%d_m%d_%s" % (pp, m, schedule))
                stages = re.findall(r"pipeline stage (\d+): bubble ([\d.]+) measured, ([\d.]+) "
                                    r"theory .*?peak (\d+) micro-batches held, ([\d.]+) MB", out)
                measured = [float(s[1]) for s in stages]
                print("| %d | %d | %s | %.3f / %.3f | %.3f | %s | %s | %.1f |" % (
                    pp, m, schedule, measured[0], max(measured), float(stages[0][2]),
                    stages[0][3], stages[0][4], median_after_warmup(rows, "ms_per_step")))
            sys.stdout.flush()


def speedup(rounds):
    base = ["train.steps=8", "optim.warmup_steps=1", "train.global_batch=16",
            "train.micro_batch=2"]
    layouts = [("1 rank, 2 threads", 1, ["train.threads=2"]),
               ("1 rank, 1 thread", 1, ["train.threads=1"]),
               ("DP = 2", 2, ["parallel.data=2", "train.threads=1"]),
               ("TP = 2", 2, ["parallel.tensor=2", "train.threads=1"]),
               ("TP = 2, tp_overlap", 2,
                ["parallel.tensor=2", "parallel.tp_overlap=true", "train.threads=1"]),
               ("TP = 2, SP", 2,
                ["parallel.tensor=2", "parallel.sequence_parallel=true", "train.threads=1"]),
               ("TP = 2, SP, tp_overlap", 2,
                ["parallel.tensor=2", "parallel.sequence_parallel=true",
                 "parallel.tp_overlap=true", "train.threads=1"]),
               ("PP = 2 (m = 8)", 2, ["parallel.pipeline=2", "train.threads=1"]),
               ("PP = 2 (m = 8), balance flops", 2,
                ["parallel.pipeline=2", "parallel.pipeline_balance=\"flops\"",
                 "train.threads=1"]),
               ("PP = 2 (m = 8), balance flops, zb-h1", 2,
                ["parallel.pipeline=2", "parallel.pipeline_balance=\"flops\"",
                 "parallel.schedule=\"zb-h1\"", "train.threads=1"]),
               ("PP = 2 (m = 8), balance flops, zb-h2", 2,
                ["parallel.pipeline=2", "parallel.pipeline_balance=\"flops\"",
                 "parallel.schedule=\"zb-h2\"", "train.threads=1"])]
    runs = {name: [] for name, _, _ in layouts}  # (tokens/s, communication share) per round
    for k in range(rounds):
        for name, ranks, sets in (layouts if k % 2 == 0 else layouts[::-1]):
            out, rows = run(ranks, base + sets, re.sub(r"\W+", "_", name))
            share = float(re.search(r"\(([\d.]+)% of the training time\)", out).group(1))
            runs[name].append((median_after_warmup(rows, "tokens_per_s"), share))
    results = {name: max(r) for name, r in runs.items()}  # the fastest round, its share
    ref = results["1 rank, 2 threads"][0]
    print("fastest of %d round(s) per layout (every round's tokens/s in the last column)" % rounds)
    print("| layout | tokens/s | speedup over 1 rank (2 threads) | communication share (rank 0) "
          "| rounds |")
    print("|---|---|---|---|---|")
    for name, (tps, share) in results.items():
        print("| %s | %.0f | %.2fx | %.1f%% | %s |" % (
            name, tps, tps / ref, share, " / ".join("%.0f" % t for t, _ in runs[name])))
    one = results["1 rank, 1 thread"][0]
    print("\nAgainst one rank on one core (the per-rank share of the machine):")
    for name in ("DP = 2", "TP = 2", "TP = 2, tp_overlap", "TP = 2, SP", "TP = 2, SP, tp_overlap",
                 "PP = 2 (m = 8)",
                 "PP = 2 (m = 8), balance flops", "PP = 2 (m = 8), balance flops, zb-h1",
                 "PP = 2 (m = 8), balance flops, zb-h2"):
        print("  %s: %.2fx" % (name, results[name][0] / one))


def main():
    args = sys.argv[1:]
    rounds = 3
    if args[:1] == ["speedup"] and len(args) == 3 and args[1] == "--rounds":
        if not args[2].isdigit() or int(args[2]) < 1:
            sys.exit("parallel_bench.py: --rounds %s must be a whole number >= 1" % args[2])
        rounds, args = int(args[2]), args[:1]
    if len(args) != 1 or args[0] not in ("bubble", "speedup"):
        sys.exit(__doc__)
    if not os.access(TRIDENT, os.X_OK):
        sys.exit("no %s: run scripts/build.sh first" % TRIDENT)
    os.makedirs(WORK, exist_ok=True)
    shard = os.path.join(WORK, "train.bin")
    if not os.path.exists(shard):
        write_shard(shard, 400000, 12345)
    if args[0] == "bubble":
        bubble()
    else:
        speedup(rounds)


if __name__ == "__main__":
    main()
