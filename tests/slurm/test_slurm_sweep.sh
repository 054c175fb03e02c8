#!/usr/bin/env bash
# Scenario: jobscripts/sweep.sh submits a two-run learning-rate sweep as one job array. Each
# task trains its own run directory with its own optim.lr (config.toml says "# --set"),
# stops at step 4 with exit code 75 (train.exit_interval), is requeued by itself and resumes
# to step 8; the manifest feeds data_tools/compare_runs.py. A sweep with an invalid run is
# refused before anything is submitted, naming the run.
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

steps=8
cat >"$ST_TMP/base.toml" <<TOML
[model]
layers = 2
width = 32
heads = 4
seq_len = 32
[train]
steps = $steps
global_batch = 8
micro_batch = 2
threads = 1
[optim]
warmup_steps = 2
[data]
train = "$ST_TMP/data/train_*.bin"
val = "$ST_TMP/data/val_*.bin"
[eval]
interval = 0
[log]
interval = 1
TOML
cat >"$ST_TMP/sweep.toml" <<'TOML'
name = "lrsweep"
configs = ["base.toml"]
pattern = "lr{optim.lr}"
set = ["train.exit_interval=4"]
[grid]
"optim.lr" = [0.01, 0.003]
TOML

sweep_dir=$ST_TMP/sweep
out=$(cd "$ST_TMP" && TRIDENT_BIN=$ST_BIN TRIDENT_SWEEP_DIR=$sweep_dir timeout 60 \
      "$ST_SRC/jobscripts/sweep.sh" sweep.toml --ntasks=1 --time=10 \
      --output="$ST_TMP/out/%x-%A_%a.out" 2>&1) || st_fail "sweep.sh failed: $out"
st_log "$out"
jid=$(sed -n 's/.*job array \([0-9]*\),.*/\1/p' <<<"$out")
[[ -n $jid ]] || st_fail "no job array id in: $out"
ST_JOBS+=("${jid}_0" "${jid}_1")
[[ $(wc -l <"$sweep_dir/tasks.tsv") == 2 ]] || st_fail "tasks.tsv: $(cat "$sweep_dir/tasks.tsv")"

for task in 0 1; do
  st_wait_end "${jid}_$task" 240
  st_log "task $task: $(st_job_field "${jid}_$task" JobState), exit $(st_job_field "${jid}_$task" ExitCode), restarts $(st_job_field "${jid}_$task" Restarts)"
done
for task in 0 1; do
  j=${jid}_$task
  lr=$( (( task == 0 )) && echo 0.01 || echo 0.003 )
  run=$sweep_dir/lr$lr
  log=$ST_TMP/out/lrsweep-${jid}_$task.out
  st_job_in_state "$j" COMPLETED || st_fail "task $j is $(st_job_field "$j" JobState), not COMPLETED"
  [[ $(st_job_field "$j" Restarts) == 1 ]] \
    || st_fail "task $j restarts: $(st_job_field "$j" Restarts), expected 1 (requeue at step 4)"
  grep -q 'trident exited with code 75' "$log" || st_fail "task $j: no exit code 75 in $log"
  grep -q 'requeueing job' "$log" || st_fail "task $j: not requeued by the script ($log)"
  grep -q 'training finished' "$log" || st_fail "task $j: did not finish ($log)"
  n=$(st_metric_lines "$run")
  [[ $n == "$steps" ]] || st_fail "$run/metrics.jsonl has $n steps, expected $steps"
  grep -q "^lr = $lr  # --set\$" "$run/config.toml" || st_fail "$run/config.toml: no 'lr = $lr  # --set'"
done

table=$(/usr/bin/python3 "$ST_SRC/data_tools/compare_runs.py" --manifest "$sweep_dir/manifest.tsv" \
          --out "$ST_TMP/compare.png" 2>&1) || st_fail "compare_runs.py failed: $table"
st_log "compare_runs.py:"$'\n'"$table"
grep -q "^optim.lr=0.01 .* $steps " <<<"$table" || st_fail "no row for optim.lr=0.01"
grep -q "^optim.lr=0.003 .* $steps " <<<"$table" || st_fail "no row for optim.lr=0.003"

# Refused before submitting: one run's config is invalid (min_lr > lr), named in one line.
printf 'name = "bad"\nconfigs = ["base.toml"]\npattern = "lr{optim.lr}"\n[grid]\n"optim.lr" = [0.01, 1e-9]\n' \
  >"$ST_TMP/bad.toml"
before=$(squeue -h -t all 2>/dev/null | wc -l)
if err=$(cd "$ST_TMP" && TRIDENT_BIN=$ST_BIN TRIDENT_RUN_ROOT=$ST_TMP/badruns timeout 60 \
         "$ST_SRC/jobscripts/sweep.sh" bad.toml 2>&1); then
  st_fail "sweep.sh accepted an invalid run: $err"
fi
st_log "invalid sweep: $err"
grep -q '^sweep.sh: error: run lr1e-09 (task 1): .*optim.min_lr' <<<"$err" || st_fail "error line: $err"
[[ $(squeue -h -t all 2>/dev/null | wc -l) == "$before" ]] || st_fail "the invalid sweep submitted jobs"
st_log "PASSED"
