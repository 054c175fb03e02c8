#!/usr/bin/python3
"""Compare Trident runs: their train and validation loss on one figure, and a table.

Usage:
  /usr/bin/python3 data_tools/compare_runs.py RUN_DIR... [--manifest FILE] [--out FILE.png]

Each RUN_DIR is a run's log.dir: metrics.jsonl (one JSON object per logged step) and
config.toml (the resolved config `trident train` writes at start). --manifest adds the run
directories a file lists, one a line (the last tab-separated field is the RUN_DIR, as in
"RUN_DIR", "NAME<TAB>RUN_DIR" or a sweep's "TASK<TAB>NAME<TAB>OVERRIDES<TAB>RUN_DIR";
relative paths are relative to the manifest's directory; blank lines and lines starting
with '#' are skipped).

Each run is labelled by the config keys whose values differ between the runs (log.dir and
checkpoint.dir, which always differ, left out), e.g. "optim.lr=0.001, train.seed=2"; by its
directory name when nothing differs. The figure (default compare.png in the current
directory) has the train loss (solid) and the validation loss (dashed, markers) of each run
against the step. The table on stdout has, per run: the final train loss, the final
validation loss, the median tokens/s of the logged steps, and the training wall time (the
sum of ms_per_step over the logged steps; with log.interval > 1 each logged step stands for
the steps since the previous one).

Bad input (a directory without metrics.jsonl or config.toml, a config.toml that is not
TOML, an unreadable manifest) is one line on stderr naming the file, and exit code 1.
Needs matplotlib (Debian: python3-matplotlib); uses the Agg backend, no display needed.
"""

import argparse
import json
import os
import statistics
import sys
import tomllib

import plot_metrics  # data_tools/, beside this script

# Keys that differ between any two runs by construction; they say nothing about the experiment.
ALWAYS_DIFFERENT = {"log.dir", "checkpoint.dir"}


class InputError(Exception):
    pass


def read_manifest(path):
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise InputError(f"{path}: cannot read manifest: {e.strerror}")
    base = os.path.dirname(os.path.abspath(path))
    runs = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        run_dir = line.split("\t")[-1]
        runs.append(run_dir if os.path.isabs(run_dir) else os.path.join(base, run_dir))
    return runs


def read_metrics(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    try:
        rows = plot_metrics.read_metrics(path)  # the one reader of metrics.jsonl lines
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}")
    if not rows:
        raise InputError(f"{path}: no logged steps")
    return rows


def read_config(run_dir):
    """The run's config.toml flattened to {"section.key": value}."""
    path = os.path.join(run_dir, "config.toml")
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}")
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{path}: not TOML: {e}")
    flat = {}
    for section, table in doc.items():
        if isinstance(table, dict):
            for key, value in table.items():
                flat[f"{section}.{key}"] = value
        else:
            flat[section] = table
    return flat


def differing_keys(configs):
    keys = sorted(set().union(*configs))
    return [k for k in keys if k not in ALWAYS_DIFFERENT and
            len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1]


def label(config, keys, run_dir):
    if not keys:
        return os.path.basename(os.path.normpath(run_dir))
    return ", ".join(f"{k}={config.get(k, '(unset)')}" for k in keys)


def summary(rows):
    train_loss = rows[-1]["loss"]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    seconds, previous_step = 0.0, 0
    for r in rows:
        seconds += r.get("ms_per_step", 0.0) / 1e3 * (r["step"] - previous_step)
        previous_step = r["step"]
    return {
        "final_loss": train_loss,
        "final_val_loss": val[-1] if val else None,
        "tokens_per_s": statistics.median(rates) if rates else None,
        "wall_s": seconds,
        "steps": rows[-1]["step"],
    }


def table(runs):
    header = ["run", "steps", "final loss", "final val loss", "tokens/s", "wall s"]
    lines = []
    for r in runs:
        s = r["summary"]
        fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
        lines.append([r["label"], str(s["steps"]), fmt(s["final_loss"], ".4f"),
                      fmt(s["final_val_loss"], ".4f"), fmt(s["tokens_per_s"], ".0f"),
                      fmt(s["wall_s"], ".2f")])
    widths = [max(len(row[i]) for row in [header] + lines) for i in range(len(header))]
    out = []
    for row in [header] + lines:
        out.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                             for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
    return "\n".join(out)


def plot(runs, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, r in enumerate(runs):
        color = f"C{i % 10}"
        steps = [row["step"] for row in r["rows"]]
        ax.plot(steps, [row["loss"] for row in r["rows"]], color=color, label=r["label"])
        val = [(row["step"], row["val_loss"]) for row in r["rows"] if "val_loss" in row]
        if val:
            ax.plot(*zip(*val), color=color, linestyle="--", marker="o", markersize=3,
                    label=r["label"] + " (val)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("train loss (solid) and validation loss (dashed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="*", metavar="RUN_DIR")
    ap.add_argument("--manifest", help="file listing run directories, one a line")
    ap.add_argument("--out", default="compare.png", help="the figure (PNG)")
    args = ap.parse_args(argv)
    try:
        run_dirs = list(args.runs) + (read_manifest(args.manifest) if args.manifest else [])
        if not run_dirs:
            raise InputError("no run directories (give RUN_DIR... or --manifest FILE)")
        runs = [{"dir": d, "rows": read_metrics(d), "config": read_config(d)} for d in run_dirs]
    except InputError as e:
        print(f"compare_runs.py: error: {e}", file=sys.stderr)
        return 1
    keys = differing_keys([r["config"] for r in runs])
    for r in runs:
        r["label"] = label(r["config"], keys, r["dir"])
        r["summary"] = summary(r["rows"])
    print(table(runs))
    plot(runs, args.out)
    print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
