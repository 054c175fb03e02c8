#!/usr/bin/env bash
# The pipeline schedules side by side on the tiny model (configs/tiny.toml: 8 layers, width 128,
# seq 128, vocab 4096) with the same global batch of 16 sequences: 1f1b, gpipe, interleaved
# (parallel.virtual_stages = 2), zb-h1 and zb-h2 on PP 2 with m = 4, 8, 16 micro-batches
# (micro-batch 4, 2, 1) and PP 4 with m = 8. For each run it prints
#   step ms     median ms_per_step of the steps after the first two (metrics.jsonl)
#   measured    the executor's measured bubble over those steps: each stage's time waiting in
#               pipeline messages / its time in the schedule (metrics.jsonl pipeline_bubble),
#               averaged over the stages
#   closed      the closed form: (p-1)/(v m + p-1); zb-h1 (p-1)/(3m + p-1), which assumes
#               F = B = W, and zb-h2 the same for m >= 2p - 1
#   simulator   pipeline/simulator.hpp's bubble with F = 1, B = 2 (zb-h1/h2: BI = W = 1)
# and, for PP 2 with m = 4, writes a timeline trace of step 3 and its PNG
# (data_tools/plot_timeline.py) to OUT/timeline_<schedule>.png. All five schedules run
# (interleaved: 8 layers in p * 2 chunks, m a multiple of p).
#
# Usage: bench/pipeline_schedules.sh          (from anywhere; runs in the repo root)
# Environment: TRIDENT (default build/app/trident), BUBBLE (build/bench/bench_schedule_bubble,
#   the closed form and simulator), OUT (build/bench-pipeline), STEPS (5), TIMEOUT (600 s per
#   run). Builds nothing: build the targets trident and bench_schedule_bubble first.
# Exit status 0 when every run worked.
set -uo pipefail
cd "$(dirname "$0")/.."
TRIDENT=${TRIDENT:-build/app/trident}
BUBBLE=${BUBBLE:-build/bench/bench_schedule_bubble}
OUT=${OUT:-build/bench-pipeline}
STEPS=${STEPS:-5}
TIMEOUT=${TIMEOUT:-600}
PYTHON=/usr/bin/python3
for tool in "$TRIDENT" "$BUBBLE"; do
  [[ -x $tool ]] || { echo "pipeline_schedules.sh: $tool is not built" >&2; exit 1; }
done
mkdir -p "$OUT/data" "$OUT/logs"

# 300k synthetic tokens < 4096 in the llm.c shard format (256 x int32 header, uint16 tokens).
"$PYTHON" - "$OUT/data/train_000.bin" <<'PY'
import random, struct, sys
rng = random.Random(1)
tokens = [rng.randrange(4096) for _ in range(300000)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack("<%dH" % len(tokens), *tokens))
PY

# "step_ms measured_bubble" of a run directory: steps after the first two.
summarise() {
  "$PYTHON" - "$1/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "type" not in r]  # step rows only
rows = [r for r in rows if r["step"] > 2] or rows
ms = statistics.median(r["ms_per_step"] for r in rows)
bubble = statistics.mean(statistics.mean(r["pipeline_bubble"]) for r in rows)
print("%.1f %.3f" % (ms, bubble))
PY
}

status=0
printf "%-12s %3s %4s %3s %6s %10s %9s %8s %10s\n" schedule p m v micro "step ms" measured \
  closed simulator
for layout in "2 4" "2 8" "2 16" "4 8"; do
  read -r p m <<<"$layout"
  micro=$((16 / m))
  for schedule in 1f1b gpipe interleaved zb-h1 zb-h2; do
    v=1
    sets=(--set parallel.pipeline="$p" --set parallel.schedule="$schedule"
          --set train.global_batch=16 --set train.micro_batch="$micro" --set train.steps="$STEPS"
          --set train.threads=1 --set data.train="$OUT/data/train_*.bin" --set "data.val=[]"
          --set eval.interval=0 --set log.interval=1)
    if [[ $schedule == interleaved ]]; then
      v=2
      sets+=(--set parallel.virtual_stages=2)
    fi
    name="pp${p}_m${m}_${schedule}"
    dir="$OUT/$name"
    rm -rf "$dir"
    sets+=(--set log.dir="$dir")
    trace=0
    if [[ $p == 2 && $m == 4 ]]; then
      trace=1
      sets+=(--set log.trace=true --set "log.trace_steps=[3, 3]")
    fi
    theory=$("$BUBBLE" "$schedule" "$p" "$m" "$v")
    log="$OUT/logs/$name.log"
    timeout "$TIMEOUT" mpiexec -n "$p" "$TRIDENT" train --config configs/tiny.toml "${sets[@]}" \
      >"$log" 2>&1
    code=$?
    if [[ $code -ne 0 ]]; then
      printf "%-12s %3s %4s %3s %6s FAILED (exit %d, see %s)\n" "$schedule" "$p" "$m" "$v" \
        "$micro" "$code" "$log"
      status=1
      continue
    fi
    read -r ms bubble <<<"$(summarise "$dir")"
    printf "%-12s %3s %4s %3s %6s %10s %9s %8s %10s\n" "$schedule" "$p" "$m" "$v" "$micro" "$ms" \
      "$bubble" $theory
    if [[ $trace == 1 ]]; then
      "$PYTHON" data_tools/plot_timeline.py "$dir" --out "$OUT/timeline_$schedule.png" \
        --title "$schedule, PP $p, m = $m, step 3" >"$OUT/logs/$name.timeline.txt" 2>&1 ||
        { echo "plot_timeline.py failed on $dir: see $OUT/logs/$name.timeline.txt"; status=1; }
    fi
  done
done
echo "timelines (PP 2, m = 4, step 3): $OUT/timeline_*.png; bubble per stage from the traces:"
for f in "$OUT"/logs/pp2_m4_*.timeline.txt; do
  [[ -f $f ]] && { echo "  $(basename "$f" .timeline.txt):"; sed 's/^/    /' "$f"; }
done
exit $status
