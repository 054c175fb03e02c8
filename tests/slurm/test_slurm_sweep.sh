#!/usr/bin/env bash
# Scenario: jobscripts/sweep.sh submits a four-run learning-rate sweep as one job array of
# one-rank tasks, each training its own run directory with its own optim.lr (config.toml says
# "# --set"). While they run, task 1's batch shell gets SIGUSR1 (`scancel --batch
# --signal=USR1`, what the time-limit warning does): trident checkpoints and exits 75, the
# task alone is requeued and resumes from its checkpoint to the last step. Task 2 stops by
# itself with exit code 75 at train.exit_interval, is requeued and resumes too; tasks 0 and 3
# run straight through. Then: every task COMPLETED, the manifest lists task -> overrides ->
# run dir, every task recorded its end, and the last task to end (and only it) wrote the
# comparison, compare.png and compare.txt, into the sweep directory, one row per run with its
# final loss from metrics.jsonl. A sweep with an invalid run is refused before anything is
# submitted, naming the run.
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

# Steps: enough that task 1 is still training when the signal arrives. The signal is sent once
# it has logged 3 steps and reaches trident within about a second (slurmd, the batch shell,
# srun); a step takes a few ms, so every task's rank sleeps 10 ms after each step
# (TRIDENT_TEST_SLOW_RANK, train/straggler.hpp; it changes no result): the ~397 steps left
# take at least 4 s, not 1-2, and a slow spell of the slurm daemons (seconds, on 2 vCPUs
# shared with busy-polling ranks) does not let the task finish before the signal.
steps=400
exit_interval=250
lrs=(0.01 0.003 0.001 0.0003)
signalled=1
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
cat >"$ST_TMP/sweep.toml" <<TOML
name = "lrsweep"
configs = ["base.toml"]
pattern = "lr{optim.lr}"
[[runs]]
"optim.lr" = ${lrs[0]}
[[runs]]
"optim.lr" = ${lrs[1]}
[[runs]]
"optim.lr" = ${lrs[2]}
"train.exit_interval" = $exit_interval
[[runs]]
"optim.lr" = ${lrs[3]}
TOML

sweep_dir=$ST_TMP/sweep
out=$(cd "$ST_TMP" && TRIDENT_BIN=$ST_BIN TRIDENT_SWEEP_DIR=$sweep_dir TRIDENT_TEST_SLOW_RANK=0:10 timeout 60 \
      "$ST_SRC/jobscripts/sweep.sh" sweep.toml --ntasks=1 --time=10 \
      --output="$ST_TMP/out/%x-%A_%a.out" 2>&1) || st_fail "sweep.sh failed: $out"
st_log "$out"
jid=$(sed -n 's/.*job array \([0-9]*\),.*/\1/p' <<<"$out")
[[ -n $jid ]] || st_fail "no job array id in: $out"
for task in 0 1 2 3; do ST_JOBS+=("${jid}_$task"); done
[[ $(wc -l <"$sweep_dir/tasks.tsv") == 4 ]] || st_fail "tasks.tsv: $(cat "$sweep_dir/tasks.tsv")"

# The manifest: task -> name -> overrides -> run dir, one line per task after the header.
for task in 0 1 2 3; do
  own="optim.lr=${lrs[task]}"
  (( task == 2 )) && own+=" train.exit_interval=$exit_interval"
  want=$(printf '%s\t%s\t%s\t%s' "$task" "lr${lrs[task]}" "$own" "$sweep_dir/lr${lrs[task]}")
  grep -qxF "$want" "$sweep_dir/manifest.tsv" \
    || st_fail "manifest.tsv has no line '$want':"$'\n'"$(cat "$sweep_dir/manifest.tsv")"
done
[[ $(grep -vc '^#' "$sweep_dir/manifest.tsv") == 4 ]] || st_fail "manifest.tsv: not 4 tasks"

# The signal, to task 1 alone, while it trains.
sig_job=${jid}_$signalled
sig_run=$sweep_dir/lr${lrs[signalled]}
sig_log=$ST_TMP/out/lrsweep-${jid}_$signalled.out
logged() { (( $(st_metric_lines "$sig_run") >= $1 )); }
st_wait_for 150 "task $signalled to log 3 steps" logged 3
st_job_in_state "$sig_job" RUNNING || st_fail "task $sig_job is $(st_job_field "$sig_job" JobState), not RUNNING"
st_log "task $signalled logged $(st_metric_lines "$sig_run") steps: scancel --batch --signal=USR1 $sig_job"
timeout 10 scancel --batch --signal=USR1 "$sig_job" || st_fail "scancel --signal failed"

for task in 0 1 2 3; do
  st_wait_end "${jid}_$task" 240
  st_log "task $task: $(st_job_field "${jid}_$task" JobState), exit $(st_job_field "${jid}_$task" ExitCode), restarts $(st_job_field "${jid}_$task" Restarts)"
done

for task in 0 1 2 3; do
  j=${jid}_$task
  run=$sweep_dir/lr${lrs[task]}
  log=$ST_TMP/out/lrsweep-${jid}_$task.out
  restarts=$( (( task == 1 || task == 2 )) && echo 1 || echo 0 )
  st_job_in_state "$j" COMPLETED || st_fail "task $j is $(st_job_field "$j" JobState), not COMPLETED"
  [[ $(st_job_field "$j" ExitCode) == 0:0 ]] || st_fail "task $j exit code $(st_job_field "$j" ExitCode)"
  [[ $(st_job_field "$j" Restarts) == "$restarts" ]] \
    || st_fail "task $j restarts: $(st_job_field "$j" Restarts), expected $restarts"
  grep -q 'training finished' "$log" || st_fail "task $j: did not finish ($log)"
  n=$(st_metric_lines "$run")
  [[ $n == "$steps" ]] || st_fail "$run/metrics.jsonl has $n steps, expected $steps"
  grep -q "^lr = ${lrs[task]}  # --set\$" "$run/config.toml" \
    || st_fail "$run/config.toml: no 'lr = ${lrs[task]}  # --set'"
  [[ $(cat "$sweep_dir/ended/$task" 2>/dev/null) == 0 ]] \
    || st_fail "$sweep_dir/ended/$task: '$(cat "$sweep_dir/ended/$task" 2>&1)', expected 0"
  (( restarts == 1 )) || continue

  # Stopped with 75, requeued, and resumed from the checkpoint it wrote: the second start's
  # first step is the one after it.
  grep -q 'trident exited with code 75' "$log" || st_fail "task $j: no exit code 75 in $log"
  grep -q "requeueing job .* (restart 1)" "$log" || st_fail "task $j: not requeued by the script ($log)"
  ckpt=$(sed -n 's/.*checkpointed: .*latest -> \(.*\)$/\1/p' "$log" | head -n1)
  [[ -n $ckpt ]] || st_fail "task $j: no checkpoint reported in $log"
  c=${ckpt##*/}; c=${c%.h5}; c=$(( 10#$(tr -dc 0-9 <<<"$c") ))
  (( c >= 1 && c < steps )) || st_fail "task $j: checkpoint step $c is not inside the run"
  (( task != 2 || c == exit_interval )) || st_fail "task $j: checkpoint at step $c, expected $exit_interval"
  grep -q "resumed from .* at step $c\$" "$log" || st_fail "task $j: no 'resumed from ... at step $c' in $log"
  first=$(sed -n '/, restart 1, on/,$p' "$log" | sed -n 's/^step *\([0-9][0-9]*\)\/.*/\1/p' | head -n1)
  [[ $first == $(( c + 1 )) ]] || st_fail "task $j: resumed at step ${first:-?}, expected $(( c + 1 ))"
  st_log "task $task: stopped at step $c, requeued, resumed at step $first, finished at $steps"
done
grep -q 'batch shell got SIGUSR1: sending SIGUSR1 to srun' "$sig_log" \
  || st_fail "task $sig_job: the signal was not forwarded ($sig_log)"

# The comparison: written by exactly one task, the last to end, into the sweep directory.
writers=$(grep -l 'sweep: wrote the comparison of 4 runs' "$ST_TMP"/out/lrsweep-"${jid}"_*.out)
[[ $(grep -c . <<<"$writers") == 1 ]] || st_fail "the comparison was written by: '${writers:-no task}'"
last=$(sed -n 's/.*_\([0-9]*\)\.out$/\1/p' <<<"$writers")
grep -q 'sweep: every task has ended, this one last' "$writers" || st_fail "no 'this one last' in $writers"
for task in 0 1 2 3; do  # no task recorded its end after the writer recorded its own
  [[ $sweep_dir/ended/$task -nt $sweep_dir/ended/$last ]] \
    && st_fail "task $task recorded its end after the writer, task $last"
done
[[ $(head -c 8 "$sweep_dir/compare.png" 2>/dev/null | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] \
  || st_fail "$sweep_dir/compare.png is not a PNG"
st_log "comparison by task $last (the last to end), compare.txt:"$'\n'"$(cat "$sweep_dir/compare.txt")"
for task in 0 1 2 3; do
  loss=$(st_last_loss "$sweep_dir/lr${lrs[task]}")
  want=$(/usr/bin/python3 -c 'import sys; print("%.4f" % float(sys.argv[1]))' "$loss")
  grep -q "^optim.lr=${lrs[task]}, .* $steps  *$want " "$sweep_dir/compare.txt" \
    || st_fail "compare.txt: no row 'optim.lr=${lrs[task]}, ... $steps $want'"
done

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
