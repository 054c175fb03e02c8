#!/usr/bin/python3
"""Draw a Trident timeline trace (log.trace) and print the measured pipeline bubble per stage.

Usage:
  /usr/bin/python3 data_tools/plot_timeline.py RUN_DIR_OR_TRACE_JSON [--out FILE.png]
      [--step N] [--title TEXT]

Reads RUN_DIR/trace.json (Chrome trace-event JSON, docs/pipeline.md "Timeline trace") and
writes a PNG (default: timeline.png next to the trace): one row per rank, named as its track
((tp, pp, dp) coordinates), the slices coloured by kind (F, B, BI, W, pipeline transfers,
communicator calls, optimizer, checkpoint) with the micro-batch number written in each compute
slice (and, under the interleaved schedule, its chunk: "3:1"); communicator calls are drawn as a thin strip under the ops that made them.

Prints, per traced step and pipeline stage, the measured bubble: the idle fraction of the
step's pipeline span, 1 - (the stage's compute time: F, B, BI, W) / span, the span running
from the first compute op of the step on any rank to the last (the simulator's definition,
pipeline/simulator.hpp); a stage of several ranks (tensor or data parallel) is their mean. Then
the mean over the traced steps, and the pipeline's bubble, 1 - sum(compute) / (stages * span).

--step N draws only step N (default: every traced step). Needs matplotlib (Debian:
python3-matplotlib; the Agg backend, no display). Errors (no trace, invalid JSON, no
pipeline slices) are one line on stderr and exit status 1.
"""

import argparse
import json
import os
import re
import sys

COMPUTE = ("F", "B", "BI", "W")
COLOURS = {
    "F": "#4c72b0", "B": "#dd8452", "BI": "#c44e52", "W": "#55a868",
    "p2p": "#b0b0b0", "comm": "#8172b3", "optimizer": "#937860", "checkpoint": "#222222",
}
LEGEND = [("F", "forward"), ("B", "backward"), ("BI", "input gradient"),
          ("W", "weight gradient"), ("p2p", "pipeline send/recv"), ("comm", "collective"),
          ("optimizer", "optimizer"), ("checkpoint", "checkpoint")]


def die(message):
    print("plot_timeline.py: " + message, file=sys.stderr)
    sys.exit(1)


def read_trace(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        die(f"{path} is not valid JSON: {e}")
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        die(f"{path} has no traceEvents list")
    return events


def parse(events):
    """Track names {pid: name} and slices [(pid, kind, name, micro, step, start, end)], where
    kind is a key of COLOURS."""
    names, slices = {}, []
    for e in events:
        if not isinstance(e, dict):
            continue
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e.get("args", {}).get("name", str(e["pid"]))
        if e.get("ph") != "X":
            continue
        args = e.get("args", {})
        cat = e.get("cat", "")
        if cat == "pipeline":
            kind = args.get("kind", "")
            kind = kind if kind in COMPUTE else "p2p"
        elif cat in COLOURS:
            kind = cat
        else:
            continue
        start = float(e["ts"]) / 1e3  # milliseconds
        slices.append((e["pid"], kind, e.get("name", ""), args.get("micro"), args.get("step"),
                       start, start + float(e.get("dur", 0)) / 1e3))
    return names, slices


def stage_of(name, pid):
    m = re.search(r"\bpp (\d+)", name)
    return int(m.group(1)) if m else pid


def bubbles(names, slices):
    """{step: ({stage: bubble}, pipeline bubble)} from the compute slices."""
    out = {}
    steps = sorted({s[4] for s in slices if s[1] in COMPUTE and s[4] is not None})
    for step in steps:
        ops = [s for s in slices if s[1] in COMPUTE and s[4] == step]
        first = min(s[5] for s in ops)
        span = max(s[6] for s in ops) - first
        if span <= 0:
            continue
        busy = {}  # pid -> compute milliseconds
        for s in ops:
            busy[s[0]] = busy.get(s[0], 0.0) + s[6] - s[5]
        per_stage = {}
        for pid in names:
            per_stage.setdefault(stage_of(names[pid], pid), []).append(busy.get(pid, 0.0))
        stage_bubble = {st: 1 - sum(b) / len(b) / span for st, b in per_stage.items()}
        pipeline = 1 - sum(sum(b) / len(b) for b in per_stage.values()) / (len(per_stage) * span)
        out[step] = (stage_bubble, pipeline)
    return out


def draw(names, slices, out, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    pids = sorted(names)
    row = {pid: i for i, pid in enumerate(pids)}
    origin = min(s[5] for s in slices)
    end = max(s[6] for s in slices)
    fig, ax = plt.subplots(figsize=(14, 1.4 + 0.7 * len(pids)))
    for pid, kind, name, micro, step, start, stop in slices:
        y = row[pid]
        x, w = start - origin, stop - start
        if kind == "comm":  # a thin strip under the op that made the call
            ax.broken_barh([(x, w)], (y + 0.28, 0.14), facecolors=COLOURS[kind])
            continue
        ax.broken_barh([(x, w)], (y - 0.35, 0.6), facecolors=COLOURS[kind],
                       edgecolor="white", linewidth=0.3)
        if kind in COMPUTE and micro is not None and w > (end - origin) / 400:
            # Interleaved: the op's chunk after the micro-batch ("F3:1" -> "3:1").
            label = str(micro) + (":" + name.split(":", 1)[1] if ":" in name else "")
            ax.text(x + w / 2, y - 0.05, label, ha="center", va="center", fontsize=6,
                    color="white")
    ax.set_yticks(range(len(pids)))
    ax.set_yticklabels([names[p] for p in pids], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds from the first traced slice")
    ax.set_xlim(0, end - origin)
    kinds = {s[1] for s in slices}
    ax.legend(handles=[Patch(color=COLOURS[k], label=label) for k, label in LEGEND if k in kinds],
              loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=8, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="run directory (log.dir) or trace.json")
    ap.add_argument("--out", help="PNG to write (default: timeline.png next to the trace)")
    ap.add_argument("--step", type=int, help="draw only this step")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    path = os.path.join(args.run, "trace.json") if os.path.isdir(args.run) else args.run
    names, slices = parse(read_trace(path))
    if args.step is not None:
        slices = [s for s in slices if s[4] == args.step]
    if not any(s[1] in COMPUTE for s in slices):
        die(f"{path}: no pipeline compute slices" +
            (f" in step {args.step}" if args.step is not None else ""))
    for pid, *_ in slices:
        names.setdefault(pid, f"rank {pid}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        die("matplotlib is not installed (Debian: python3-matplotlib)")

    table = bubbles(names, slices)
    stages = sorted({st for per_stage, _ in table.values() for st in per_stage})
    print("measured bubble (idle fraction of the step's pipeline span):")
    print("step  " + "  ".join(f"stage {st:<3d}" for st in stages) + "  pipeline")
    for step, (per_stage, pipeline) in table.items():
        print(f"{step:<5d} " + "  ".join(f"{per_stage[st]:9.3f}" for st in stages) +
              f"  {pipeline:8.3f}")
    if len(table) > 1:
        n = len(table)
        print("mean  " + "  ".join(f"{sum(t[0][st] for t in table.values()) / n:9.3f}"
                                   for st in stages) +
              f"  {sum(t[1] for t in table.values()) / n:8.3f}")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(path)), "timeline.png")
    draw(names, slices, out, args.title)
    print(f"timeline: {out}")


if __name__ == "__main__":
    main()
