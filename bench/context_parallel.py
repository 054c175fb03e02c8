#!/usr/bin/python3
"""Context parallelism on this machine: memory per rank and tokens/s over the sequence length
(a benchmark, not a test; issue 49).

  bench/context_parallel.py [--seq-lens 2048,8192,16384,32768] [--ranks 1,2,4] [--steps 3]
                            [--rounds 2] [--no-one-thread] [--timeout 240]
                            [--memory-budget-mib 1024] [--search-ranks 1,4]
                            [--search-start 2048] [--search-max 131072] [--search-timeout 300]
                            [--no-table] [--no-search] [--out PNG] [--trident PATH]

1. The table: a small Llama (RoPE, so no position table grows with the sequence; 2 layers,
   width 64, 2 heads, vocabulary 256: long sequences stay affordable on 2 cores) trains
   `--steps` steps of one sequence (micro_batch = global_batch = 1) of each length on each rank
   count N with parallel.context = N (the sequence cut into 2N chunks, rank i holding chunks i
   and 2N-1-i), and on one rank with one thread (the per-core baseline). Every cell runs once
   per round (--rounds, default 2, the second in reverse order) and its fastest round counts:
   the VM's speed moves by 10-40 % within minutes, and a two-thread run on a busy machine
   loses far more (OpenMP's threads wait for each other's time slices). Per run:
   - peak resident memory per rank: each rank runs under a small wrapper (this script with
     --rank-wrapper) that starts `trident` and takes the kernel's peak resident set of it
     (ru_maxrss from wait4, the final VmHWM); the address-space peak (VmPeak) is sampled
     every 50 ms beside it;
   - the trainer's own figures, from its "memory rank" lines: peak activations and the device
     allocator's peak (weights, gradients, AdamW state, activations, scratch, ring buffers);
   - tokens/s: the median of metrics.jsonl's tokens_per_s after the first step (warm-up).
   The ratios are against the one-rank runs of the same length. A run that fails, or does not
   finish within --timeout seconds, is reported as such in its row (a cell that timed out is
   not run again in later rounds). The last step's loss is printed too: it is the same on
   every rank count (the ring attention is exact).
2. The figure (--out, default build/bench-context/context_parallel.png): peak memory per rank
   and tokens/s over the sequence length, one line per context size.
3. The longest sequence under a memory budget per rank: for each of --search-ranks, the
   sequence doubles from --search-start until a run of one step fails. The budget is an
   address-space limit on every rank (`prlimit --as=BUDGET trident ...`, RLIMIT_AS): the
   trainer's start-up check reads it (lib/train/startup_checks.cpp, usable_memory_limit) and
   refuses a run its estimate does not fit, and any allocation past it fails in the process
   itself. Address space counts what a process maps, not what it touches: MPI's shared
   memory, the BLAS buffers, thread stacks and malloc arenas (about 0.7 GB of it before the first
   step here) count against it, resident or not.

Threads: ranks x threads = the cores this process may run on, where ranks <= cores (here, 2
cores: 1 rank x 2 threads, 2 ranks x 1 thread); 4 ranks x 1 thread oversubscribe 2 cores, and
MPICH's ranks busy-poll while they wait, so the 4-rank tokens/s measure time-slicing as much as
the ring. Run it on an otherwise idle machine: the load average is printed before and after.

Expects a Release build in build/ (scripts/build.sh). Writes its synthetic tokens and runs
under the figure's directory.
"""
import argparse
import json
import os
import re
import signal
import statistics
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1024.0 * 1024.0
CORES = len(os.sched_getaffinity(0))  # ranks x threads per rank = CORES, or ranks > CORES
# The model: configs/tiny.toml's with these overrides (see the docstring).
MODEL = ["model.arch=llama", "model.layers=2", "model.width=64", "model.heads=2",
         "model.vocab_size=256"]
MEMORY_LINE = re.compile(
    r"memory rank (\d+): parameters ([\d.]+) MB \| gradients ([\d.]+) MB \| optimizer state "
    r"([\d.]+) MB \| peak activations ([\d.]+) MB \| device allocated ([\d.]+) MB, peak "
    r"([\d.]+) MB")


def rank_wrapper(report_dir, cmd):
    """One rank: run cmd, write its peak memory and exit status to report_dir/rank<R>.json."""
    rank = int(os.environ.get("PMI_RANK", "0"))
    # close_fds=False: MPICH's process manager hands the rank its PMI connection as an fd.
    child = subprocess.Popen(cmd, close_fds=False)
    vm_peak = 0
    status_path = "/proc/%d/status" % child.pid
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid == child.pid:
            break
        try:
            with open(status_path) as f:
                for line in f:
                    if line.startswith("VmPeak:"):
                        vm_peak = max(vm_peak, int(line.split()[1]))
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.05)
    code = os.waitstatus_to_exitcode(status)
    with open(os.path.join(report_dir, "rank%d.json" % rank), "w") as f:
        json.dump({"rank": rank, "exit": code, "max_rss_kib": usage.ru_maxrss,
                   "vm_peak_kib": vm_peak}, f)
    sys.exit(code if code >= 0 else 128 - code)


def write_tokens(path, n, seed=7):
    # llm.c shard format: 256 x int32 header (magic, version, count), then uint16 tokens < 256.
    x, tokens = seed, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        tokens.append((x >> 33) % 256)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *([20240520, 1, n] + [0] * 253)))
        f.write(struct.pack("<%dH" % n, *tokens))


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def last_error(text):
    lines = [l for l in text.splitlines() if "error" in l.lower()]
    if not lines:
        lines = [l for l in text.splitlines() if l.strip()][-1:] or ["(no output)"]
    line = lines[-1].strip()
    return line if len(line) <= 400 else line[:400] + " ..."


def train(args, tokens, name, ranks, seq_len, steps, timeout, budget_mib=None, threads=None):
    """One `trident train` on `ranks` ranks with parallel.context = ranks; returns a dict."""
    threads = threads or max(1, CORES // ranks)
    run_dir = os.path.join(args.work, "runs", name)
    subprocess.run(["rm", "-rf", run_dir], check=True)
    os.makedirs(run_dir)
    sets = MODEL + [
        "model.seq_len=%d" % seq_len, "parallel.context=%d" % ranks,
        "train.threads=%d" % threads, "train.micro_batch=1", "train.global_batch=1",
        "train.steps=%d" % steps, "optim.warmup_steps=1", "eval.interval=0",
        "eval.sample_interval=0", "log.interval=1", "checkpoint.dir=", "data.train=" + tokens,
        "data.val=" + tokens, "log.dir=" + run_dir]
    trident = [args.trident, "train", "--config", args.config] + sum((["--set", s] for s in sets),
                                                                      [])
    if budget_mib is not None:
        trident = ["prlimit", "--as=%d" % int(budget_mib * MIB)] + trident
    cmd = ["mpiexec", "-n", str(ranks), sys.executable, os.path.abspath(__file__),
           "--rank-wrapper", run_dir, "--"] + trident
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        timed_out = True
    with open(os.path.join(run_dir, "output.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n" + out)
    r = {"name": name, "ranks": ranks, "threads": threads, "seq_len": seq_len,
         "wall_s": time.time() - start,
         "exit": proc.returncode, "budget_mib": budget_mib, "log": run_dir}
    reports = []
    for k in range(ranks):
        path = os.path.join(run_dir, "rank%d.json" % k)
        if os.path.exists(path):
            with open(path) as f:
                reports.append(json.load(f))
    r["max_rss_mib"] = [x["max_rss_kib"] / 1024.0 for x in reports]
    r["vm_peak_mib"] = [x["vm_peak_kib"] / 1024.0 for x in reports]
    memory = [m.groups() for m in MEMORY_LINE.finditer(out)]
    r["activations_mib"] = [float(m[4]) * 1e6 / MIB for m in memory]
    r["device_peak_mib"] = [float(m[6]) * 1e6 / MIB for m in memory]
    metrics = os.path.join(run_dir, "metrics.jsonl")
    rows = []
    if os.path.exists(metrics):
        rows = [json.loads(l) for l in open(metrics) if l.strip()]
        rows = [x for x in rows if "type" not in x]  # step rows only
    r["steps_logged"] = len(rows)
    after = [x["tokens_per_s"] for x in rows[1:]]
    r["tokens_per_s"] = statistics.median(after) if after else None
    r["last_loss"] = rows[-1]["loss"] if rows else None
    if timed_out:
        r["status"] = "TIMEOUT (> %d s)" % timeout
    elif proc.returncode != 0:
        r["status"] = "FAIL (exit %d): %s" % (proc.returncode, last_error(out))
    elif steps > 1 and r["tokens_per_s"] is None:
        r["status"] = "FAIL: no step logged after the first"
    elif len(r["max_rss_mib"]) != ranks or len(memory) != ranks:
        r["status"] = "FAIL: %d rank reports and %d 'memory rank' lines for %d ranks" % (
            len(r["max_rss_mib"]), len(memory), ranks)
    else:
        r["status"] = "ok"
    return r


def fmt(values, form="%.0f"):
    return "-" if not values else form % max(values)


def layouts(args):
    """(ranks, threads per rank): every rank count on all the cores, and one rank on one."""
    out = [(n, max(1, CORES // n)) for n in args.ranks]
    if 1 in args.ranks and CORES > 1 and not args.no_one_thread:
        out.insert(out.index((1, CORES)) + 1, (1, 1))
    return out


def best_of_rounds(runs):
    """A cell's row: its fastest working round (tokens/s of every round beside it)."""
    ok = [r for r in runs if r["status"] == "ok"]
    row = dict(max(ok, key=lambda r: r["tokens_per_s"]) if ok else runs[0])
    row["rounds"] = [r["tokens_per_s"] if r["status"] == "ok" else None for r in runs]
    failed = [r for r in runs if r["status"] != "ok"]
    if ok and failed:
        row["status"] = "ok in %d of %d rounds; %s" % (len(ok), len(runs), failed[0]["status"])
    return row


def table(args, tokens):
    cells = [(t, n, th) for t in args.seq_lens for n, th in layouts(args)]
    runs = {c: [] for c in cells}
    for k in range(args.rounds):
        for t, n, th in (cells if k % 2 == 0 else cells[::-1]):
            if runs[(t, n, th)] and "TIMEOUT" in runs[(t, n, th)][-1]["status"]:
                continue  # it did not fit the time once: not again
            r = train(args, tokens, "table_T%d_cp%d_t%d_r%d" % (t, n, th, k + 1), n, t,
                      args.steps, args.timeout, threads=th)
            runs[(t, n, th)].append(r)
            print("  round %d: T = %6d, CP %d x %d thread%s: %s (%.0f s)" % (
                k + 1, t, n, th, "s" if th > 1 else " ", r["status"], r["wall_s"]), flush=True)
    results = [best_of_rounds(runs[c]) for c in cells]
    base = {(r["seq_len"], r["threads"]): r for r in results
            if r["ranks"] == 1 and r["tokens_per_s"] is not None}
    print("\npeak memory per rank (MiB; the fullest rank), tokens/s of the whole job (median "
          "after step 1, the fastest of %d round(s)); ratios against one rank at the same length "
          "(memory: 1 rank x %d threads; tokens/s: 1 rank x %d threads, the same %d cores, and "
          "1 rank x 1 thread, one core)" % (args.rounds, CORES, CORES, CORES))
    print("| seq_len | CP = ranks | threads/rank | peak RSS/rank | vs CP 1 | activations/rank "
          "(trainer) | vs CP 1 | device peak/rank (trainer) | address space/rank (VmPeak) "
          "| tokens/s | vs CP 1 x all thr | vs CP 1 x 1 thr | every round | last loss | status |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
    for r in results:
        ok = r["tokens_per_s"] is not None

        def ratio(key, b):
            if not ok or b is None or not r[key] or not b[key]:
                return "-"
            return "%.2f" % (max(r[key]) / max(b[key]))

        def speed_ratio(b):
            return "%.2f" % (r["tokens_per_s"] / b["tokens_per_s"]) if ok and b else "-"

        mem_base = base.get((r["seq_len"], CORES))
        note = r["status"] + (" (oversubscribed: %d ranks on %d cores)" % (r["ranks"], CORES)
                              if ok and r["ranks"] > CORES else "")
        print("| %d | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["seq_len"], r["ranks"], r["threads"], fmt(r["max_rss_mib"]),
            ratio("max_rss_mib", mem_base), fmt(r["activations_mib"], "%.1f"),
            ratio("activations_mib", mem_base), fmt(r["device_peak_mib"], "%.1f"),
            fmt(r["vm_peak_mib"]), "%.0f" % r["tokens_per_s"] if ok else "-",
            speed_ratio(mem_base), speed_ratio(base.get((r["seq_len"], 1))),
            " / ".join("-" if x is None else "%.0f" % x for x in r["rounds"]),
            "%.6f" % r["last_loss"] if r["last_loss"] is not None else "-", note))
    return results


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (mem, speed) = plt.subplots(1, 2, figsize=(11, 4.4))
    for ranks, threads in sorted({(r["ranks"], r["threads"]) for r in results},
                                 key=lambda x: (x[0], -x[1])):
        rows = [r for r in results if (r["ranks"], r["threads"]) == (ranks, threads) and
                r["tokens_per_s"] is not None]
        if not rows:
            continue
        label = "CP %d (%d rank%s x %d thread%s%s)" % (
            ranks, ranks, "s" if ranks > 1 else "", threads, "s" if threads > 1 else "",
            ", oversubscribed" if ranks > CORES else "")
        x = [r["seq_len"] for r in rows]
        style = "o-" if (ranks, threads) != (1, 1) else "o:"
        if (ranks, threads) != (1, 1):  # its memory is the 2-thread run's
            line = mem.plot(x, [max(r["max_rss_mib"]) for r in rows], style, label=label)[0]
            mem.plot(x, [max(r["activations_mib"]) for r in rows], "s--", color=line.get_color(),
                     alpha=0.6, label="  its activations (trainer)")
        speed.plot(x, [r["tokens_per_s"] for r in rows], style, label=label,
                   color="gray" if (ranks, threads) == (1, 1) else None)
    for ax in (mem, speed):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length (tokens)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    mem.set_ylabel("peak memory per rank (MiB, fullest rank)")
    mem.set_title("memory per rank: peak RSS (solid), activations (dashed)", fontsize=10)
    speed.set_ylabel("tokens/s (whole job)")
    speed.set_title("training throughput (fastest round)", fontsize=10)
    fig.suptitle("Trident context parallelism: Llama, 2 layers, width 64, one sequence per step, "
                 "%d cores" % CORES, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def search(args, tokens):
    print("\nlongest sequence that trains one step under an address-space budget of %d MiB per "
          "rank (prlimit --as, RLIMIT_AS), doubling from %d" % (args.memory_budget_mib,
                                                                args.search_start))
    found = {}
    for ranks in args.search_ranks:
        seq_len, longest, stop = args.search_start, None, None
        while seq_len <= args.search_max:
            r = train(args, tokens, "search_cp%d_T%d" % (ranks, seq_len), ranks, seq_len, 1,
                      args.search_timeout, args.memory_budget_mib)
            print("  CP %d, T = %6d: %s (%.0f s; peak RSS/rank %s MiB, address space/rank %s MiB)"
                  % (ranks, seq_len, r["status"], r["wall_s"], fmt(r["max_rss_mib"]),
                     fmt(r["vm_peak_mib"])), flush=True)
            if r["status"] != "ok":
                stop = r
                break
            longest = seq_len
            seq_len *= 2
        found[ranks] = (longest, stop)
    print()
    for ranks, (longest, stop) in found.items():
        after = ("stopped at --search-max %d" % args.search_max if stop is None else
                 "T = %d: %s" % (stop["seq_len"], stop["status"]))
        print("  %d rank%s (CP %d): longest %s; %s" % (
            ranks, "s" if ranks > 1 else "", ranks,
            "none" if longest is None else "%d tokens" % longest, after))
    return found


def int_list(text):
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated whole numbers, got '%s'" % text)
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("expected whole numbers >= 1, got '%s'" % text)
    return values


def main():
    if len(sys.argv) > 3 and sys.argv[1] == "--rank-wrapper" and sys.argv[3] == "--":
        rank_wrapper(sys.argv[2], sys.argv[4:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trident", default=os.path.join(ROOT, "build", "app", "trident"))
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "tiny.toml"))
    p.add_argument("--seq-lens", type=int_list, default=[2048, 8192, 16384, 32768])
    p.add_argument("--ranks", type=int_list, default=[1, 2, 4])
    p.add_argument("--steps", type=int, default=3, help="steps per table run (the first is "
                   "warm-up)")
    p.add_argument("--timeout", type=int, default=240, help="seconds per table run")
    p.add_argument("--rounds", type=int, default=2, help="runs of every table cell "
                   "(alternating order); the fastest counts")
    p.add_argument("--no-one-thread", action="store_true",
                   help="leave out the 1 rank x 1 thread baseline")
    p.add_argument("--memory-budget-mib", type=float, default=1024,
                   help="address-space limit per rank for the longest-sequence search")
    p.add_argument("--search-ranks", type=int_list, default=[1, 4])
    p.add_argument("--search-start", type=int, default=2048)
    p.add_argument("--search-max", type=int, default=131072)
    p.add_argument("--search-timeout", type=int, default=300, help="seconds per search run")
    p.add_argument("--no-table", action="store_true")
    p.add_argument("--no-search", action="store_true")
    p.add_argument("--out", default=os.path.join(ROOT, "build", "bench-context",
                                                 "context_parallel.png"))
    args = p.parse_args()
    if args.rounds < 1:
        sys.exit("context_parallel.py: --rounds %d must be >= 1" % args.rounds)
    if args.steps < 2:
        sys.exit("context_parallel.py: --steps %d must be >= 2 (the first step is warm-up)" %
                 args.steps)
    for seq_len in args.seq_lens + [args.search_start]:
        for ranks in args.ranks + args.search_ranks:
            if seq_len % (2 * ranks):
                sys.exit("context_parallel.py: sequence length %d is not divisible by 2 x %d "
                         "ranks (parallel.context = ranks)" % (seq_len, ranks))
    if not os.access(args.trident, os.X_OK):
        sys.exit("context_parallel.py: no %s: run scripts/build.sh first" % args.trident)
    args.work = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(args.work, exist_ok=True)
    # Enough for the longest window (seq_len + 1 tokens) at the largest length asked for.
    need = max(args.seq_lens + [args.search_max]) + 1
    tokens = os.path.join(args.work, "tokens_%d.bin" % need)
    if not os.path.exists(tokens):
        write_tokens(tokens, need)
    print("load average before: %s (%d cores; near 0.5 or above: others are running)" %
          (load_average(), CORES), flush=True)
    results = found = None
    if not args.no_table:
        results = table(args, tokens)
        plot(results, args.out)
        print("\nfigure: %s" % args.out)
    if not args.no_search:
        found = search(args, tokens)
    with open(os.path.join(args.work, "results.json"), "w") as f:
        json.dump({"table": results, "search": found and {
            str(k): {"longest": v[0], "stop": v[1]} for k, v in found.items()},
            "memory_budget_mib": args.memory_budget_mib}, f, indent=1)
    print("load average after: %s; every run's output under %s/runs/" % (load_average(),
                                                                           args.work))
    bad = results and any(not r["status"].startswith("ok") for r in results)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
