#!/usr/bin/python3
"""Asynchronous against synchronous checkpoints on this machine (issue 51; a benchmark, not a
test): what a checkpoint costs training, the write bandwidth against dd, and the step time
while a save is in flight.

  bench/async_checkpoint.py [--models 124m,774m] [--ranks 1,2] [--dd-reps 3] [--dir DIR]
                            [--trident PATH] [--timeout 1800]

Each model (GPT-2 shapes, fp32 state: weights, gradients and AdamW's two moments, 16 bytes a
parameter, and with checkpoint.async a staging copy of the weights and moments, 12 more)
trains on 1 rank (2 threads) and on 2 ranks (parallel.tensor = 2, 1 thread each), once with
checkpoint.async = false and once with true, the same steps and checkpoint.interval (long
enough for a save to end within it). Per run:
- stall: the seconds training stood still for each periodic save: a synchronous save's own
  time ("written ... in S s"); an asynchronous one's wait for the previous save and for its
  staging copy (the trainer's "checkpoint_stall" record, the most over ranks). The median over
  the run's periodic saves; the ratio async / sync (target <= 0.05);
- write MB/s: the file's size over the time from the temporary file's creation to the commit
  ("written ... MB/s"), median over the periodic saves; against dd's MB/s writing as many bytes
  (1 MiB blocks, conv=fsync) to the same directory right after the run, the median of
  --dd-reps (target >= 0.8). The disk of this VM moves between ~250 and ~900 MB/s from one dd
  to the next, hence dd beside each run;
- step time: the median ms_per_step of the steps an asynchronous save was being written in
  (metrics.jsonl's checkpoint_in_flight) against the median of the other steps of the same
  run, the first two left out;
- seconds lost a save: the stalls plus, for an asynchronous run, the in-flight steps' time
  above the other steps' median, over the periodic saves: what the saves cost training in
  all.

The ~1B model of the issue is 0.77B here (GPT-2 large's shape): a 1B model's state and its
staging copy (28 bytes a parameter: 28 GB) do not fit in this machine's 24 GiB.
Expects a Release build in build/ (scripts/build.sh) and an otherwise idle machine.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {
    # name: (layers, heads, width, seq_len, checkpoint.interval, steps)
    "124m": (12, 12, 768, 256, 10, 41),
    "774m": (36, 20, 1280, 64, 10, 32),
}
WRITTEN = re.compile(r"^checkpoint (\S+) written \(step (\d+)(, asynchronous)?\): ([\d.]+) MB in "
                     r"([\d.]+) s, ([\d.]+) MB/s$", re.M)
DD_RATE = re.compile(r"([\d.]+) ([MG])B/s")


def write_tokens(path, n=400000):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack("<%dH" % n, *[(i * 7919) % 50304 for i in range(n)]))


def dd_mb_s(directory, megabytes, reps):
    """dd's MB/s writing `megabytes` MB, `reps` times, each into a new file while the ones
    before stay (as each checkpoint is written while the one before it stays), after a pause
    that lets freed memory go back to the host as it does between checkpoints; the list."""
    time.sleep(5)
    rates, files = [], []
    for i in range(reps):
        files.append(os.path.join(directory, "dd%d.bin" % i))
        out = subprocess.run(["dd", "if=/dev/zero", "of=" + files[-1], "bs=1M",
                              "count=%d" % megabytes, "conv=fsync"],
                             capture_output=True, text=True, check=True).stderr
        value, unit = DD_RATE.findall(out)[-1]
        rates.append(float(value) * (1000 if unit == "G" else 1))
    for f in files:
        os.remove(f)
    return rates


def run(args, model, ranks, async_saves, work):
    layers, heads, width, seq_len, interval, steps = MODELS[model]
    name = "%s_np%d_%s" % (model, ranks, "async" if async_saves else "sync")
    ck, log = os.path.join(work, name + "_ckpt"), os.path.join(work, name + "_log")
    for d in (ck, log):
        shutil.rmtree(d, ignore_errors=True)
    sets = {"model.layers": layers, "model.heads": heads, "model.width": width,
            "model.vocab_size": 50304, "model.vocab_multiple": 128, "model.seq_len": seq_len,
            "train.micro_batch": 1, "train.global_batch": 1, "train.steps": steps,
            "train.threads": 2 // ranks, "optim.warmup_steps": 0, "eval.interval": 0,
            "parallel.tensor": ranks, "data.train": os.path.join(work, "tokens.bin"),
            "data.val": "", "checkpoint.dir": ck, "checkpoint.interval": interval,
            "checkpoint.keep": 1, "checkpoint.async": "true" if async_saves else "false",
            "log.dir": log, "log.interval": 1}
    sets.update(dict(kv.split("=", 1) for kv in args.set))
    cmd = ["mpiexec", "-n", str(ranks), args.trident, "train", "--config",
           os.path.join(ROOT, "configs/tiny.toml")]
    for k, v in sets.items():
        cmd += ["--set", "%s=%s" % (k, v)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if r.returncode != 0:
        sys.exit("%s failed (exit %d):\n%s%s" % (name, r.returncode, r.stdout[-3000:],
                                                 r.stderr[-3000:]))
    saves = [(int(m[1]), m[2] is not None, float(m[3]), float(m[4]), float(m[5]))
             for m in WRITTEN.findall(r.stdout)]
    periodic = [s for s in saves if s[0] % interval == 0 and s[0] != steps]
    rows, stalls = [], {}
    with open(os.path.join(log, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j.get("event") == "checkpoint_stall":
                stalls[j["step"]] = j["stall_s"]
            elif "loss" in j:
                rows.append(j)
    size_mb = saves[0][2]
    dd_all = dd_mb_s(work, int(size_mb), args.dd_reps)  # the run's last checkpoint still there
    shutil.rmtree(ck, ignore_errors=True)
    steady = rows[2:]
    busy = [j["ms_per_step"] for j in steady if j.get("checkpoint_in_flight")]
    idle = [j["ms_per_step"] for j in steady if not j.get("checkpoint_in_flight")]
    stall = ([stalls[s[0]] for s in periodic] if async_saves else [s[3] for s in periodic])
    return {"name": name, "size_mb": size_mb, "stall_s": statistics.median(stall),
            "stalls": stall, "write_mb_s": statistics.median(s[4] for s in periodic),
            "write_s": [s[3] for s in periodic], "dd_mb_s": statistics.median(dd_all),
            "dd_all": dd_all, "writes_mb_s": [s[4] for s in periodic],
            "ms_in_flight": statistics.median(busy) if busy else None,
            "ms_other": statistics.median(idle) if idle else None,
            "steps_in_flight": len(busy),
            # What the saves cost training in all, per save: the stalls and the steps slowed
            # while a save was written (their time above the run's other steps' median).
            "lost_s": (sum(stall) + sum(b - statistics.median(idle) for b in busy) / 1e3
                       if idle else sum(stall)) / len(periodic)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="124m,774m")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--dd-reps", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join(ROOT, "build/bench-async-ckpt"))
    ap.add_argument("--trident", default=os.path.join(ROOT, "build/app/trident"))
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="another config key for every run (train.threads=1, ...)")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    write_tokens(os.path.join(args.dir, "tokens.bin"))
    print("| model | ranks | checkpoint MB | sync stall s | async stall s | async / sync | "
          "sync write MB/s | dd MB/s | sync / dd | async write MB/s | dd MB/s | async / dd | "
          "step ms, save in flight | step ms, other | slowdown | s lost a save, sync | async |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for ranks in (int(x) for x in args.ranks.split(",")):
            s = run(args, model, ranks, False, args.dir)
            a = run(args, model, ranks, True, args.dir)
            for x in (s, a):
                print("  %s: stalls %s s; writes %s MB/s; dd %s MB/s; %d steps in flight" % (
                    x["name"], ", ".join("%.3f" % v for v in x["stalls"]),
                    ", ".join("%.0f" % v for v in x["writes_mb_s"]),
                    ", ".join("%.0f" % v for v in x["dd_all"]), x["steps_in_flight"]),
                    file=sys.stderr)
            slow = (a["ms_in_flight"] / a["ms_other"]
                    if a["ms_in_flight"] and a["ms_other"] else float("nan"))
            print("| %s | %d | %.0f | %.3f | %.3f | %.4f | %.0f | %.0f | %.2f | %.0f | %.0f | "
                  "%.2f | %s | %s | %.2fx | %.2f | %.2f |" % (
                      model, ranks, s["size_mb"], s["stall_s"], a["stall_s"],
                      a["stall_s"] / s["stall_s"], s["write_mb_s"], s["dd_mb_s"],
                      s["write_mb_s"] / s["dd_mb_s"], a["write_mb_s"], a["dd_mb_s"],
                      a["write_mb_s"] / a["dd_mb_s"],
                      "%.0f" % a["ms_in_flight"] if a["ms_in_flight"] else "-",
                      "%.0f" % a["ms_other"] if a["ms_other"] else "-", slow, s["lost_s"],
                      a["lost_s"]), flush=True)
    print("targets: async / sync stall <= 0.05; write / dd >= 0.8")


if __name__ == "__main__":
    main()
