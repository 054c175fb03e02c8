"""data_tools/compare_runs.py on two tiny runs that differ in optim.lr: the figure is a PNG,
each table row is labelled by the differing key and holds its run's final loss, final
validation loss and step count from metrics.jsonl, whose straggler records (every 2 steps
here, at the last step too) are not step rows; a manifest lists the same runs; a directory
without config.toml is one error line. Exits 77 (skipped) without matplotlib.

    test_compare_runs.py --trident BUILD/app/trident
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_runs  # noqa: E402

SKIPPED = 77
TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data_tools",
                    "compare_runs.py")


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def compare(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True,
                          timeout=120)


def check_table(stdout, runs):
    lines = stdout.splitlines()
    if not lines or lines[0].split()[:2] != ["run", "steps"]:
        fail("no table header:\n" + stdout)
    for label, run_dir in runs:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        if not any(r.get("type") == "straggler" for r in rows):
            fail(run_dir + "/metrics.jsonl has no straggler record")
        rows = [r for r in rows if "type" not in r]
        val = [r["val_loss"] for r in rows if "val_loss" in r]
        expected = [label, str(rows[-1]["step"]), "%.4f" % rows[-1]["loss"], "%.4f" % val[-1]]
        found = [line for line in lines if line.startswith(label + " ")]
        if len(found) != 1 or found[0].split()[:4] != expected:
            fail("row of %s: expected to start with %s, table:\n%s" % (label, expected, stdout))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trident", required=True)
    args = ap.parse_args()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("SKIPPED: matplotlib is not installed (Debian: python3-matplotlib)")
        return SKIPPED

    with tempfile.TemporaryDirectory(prefix="trident_compare_") as tmp:
        tiny_runs.make_corpus(tmp)
        runs = []
        for lr in ("0.01", "0.003"):
            run_dir = os.path.join(tmp, "run_lr" + lr)
            config = os.path.join(tmp, "config_%s.toml" % lr)
            with open(config, "w") as f:
                f.write(tiny_runs.tiny_config(tmp, run_dir))
            tiny_runs.train(args.trident, config, ["optim.lr=" + lr, "log.straggler_interval=2"])
            runs.append(("optim.lr=" + lr, run_dir))

        out = os.path.join(tmp, "cmp.png")
        r = compare(runs[0][1], runs[1][1], "--out", out)
        if r.returncode != 0:
            fail("compare_runs.py exited %d: %s%s" % (r.returncode, r.stdout, r.stderr))
        with open(out, "rb") as f:
            if f.read(8) != b"\x89PNG\r\n\x1a\n":
                fail(out + " is not a PNG")
        check_table(r.stdout, runs)
        losses = [line.split()[2] for line in r.stdout.splitlines()[1:3]]
        if losses[0] == losses[1]:
            fail("the two runs have the same final loss; the lr override had no effect")

        manifest = os.path.join(tmp, "manifest.tsv")
        with open(manifest, "w") as f:
            f.write("# name\trun_dir\n")
            for label, run_dir in runs:
                f.write("%s\t%s\n" % (label, os.path.basename(run_dir)))  # relative
        r = compare("--manifest", manifest, "--out", out)
        if r.returncode != 0:
            fail("with --manifest: exited %d: %s" % (r.returncode, r.stderr))
        check_table(r.stdout, runs)

        empty = os.path.join(tmp, "empty_run")
        os.makedirs(empty)
        with open(os.path.join(empty, "metrics.jsonl"), "w") as f:
            f.write('{"step": 1, "loss": 1.0}\n')
        r = compare(runs[0][1], empty, "--out", out)
        error = r.stderr.strip()
        if r.returncode != 1 or "\n" in error or os.path.join(empty, "config.toml") not in error:
            fail("a run without config.toml: exit %d, stderr %r" % (r.returncode, r.stderr))
        print("ok: table and figure of two runs; manifest; error line")
    return 0


if __name__ == "__main__":
    sys.exit(main())
