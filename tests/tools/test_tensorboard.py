"""log.tensorboard = true: a tiny run's event files read back with TensorBoard's own reader
(the `tensorboard` PyPI package in the venv; its record reader checks the masked CRC32Cs)
hold every number of metrics.jsonl, at its step, as a float32 scalar, and the resolved
config as a text summary. Exits 77 (skipped) when the reader is not installed.

    test_tensorboard.py --trident BUILD/app/trident [--python VENV/bin/python]

With --python the script reruns itself on that interpreter (skipped when it does not exist).
"""
import argparse
import glob
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_runs  # noqa: E402

SKIPPED = 77


def load_events(run_dir):
    from tensorboard.backend.event_processing import event_file_loader

    files = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    if len(files) != 1:
        sys.exit("FAILED: expected one event file in %s, found %s" % (run_dir, files))
    # LegacyEventFileLoader yields the Event protos as written (simple_value not migrated).
    return list(event_file_loader.LegacyEventFileLoader(files[0]).Load())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trident", required=True)
    ap.add_argument("--python")
    args = ap.parse_args()
    if args.python:
        if not os.access(args.python, os.X_OK):
            print("SKIPPED: no interpreter %s (scripts/install_deps.sh makes the venv)"
                  % args.python)
            return SKIPPED
        os.execv(args.python, [args.python, os.path.abspath(__file__), "--trident", args.trident])
    try:
        import tensorboard  # noqa: F401
        from tensorboard.backend.event_processing import event_file_loader  # noqa: F401
    except ImportError as e:
        print("SKIPPED: the tensorboard package is not installed in this interpreter "
              "(%s): %s" % (sys.executable, e))
        return SKIPPED

    with tempfile.TemporaryDirectory(prefix="trident_tb_") as tmp:
        tiny_runs.make_corpus(tmp)
        run_dir = os.path.join(tmp, "run")
        config = os.path.join(tmp, "config.toml")
        with open(config, "w") as f:
            f.write(tiny_runs.tiny_config(tmp, run_dir, "tensorboard = true\n"))
        tiny_runs.train(args.trident, config)

        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        events = load_events(run_dir)

        if events[0].file_version != "brain.Event:2":
            sys.exit("FAILED: first event is no file_version record: %s" % events[0])
        scalars = {}  # (tag, step) -> value
        texts = {}
        for e in events[1:]:
            for v in e.summary.value:
                if v.HasField("simple_value"):
                    if (v.tag, e.step) in scalars:
                        sys.exit("FAILED: scalar %s written twice at step %d" % (v.tag, e.step))
                    scalars[(v.tag, e.step)] = v.simple_value
                elif v.metadata.plugin_data.plugin_name == "text":
                    texts[v.tag] = v.tensor.string_val[0].decode()

        expected = {}
        for row in rows:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)):
                    expected[(key, row["step"])] = value
        for tag in ("loss", "val_loss", "lr", "grad_norm", "tokens_per_s"):
            if not any(k[0] == tag for k in expected):
                sys.exit("FAILED: metrics.jsonl has no %s to compare" % tag)
        if set(scalars) != set(expected):
            sys.exit("FAILED: scalars differ from metrics.jsonl: only in events %s, only in "
                     "jsonl %s" % (sorted(set(scalars) - set(expected)),
                                   sorted(set(expected) - set(scalars))))
        for key, value in sorted(expected.items()):
            if np.float32(value) != np.float32(scalars[key]):
                sys.exit("FAILED: %s at step %d: events %r, metrics.jsonl %r"
                         % (key[0], key[1], scalars[key], value))

        if "config" not in texts or "lr = 0.01  # from " + config not in texts["config"]:
            sys.exit("FAILED: no config text summary with provenance: %r" % texts.get("config"))
        print("ok: %d scalars (%d steps, tags %s) equal metrics.jsonl; config text %d chars"
              % (len(scalars), len(rows), sorted({k[0] for k in scalars}),
                 len(texts["config"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
