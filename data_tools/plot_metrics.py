#!/usr/bin/python3
"""Plot a Trident run's train and validation loss against the step.

Usage:
  /usr/bin/python3 data_tools/plot_metrics.py RUN_DIR [--out FILE.png]
      [--entropy X | --stats OUT/stats.json] [--title TEXT] [--log-y]

Reads RUN_DIR/metrics.jsonl (one JSON object per logged step: step, loss, lr, grad_norm,
tokens_per_s, and val_loss on eval steps) and writes a PNG (default RUN_DIR/loss.png) with
the train loss and the validation loss against the step, and, with --entropy (or --stats, a
stats.json from prepare_text.py), a horizontal line at the unigram entropy: the loss of a
model that only knows the byte frequencies. Lines that are not JSON objects (e.g. a line cut
short by a killed run) are skipped with a warning; records with a "type" (the straggler
report, docs/reliability.md) are not step metrics and are skipped silently. Needs matplotlib (Debian:
python3-matplotlib); uses the Agg backend, so no display is needed.
"""

import argparse
import json
import math
import os
import sys


def read_metrics(path):
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                print(f"warning: {path}:{lineno}: not JSON, skipped", file=sys.stderr)
                continue
            if not isinstance(row, dict) or "step" not in row:
                print(f"warning: {path}:{lineno}: no 'step', skipped", file=sys.stderr)
                continue
            if "type" in row:  # another record than a step's metrics (straggler report)
                continue
            rows.append(row)
    return rows


def series(rows, key):
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(r["step"])
            ys.append(v)
    return xs, ys


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Plot train/val loss of a run against the step.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("run_dir", help="run directory holding metrics.jsonl")
    ap.add_argument("--out", help="PNG to write (default RUN_DIR/loss.png)")
    ap.add_argument("--entropy", type=float, help="unigram entropy in nats (horizontal line)")
    ap.add_argument("--stats", help="stats.json of prepare_text.py (its unigram_entropy_nats)")
    ap.add_argument("--title", help="plot title (default: the run directory)")
    ap.add_argument("--log-y", action="store_true", help="logarithmic loss axis")
    args = ap.parse_args(argv)

    metrics = os.path.join(args.run_dir, "metrics.jsonl")
    if not os.path.isfile(metrics):
        sys.exit(f"plot_metrics.py: error: {metrics} does not exist")
    rows = read_metrics(metrics)
    # A resumed run may log a step twice: keep the last record of each step.
    by_step = {}
    for r in rows:
        by_step[r["step"]] = {**by_step.get(r["step"], {}), **r}
    rows = [by_step[s] for s in sorted(by_step)]
    train_x, train_y = series(rows, "loss")
    val_x, val_y = series(rows, "val_loss")
    if not train_x and not val_x:
        sys.exit(f"plot_metrics.py: error: {metrics} has no loss or val_loss values")

    entropy = args.entropy
    if entropy is None and args.stats:
        with open(args.stats) as f:
            entropy = json.load(f)["unigram_entropy_nats"]

    try:
        import matplotlib
    except ImportError:
        sys.exit("plot_metrics.py: error: matplotlib is missing "
                 "(Debian: apt-get install python3-matplotlib; run with /usr/bin/python3)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    if train_x:
        ax.plot(train_x, train_y, label="train loss", color="tab:blue", linewidth=1.2)
    if val_x:
        ax.plot(val_x, val_y, label="val loss", color="tab:orange", marker="o", markersize=4,
                linewidth=1.5)
    if entropy is not None:
        ax.axhline(entropy, color="gray", linestyle="--", linewidth=1,
                   label=f"unigram entropy ({entropy:.3f} nats)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats/token)")
    if args.log_y:
        ax.set_yscale("log")
    ax.set_title(args.title or os.path.basename(os.path.normpath(args.run_dir)))
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = args.out or os.path.join(args.run_dir, "loss.png")
    fig.savefig(out)
    summary = []
    if train_y:
        summary.append(f"train loss {train_y[0]:.4f} -> {train_y[-1]:.4f} "
                       f"(steps {train_x[0]}..{train_x[-1]})")
    if val_y:
        summary.append(f"val loss {val_y[0]:.4f} -> {val_y[-1]:.4f} ({len(val_y)} evals)")
    print(f"wrote {out}: " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
