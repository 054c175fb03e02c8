#!/usr/bin/env bash
# The README demo, the whole mission on one machine: installs what it needs, builds the
# trident executable (only: the tests are scripts/test.sh's), trains a 4096-token byte-level
# BPE on the fortunes corpus and writes the corpus with it as Megatron indexed datasets
# (.bin/.idx), trains configs/tiny.toml on a 3D layout (TP 2 x PP 2 x DP 2 = 8 local ranks)
# until a checkpoint, resumes that checkpoint on a different layout (DP 2 = 2 ranks) and
# trains on to the end, compares the validation loss with the unigram entropy of the
# tokenized corpus, and exports the final checkpoint in Hugging Face format (with the
# tokenizer), then prints three fortunes generated from it. Part 1 also writes a timeline
# trace of its steps 2-3 (log.trace) and draws it (data_tools/plot_timeline.py:
# runs/demo/timeline.png, with the measured bubble per stage).
# Extra arguments go to both `trident train` runs.
#   TRIDENT_DEMO_SWITCH=40   the step at which the first layout checkpoints and stops
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --demo
scripts/build.sh --demo

corpus=data/fortunes_bpe  # configs/tiny.toml's data.train / data.val and vocab_size 4096
if [[ ! -f $corpus/stats.json ]]; then
  .venv/bin/python data_tools/prepare_text.py /usr/share/games/fortunes --out-dir "$corpus" \
    --train-tokenizer 4096 --output-format megatron --quiet
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
  --set train.exit_interval="$switch" --set log.trace=true --set "log.trace_steps=[2, 3]" "$@"
code=$?
set -e
if [[ $code -ne 75 ]]; then  # 75: stopped after a checkpoint, as asked
  echo "demo: part 1 ended with exit code $code, expected 75" >&2
  exit 1
fi

# The timeline trace part 1 wrote of steps 2-3 (log.trace): one row per rank, and the measured
# bubble of each pipeline stage.
/usr/bin/python3 data_tools/plot_timeline.py "$run" --out "$run/timeline.png" \
  --title "part 1: TP 2 x PP 2 x DP 2, steps 2-3"

echo "=== part 2: 2 ranks, data 2, resumed from the checkpoint of part 1"
timeout 1800 mpiexec -n 2 build/app/trident train "${common[@]}" --set parallel.data=2 "$@"

/usr/bin/python3 - "$run/metrics.jsonl" "$corpus/stats.json" "$switch" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in rows if "type" not in r]  # step rows (not straggler or rollback records)
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
print(f"unigram entropy of the BPE-tokenized corpus: {entropy:.4f} nats/token")
verdict = "below" if last["val_loss"] < entropy else "NOT below"
print(f"final validation loss is {verdict} the unigram entropy "
      f"(by {entropy - last['val_loss']:.4f} nats)")
sys.exit(0 if last["val_loss"] < entropy else 1)
PY
/usr/bin/python3 data_tools/plot_metrics.py "$run" --stats "$corpus/stats.json" --out "$run/loss.png"

final=$(ls "$run"/checkpoints/step_*.h5 | sort | tail -n 1)
build/app/trident export --format hf "$final" "$run/hf"
cp "$corpus/tokenizer.json" "$run/hf/tokenizer.json"
echo "loss curve: $run/loss.png; timeline of steps 2-3 (part 1): $run/timeline.png" \
  "(trace: $run/trace.json, opens in ui.perfetto.dev); checkpoints: $run/checkpoints"
echo "Hugging Face export of $final (config.json, model.safetensors, tokenizer.json): $run/hf"

# Three fortunes from the final checkpoint: `trident generate` (the model graph's key/value-cache
# decoding, docs/tokenizer.md) with the corpus's BPE and a fixed seed, each ending at the
# end-of-document token.
echo "=== three generated fortunes from $final"
for prompt in "The" "Q:" "You will"; do
  echo "---"
  build/app/trident generate --ckpt "$final" --tokenizer "$corpus/tokenizer.json" \
    --prompt "$prompt" --max-new-tokens 80 --stop "<|endoftext|>" --temperature 0.8 --top-k 40 \
    --top-p 0.95 --seed 7
done
