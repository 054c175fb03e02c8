"""data_tools/plot_timeline.py on a generated trace whose bubbles are known: two stages of
1F1B (F = 1 ms, B = 2 ms) with 4 micro-batches, laid out by hand as the schedule runs them,
plus pipeline transfers, collectives and an optimizer slice. Stage 0 computes 12 ms in a span
of 15 ms, stage 1 likewise: every stage's bubble is 0.2 = (p-1)/(m+p-1), in both traced steps.
Checks the printed table, the PNG (a PNG file of a plausible size) and the one-line errors for
a missing trace, invalid JSON and a trace without pipeline slices. Exits 77 (skipped) without
matplotlib.

    test_plot_timeline.py
"""
import json
import os
import subprocess
import sys
import tempfile

SKIPPED = 77
TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data_tools",
                    "plot_timeline.py")


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def plot(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True,
                          timeout=120)


def one_f_one_b(step, t0):
    """Slices [(pid, name, kind, micro, start_ms, length_ms)] of 1F1B on 2 stages, m = 4."""
    # Stage 0: F0 F1 B0 F2 B1 F3 B2 B3; stage 1: F0 B0 F1 B1 ... each after its input.
    s0 = [("F", 0, 0, 1), ("F", 1, 1, 1), ("B", 0, 4, 2), ("F", 2, 6, 1), ("B", 1, 7, 2),
          ("F", 3, 9, 1), ("B", 2, 10, 2), ("B", 3, 13, 2)]
    s1 = [("F", 0, 1, 1), ("B", 0, 2, 2), ("F", 1, 4, 1), ("B", 1, 5, 2), ("F", 2, 7, 1),
          ("B", 2, 8, 2), ("F", 3, 10, 1), ("B", 3, 11, 2)]
    out = []
    for pid, ops in ((0, s0), (1, s1)):
        for kind, micro, start, length in ops:
            out.append((pid, f"{kind}{micro}", kind, micro, t0 + start, length))
    # A receive stage 1 waits in before F0, and a collective inside it.
    out.append((1, "RF0", "RF", 0, t0, 1))
    return out


def event(pid, name, cat, start_ms, length_ms, args):
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": pid, "ts": start_ms * 1e3,
            "dur": length_ms * 1e3, "args": args}


def write_trace(path):
    events = []
    for pid in (0, 1):
        name = f"rank {pid} (tp 0, pp {pid}, dp 0)"
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": pid,
                       "args": {"name": name}})
    for step, t0 in ((2, 0.0), (3, 20.0)):
        for pid, name, kind, micro, start, length in one_f_one_b(step, t0):
            events.append(event(pid, name, "pipeline", start, length,
                                {"kind": kind, "micro": micro, "chunk": 0, "step": step}))
        events.append(event(1, "recv", "comm", t0 + 0.1, 0.8,
                            {"group": "pipeline", "bytes": 4096, "step": step}))
        for pid in (0, 1):
            events.append(event(pid, "optimizer", "optimizer", t0 + 16, 1, {"step": step}))
    with open(path, "w") as f:
        json.dump({"traceEvents": events}, f)


def main():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("SKIPPED: matplotlib is not installed (Debian: python3-matplotlib)")
        return SKIPPED
    with tempfile.TemporaryDirectory(prefix="trident_timeline_") as tmp:
        write_trace(os.path.join(tmp, "trace.json"))
        r = plot(tmp, "--title", "1f1b")
        if r.returncode != 0:
            fail("exit %d:\n%s%s" % (r.returncode, r.stdout, r.stderr))
        rows = [line.split() for line in r.stdout.splitlines()]
        expected = {"2": ["0.200", "0.200", "0.200"], "3": ["0.200", "0.200", "0.200"],
                    "mean": ["0.200", "0.200", "0.200"]}
        compared = 0
        for key, values in expected.items():
            found = [row[1:] for row in rows if row and row[0] == key]
            if found != [values]:
                fail("row %s: expected %s, output:\n%s" % (key, values, r.stdout))
            compared += len(values)
        png = os.path.join(tmp, "timeline.png")
        with open(png, "rb") as f:
            head = f.read(8)
        if head != b"\x89PNG\r\n\x1a\n" or os.path.getsize(png) < 5000:
            fail("timeline.png is not a drawn PNG (%d bytes)" % os.path.getsize(png))
        r = plot(os.path.join(tmp, "trace.json"), "--step", "3",
                 "--out", os.path.join(tmp, "s3.png"))
        if r.returncode != 0 or "\n3 " not in r.stdout or "\n2 " in r.stdout:
            fail("--step 3:\n%s%s" % (r.stdout, r.stderr))
        if not os.path.exists(os.path.join(tmp, "s3.png")):
            fail("--out s3.png not written")

        cases = [(os.path.join(tmp, "missing"), "cannot read"),
                 ("bad.json", "not valid JSON"), ("empty.json", "no pipeline compute slices")]
        with open(os.path.join(tmp, "bad.json"), "w") as f:
            f.write('{"traceEvents": [')
        with open(os.path.join(tmp, "empty.json"), "w") as f:
            json.dump({"traceEvents": []}, f)
        for name, text in cases:
            r = plot(os.path.join(tmp, name))
            lines = r.stderr.strip().splitlines()
            if r.returncode != 1 or len(lines) != 1 or text not in lines[0]:
                fail("%s: expected one line with %r and exit 1, got %d: %s" %
                     (name, text, r.returncode, r.stderr))
        print("plot_timeline.py: %d bubble figures of 0.200 matched, PNG written, %d errors "
              "reported" % (compared, len(cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
