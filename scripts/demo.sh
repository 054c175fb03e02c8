#!/usr/bin/env bash
# The README demo, the whole mission on one machine: installs what it needs, builds, turns the
# fortunes corpus into byte-level shards, trains configs/tiny.toml on a 3D layout
# (TP 2 x PP 2 x DP 2 = 8 local ranks) until a checkpoint, resumes that checkpoint on a
# different layout (DP 2 = 2 ranks) and trains on to the end, then compares the validation
# loss with the corpus's unigram entropy. Extra arguments go to both `trident train` runs.
#   TRIDENT_DEMO_SWITCH=40   the step at which the first layout checkpoints and stops
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --demo
scripts/build.sh

corpus=data/fortunes
if [[ ! -f $corpus/stats.json ]]; then
  /usr/bin/python3 data_tools/prepare_text.py /usr/share/games/fortunes --out-dir "$corpus" \
    --quiet
fi

run=runs/demo
rm -rf "$run"  # the demo's own run directory, rewritten by every demo
switch=${TRIDENT_DEMO_SWITCH:-40}
common=(--config configs/tiny.toml --set log.dir="$run" --set checkpoint.dir="$run/checkpoints"
        --resume auto)

echo "=== part 1: 8 ranks, tensor 2 x pipeline 2 x data 2, steps 1-$switch, then checkpoint"
set +e
timeout 1800 mpiexec -n 8 build/app/trident train "${common[@]}" \
  --set parallel.tensor=2 --set parallel.pipeline=2 --set parallel.data=2 \
  --set train.exit_interval="$switch" "$@"
code=$?
set -e
if [[ $code -ne 75 ]]; then  # 75: stopped after a checkpoint, as asked
  echo "demo: part 1 ended with exit code $code, expected 75" >&2
  exit 1
fi

echo "=== part 2: 2 ranks, data 2, resumed from the checkpoint of part 1"
timeout 1800 mpiexec -n 2 build/app/trident train "${common[@]}" --set parallel.data=2 "$@"

/usr/bin/python3 - "$run/metrics.jsonl" "$corpus/stats.json" "$switch" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
switch = int(sys.argv[3])
before = [r for r in rows if r["step"] <= switch][-1]
after = [r for r in rows if r["step"] > switch][0]
print(f"around the resume: step {before['step']} loss {before['loss']:.4f} (8 ranks, 2x2x2) | "
      f"step {after['step']} loss {after['loss']:.4f} (2 ranks, 1x1x2)")
val = [r for r in rows if "val_loss" in r]
entropy = json.load(open(sys.argv[2]))["unigram_entropy_nats"]
first, last = val[0], val[-1]
print(f"validation loss: {first['val_loss']:.4f} at step {first['step']} -> "
      f"{last['val_loss']:.4f} at step {last['step']}")
print(f"unigram entropy of the corpus: {entropy:.4f} nats/token")
verdict = "below" if last["val_loss"] < entropy else "NOT below"
print(f"final validation loss is {verdict} the unigram entropy "
      f"(by {entropy - last['val_loss']:.4f} nats)")
sys.exit(0 if last["val_loss"] < entropy else 1)
PY
/usr/bin/python3 data_tools/plot_metrics.py "$run" --stats "$corpus/stats.json" --out "$run/loss.png"
echo "loss curve: $run/loss.png; checkpoints: $run/checkpoints"
