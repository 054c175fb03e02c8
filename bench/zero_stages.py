#!/usr/bin/python3
"""ZeRO stages side by side on this machine: tokens/s and peak memory per rank of
optim.zero_stage = 0, 1, 2 and 3 on DP 2 (a benchmark, not a test; issue 50).

  bench/zero_stages.py [--stages 0,1,2,3] [--rounds 3] [--steps 8] [--layers 4] [--width 512]
                       [--heads 8] [--vocab 4096] [--seq-len 256] [--micro-batch 2]
                       [--micro-batches 2] [--threads 1] [--timeout 180] [--quiet 0.1]
                       [--trace]
                       [--out PNG] [--trident PATH]

Every stage trains the same GPT-2 (configs/tiny.toml with --layers/--width/--heads/--vocab/
--seq-len, random tokens) on 2 ranks, parallel.data = 2, --micro-batches micro-batches of
--micro-batch sequences per rank and step, --threads threads per rank (1: the 2 ranks fill the
2 cores). Every stage runs once per round (--rounds, default 3, every other round in reverse
order) and its fastest quiet round counts (others used at most --quiet cores during it, below):
the VM's speed moves by up to 1.7x within seconds here (other jobs on the cores). Per run:
- tokens/s: the median of metrics.jsonl's tokens_per_s after the first 2 steps (warm-up);
  the ratios are against stage 1 (targets: stage 2 >= 0.9x, stage 3 >= 0.85x) and stage 0;
- peak resident memory per rank: each rank runs under bench/context_parallel.py's wrapper
  (this script with --rank-wrapper), which takes the kernel's peak resident set of the
  `trident` process (ru_maxrss from wait4: its final VmHWM); beside it the trainer's "memory
  rank" lines (the device allocator's peak: weights, gradients, moments, activations, scratch,
  ZeRO windows and gather slots; the fuller rank's);
- the CPU others used during the run, in cores: the machine's busy time (/proc/stat) less
  this run's processes' (their rusage), over the wall time; a round with others near 1 core
  is no measurement of the stage (every round's figure is in the table; a stage without a
  quiet round is compared with none: its ratios say "not comparable");
- the data group's collectives of rank 0 from the trainer's "communication" table, per step:
  reduce-scatter and all-gather calls, MB and seconds (the wait of a non-blocking all-gather
  counts in its seconds), and the share of the training time rank 0 spent in communication.
--trace adds log.trace = true (steps 3-4) to every run: the timeline of each stage's run is
then RUN_DIR/trace.json (data_tools/plot_timeline.py draws it).

Expects a Release build in build/ (scripts/build.sh). Run it on an otherwise idle machine:
with 2 cores, anything beside it halves a number; the load average is printed before and
after, and each round's others' cores beside it. Writes its tokens and runs under the
figure's directory (default build/bench-zero/).
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

import context_parallel as cp

ROOT = cp.ROOT
COMM_LINE = re.compile(r"^(\w+)\s+(\w+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)$", re.M)
SHARE_LINE = re.compile(r"\(([\d.]+)% of the training time\)")
TARGETS = {2: 0.9, 3: 0.85}  # tokens/s against stage 1 (issue 50)


def machine_cpu_s():
    """Seconds of CPU time the machine's cores have run anything (/proc/stat's first line:
    user, nice, system, irq, softirq; steal, the hypervisor's, apart)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields[:3]) + fields[5] + fields[6]) / tick, fields[7] / tick


def children_cpu_s():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def settings(args, stage, run_dir, tokens):
    sets = ["model.layers=%d" % args.layers, "model.width=%d" % args.width,
            "model.heads=%d" % args.heads, "model.vocab_size=%d" % args.vocab,
            "model.seq_len=%d" % args.seq_len, "parallel.data=2",
            "optim.zero_stage=%d" % stage, "train.threads=%d" % args.threads,
            "train.micro_batch=%d" % args.micro_batch,
            "train.global_batch=%d" % (2 * args.micro_batch * args.micro_batches),
            "train.steps=%d" % args.steps, "optim.warmup_steps=1", "eval.interval=0",
            "eval.sample_interval=0", "log.interval=1", "checkpoint.dir=",
            "data.train=" + tokens, "data.val=" + tokens, "log.dir=" + run_dir]
    if args.trace:
        sets += ["log.trace=true", "log.trace_steps=[3, 4]"]
    return sets


def comm_per_step(out, steps):
    """{(group, op): (calls, MB, seconds) per step} from rank 0's communication table."""
    table = out.split("communication of rank 0:")[-1]
    return {(g, op): (int(c) / steps, float(mb) / steps, float(s) / steps)
            for g, op, c, mb, s in COMM_LINE.findall(table)}


def train(args, tokens, stage, name):
    run_dir = os.path.join(args.work, "runs", name)
    subprocess.run(["rm", "-rf", run_dir], check=True)
    os.makedirs(run_dir)
    trident = [args.trident, "train", "--config", args.config] + sum(
        (["--set", s] for s in settings(args, stage, run_dir, tokens)), [])
    cmd = ["timeout", str(args.timeout), "mpiexec", "-n", "2", sys.executable,
           os.path.abspath(__file__), "--rank-wrapper", run_dir, "--"] + trident
    start, (busy0, steal0), mine0 = time.time(), machine_cpu_s(), children_cpu_s()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall, (busy1, steal1), mine1 = time.time() - start, machine_cpu_s(), children_cpu_s()
    out = proc.stdout
    with open(os.path.join(run_dir, "output.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n" + out)
    # Cores' worth of CPU that others used during the run (this run's processes are waited
    # for, so their CPU time is the children's): near 0 on a quiet machine.
    r = {"stage": stage, "name": name, "wall_s": wall, "exit": proc.returncode, "log": run_dir,
         "others_cores": max(0.0, (busy1 - busy0) - (mine1 - mine0)) / wall,
         "steal_cores": (steal1 - steal0) / wall}
    reports = []
    for k in range(2):
        path = os.path.join(run_dir, "rank%d.json" % k)
        if os.path.exists(path):
            with open(path) as f:
                reports.append(json.load(f))
    r["max_rss_mib"] = [x["max_rss_kib"] / 1024.0 for x in reports]
    memory = [m.groups() for m in cp.MEMORY_LINE.finditer(out)]
    r["device_peak_mib"] = [float(m[6]) * 1e6 / cp.MIB for m in memory]
    rows = []
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        rows = [json.loads(l) for l in open(metrics) if l.strip()]
        rows = [x for x in rows if "type" not in x]  # step rows only
    after = [x["tokens_per_s"] for x in rows[2:]]
    r["tokens_per_s"] = statistics.median(after) if after else None
    r["last_loss"] = rows[-1]["loss"] if rows else None
    r["comm"] = comm_per_step(out, max(1, len(rows)))
    share = SHARE_LINE.search(out)
    r["comm_share"] = float(share.group(1)) if share else None
    r["trace"] = trace_summary(run_dir) if args.trace else None
    if proc.returncode == 124:
        r["status"] = "TIMEOUT (> %d s)" % args.timeout
    elif proc.returncode != 0:
        r["status"] = "FAIL (exit %d): %s" % (proc.returncode, cp.last_error(out))
    elif r["tokens_per_s"] is None:
        r["status"] = "FAIL: no step logged after the first 2"
    elif len(r["max_rss_mib"]) != 2 or len(memory) != 2:
        r["status"] = "FAIL: %d rank reports and %d 'memory rank' lines for 2 ranks" % (
            len(r["max_rss_mib"]), len(memory))
    else:
        r["status"] = "ok"
    return r


def best_round(runs, quiet):
    """A stage's row: its fastest working round among the quiet ones (others used at most
    `quiet` cores), or among all when none was quiet (the status says so); every round's
    tokens/s and others' cores beside it."""
    ok = [r for r in runs if r["status"] == "ok"]
    calm = [r for r in ok if r["others_cores"] <= quiet]
    row = dict(max(calm or ok, key=lambda r: r["tokens_per_s"]) if ok else runs[0])
    row["rounds"] = [r["tokens_per_s"] if r["status"] == "ok" else None for r in runs]
    row["others"] = [r["others_cores"] for r in runs]
    row["quiet"] = bool(calm)
    failed = [r for r in runs if r["status"] != "ok"]
    if ok and failed:
        row["status"] = "ok in %d of %d rounds; %s" % (len(ok), len(runs), failed[0]["status"])
    if ok and not calm:
        row["status"] += " (no quiet round: others used > %.2f cores in each)" % quiet
    return row


def trace_summary(run_dir):
    """Per traced step, from RUN_DIR/trace.json: the ranks' mean ms in forward ops, backward
    ops and the optimizer; per data-group collective, by op and by what it ran in (F, B, the
    optimizer, or "-": between them), the ranks' mean ms and the both-arrived ms: for the k-th
    such call of a step, the shorter of the two ranks' durations (the part neither rank spent
    waiting for the other to arrive; for a prefetched all-gather's wait, what the compute since
    its post did not cover)."""
    path = os.path.join(run_dir, "trace.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted({e["args"]["step"] for e in events})
    ops = {}  # (rank, step) -> [(start, end, kind)] of the pipeline ops
    calls = {}  # (rank, step) -> [(op, pass, dur)] of the data group's collectives, in order
    out = {"steps": len(steps), "compute": {}, "data": {}}
    for e in sorted(events, key=lambda e: e["ts"]):
        key = (e["pid"], e["args"]["step"])
        if e["cat"] in ("pipeline", "optimizer"):
            kind = e["args"]["kind"] if e["cat"] == "pipeline" else "optimizer"
            ops.setdefault(key, []).append((e["ts"], e["ts"] + e["dur"], kind))
            out["compute"][kind] = out["compute"].get(kind, 0.0) + e["dur"] / 1000.0
        if e["cat"] == "comm" and e["args"].get("group") == "data":
            inside = [k for s, end, k in ops.get(key, []) if s <= e["ts"] < end]
            calls.setdefault(key, []).append((e["name"], inside[-1] if inside else "-",
                                              e["dur"] / 1000.0))
    ranks = sorted({rank for rank, _ in calls} | {rank for rank, _ in ops})
    norm = float(len(ranks) * len(steps))
    out["compute"] = {k: v / norm for k, v in out["compute"].items()}
    for step in steps:
        per_rank = [calls.get((rank, step), []) for rank in ranks]
        for i, call in enumerate(per_rank[0]):
            same = [c[i] for c in per_rank if i < len(c) and c[i][0] == call[0]]
            mean = sum(c[2] for c in same) / len(same)
            slot = out["data"].setdefault((call[0], call[1]), [0, 0.0, 0.0])
            slot[0] += 1.0 / len(steps)
            slot[1] += mean / len(steps)
            slot[2] += min(c[2] for c in same) / len(steps)
    return out


def print_trace(results):
    print("\ntimeline (log.trace, steps 3-4), ms per step, the ranks' mean; data-group "
          "collectives by op and what they ran in (F forward, B backward, optimizer, - none): "
          "calls, mean ms, both-arrived ms (the shorter rank's: not waiting for the other)")
    print("| stage | forward | backward | optimizer | collectives: op in pass: calls / mean ms / "
          "both-arrived ms |")
    print("|---:|---:|---:|---:|---|")
    for r in results:
        t = r.get("trace")
        if not t:
            print("| %d | - | - | - | no trace.json |" % r["stage"])
            continue
        c = t["compute"]
        print("| %d | %.0f | %.0f | %.0f | %s |" % (
            r["stage"], c.get("F", 0.0), c.get("B", 0.0), c.get("optimizer", 0.0),
            "; ".join("%s in %s: %.0f / %.1f / %.1f" % (op, where, n, mean, both)
                      for (op, where), (n, mean, both) in sorted(t["data"].items()))))


def data_ops(r, op):
    """Rank 0's data-group `op` per step as 'calls / MB / ms' ('-' when none)."""
    calls, mb, s = r["comm"].get(("data", op), (0, 0.0, 0.0))
    return "-" if calls == 0 else "%.0f / %.1f / %.0f" % (calls, mb, 1000 * s)


def print_table(args, results):
    by_stage = {r["stage"]: r for r in results}

    def ratio(r, base):
        b = by_stage.get(base)
        if r["tokens_per_s"] is None or not b or b["tokens_per_s"] is None:
            return "-"
        value = r["tokens_per_s"] / b["tokens_per_s"]
        if not (r["quiet"] and b["quiet"]):  # a busy round beside a quiet one: no comparison
            return "%.3fx (not comparable: no quiet round)" % value
        if base != 1 or r["stage"] not in TARGETS:
            return "%.3fx" % value
        return "%.3fx (target >= %.2f: %s)" % (value, TARGETS[r["stage"]],
                                               "met" if value >= TARGETS[r["stage"]] else "MISSED")

    params = 12 * args.layers * args.width ** 2 + (args.vocab + args.seq_len) * args.width
    print("\nDP 2 (2 ranks x %d thread%s), GPT-2 %d layers, width %d, %d heads, vocabulary %d, "
          "seq_len %d (~%.1f M parameters), %d micro-batch%s of %d per rank and step "
          "(%d tokens/step); tokens/s: median after step 2, the fastest of %d round(s) "
          "among those where others used <= %.2f cores; "
          "device peak: the fuller rank; collectives: rank 0's data group per step "
          "(calls / MB / ms)"
          % (args.threads, "s" if args.threads > 1 else "", args.layers, args.width, args.heads,
             args.vocab, args.seq_len, params / 1e6, args.micro_batches,
             "es" if args.micro_batches > 1 else "", args.micro_batch,
             2 * args.micro_batch * args.micro_batches * args.seq_len, args.rounds,
             args.quiet))
    print("| stage | tokens/s | vs stage 1 | vs stage 0 | every round (others' cores) | "
          "peak RSS MiB rank 0 / 1 | device peak/rank MiB (trainer, fuller) | reduce-scatter | "
          "all-gather | all-reduce | comm share (rank 0) | last loss | status |")
    print("|---:|---:|---|---:|---|---:|---:|---|---|---|---:|---:|---|")
    for r in results:
        ok = r["tokens_per_s"] is not None
        print("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["stage"], "%.0f" % r["tokens_per_s"] if ok else "-", ratio(r, 1), ratio(r, 0),
            " / ".join(("-" if x is None else "%.0f" % x) + " (%.2f)" % o
                       for x, o in zip(r["rounds"], r["others"])),
            " / ".join("%.0f" % x for x in r["max_rss_mib"]) or "-",
            cp.fmt(r["device_peak_mib"], "%.1f"),
            data_ops(r, "reduce_scatter"), data_ops(r, "all_gather"), data_ops(r, "all_reduce"),
            "-" if r["comm_share"] is None else "%.1f%%" % r["comm_share"],
            "-" if r["last_loss"] is None else "%.6f" % r["last_loss"], r["status"]))


def plot(args, results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in results if r["tokens_per_s"] is not None]
    if not rows:
        return
    fig, (speed, mem) = plt.subplots(1, 2, figsize=(9, 3.6))
    labels = ["ZeRO-%d" % r["stage"] for r in rows]
    speed.bar(labels, [r["tokens_per_s"] for r in rows], color="tab:blue")
    speed.set_ylabel("tokens/s (DP 2, whole job)")
    speed.set_title("throughput (fastest round)", fontsize=10)
    x = range(len(rows))
    mem.bar([i - 0.2 for i in x], [max(r["max_rss_mib"]) for r in rows], 0.4,
            label="peak RSS", color="tab:orange")
    mem.bar([i + 0.2 for i in x], [max(r["device_peak_mib"]) for r in rows], 0.4,
            label="device allocator peak (trainer)", color="tab:green")
    mem.set_xticks(list(x))
    mem.set_xticklabels(labels)
    mem.set_ylabel("MiB per rank (fuller rank)")
    mem.set_title("memory per rank", fontsize=10)
    mem.legend(fontsize=7)
    for ax in (speed, mem):
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("Trident ZeRO stages, DP 2 on %d cores: GPT-2 %d x %d, seq %d, %d x %d "
                 "sequences per rank and step" % (cp.CORES, args.layers, args.width,
                                                  args.seq_len, args.micro_batches,
                                                  args.micro_batch), fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stage_list(text):
    values = cp.int_list(text)
    if any(v > 3 for v in values):
        raise argparse.ArgumentTypeError("stages are 0-3, got '%s'" % text)
    return values


def main():
    if len(sys.argv) > 3 and sys.argv[1] == "--rank-wrapper" and sys.argv[3] == "--":
        cp.rank_wrapper(sys.argv[2], sys.argv[4:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trident", default=os.path.join(ROOT, "build", "app", "trident"))
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "tiny.toml"))
    p.add_argument("--stages", type=stage_list, default=[0, 1, 2, 3])
    p.add_argument("--rounds", type=int, default=3, help="runs of every stage (alternating "
                   "order); the fastest counts")
    p.add_argument("--steps", type=int, default=8, help="steps per run (the first 2 warm up)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=2, help="sequences per micro-batch")
    p.add_argument("--micro-batches", type=int, default=2, help="per rank and step")
    p.add_argument("--threads", type=int, default=max(1, cp.CORES // 2), help="per rank")
    p.add_argument("--timeout", type=int, default=180, help="seconds per run")
    p.add_argument("--quiet", type=float, default=0.1, help="a round counts as quiet when "
                   "others used at most this many cores during it; the fastest quiet round "
                   "counts")
    p.add_argument("--trace", action="store_true", help="log.trace = true, steps 3-4")
    p.add_argument("--out", default=os.path.join(ROOT, "build", "bench-zero", "zero_stages.png"))
    args = p.parse_args()
    for key in ("rounds", "layers", "width", "heads", "vocab", "seq_len", "micro_batch",
                "micro_batches", "threads", "timeout"):
        if getattr(args, key) < 1:
            sys.exit("zero_stages.py: --%s %d must be >= 1" % (key.replace("_", "-"),
                                                              getattr(args, key)))
    if args.steps < 3:
        sys.exit("zero_stages.py: --steps %d must be >= 3 (the first 2 steps are warm-up)" %
                 args.steps)
    if not os.access(args.trident, os.X_OK):
        sys.exit("zero_stages.py: no %s: run scripts/build.sh first" % args.trident)
    args.work = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(args.work, exist_ok=True)
    # Every step reads 2 x micro_batch x micro_batches windows of seq_len + 1 tokens.
    need = 2 * args.micro_batch * args.micro_batches * args.steps * (args.seq_len + 1) + 1
    tokens = os.path.join(args.work, "tokens_%d.bin" % need)
    if not os.path.exists(tokens):
        cp.write_tokens(tokens, need)
    print("load average before: %s (%d cores; near 0.5 or above: others are running)" %
          (cp.load_average(), cp.CORES), flush=True)
    runs = {s: [] for s in args.stages}
    for k in range(args.rounds):
        for stage in (args.stages if k % 2 == 0 else args.stages[::-1]):
            if runs[stage] and "TIMEOUT" in runs[stage][-1]["status"]:
                continue  # it did not fit the time once: not again
            r = train(args, tokens, stage, "zero%d_r%d" % (stage, k + 1))
            runs[stage].append(r)
            print("  round %d: ZeRO-%d: %s, %s tokens/s (%.0f s; others used %.2f cores, steal "
                  "%.2f)" % (k + 1, stage, r["status"],
                             "-" if r["tokens_per_s"] is None else "%.0f" % r["tokens_per_s"],
                             r["wall_s"], r["others_cores"], r["steal_cores"]), flush=True)
    results = [best_round(runs[s], args.quiet) for s in args.stages]
    print_table(args, results)
    if args.trace:
        print_trace(results)
    plot(args, results, args.out)
    with open(os.path.join(args.work, "results.json"), "w") as f:
        json.dump([dict(r, comm={"%s %s" % k: v for k, v in r["comm"].items()},
                        trace=r["trace"] and dict(r["trace"], data={
                            "%s in %s" % k: v for k, v in r["trace"]["data"].items()}))
                   for r in results], f, indent=1)
    print("\nfigure: %s\nload average after: %s; every run's output under %s/runs/" % (
        args.out, cp.load_average(), args.work))
    sys.exit(0 if all(r["status"].startswith("ok") for r in results) else 1)


if __name__ == "__main__":
    main()
