#!/usr/bin/env bash
# The README demo: installs what it needs, builds, turns the fortunes corpus into byte-level
# shards, trains configs/tiny.toml, and compares the final validation loss with the corpus's
# unigram entropy. Extra arguments go to `trident train` (e.g. --set train.steps=100).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --demo
scripts/build.sh

corpus=data/fortunes
if [[ ! -f $corpus/stats.json ]]; then
  /usr/bin/python3 data_tools/prepare_text.py /usr/share/games/fortunes --out-dir "$corpus"
fi

run=runs/demo
rm -rf "$run"  # the demo's own run directory, rewritten by every demo
ranks=${TRIDENT_DEMO_RANKS:-1}
timeout 1800 mpiexec -n "$ranks" build/app/trident train --config configs/tiny.toml \
  --set log.dir="$run" "$@"

/usr/bin/python3 - "$run/metrics.jsonl" "$corpus/stats.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
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
echo "loss curve: $run/loss.png"
