#!/usr/bin/env bash
# Scenario 2: checkpoint on a signal, requeue, resume, and the same result as without.
#   1. a reference job trains 12 steps uninterrupted;
#   2. the same config as a second job; after 3 logged steps its batch shell gets SIGUSR1
#      (`scancel --batch --signal=USR1`, what `--signal=B:USR1@120` does before the time
#      limit); the script passes it through srun to the ranks, trident checkpoints and exits
#      75, the script requeues the job, the requeued run resumes (--resume auto) from the
#      checkpoint and completes;
#   3. the job is COMPLETED after exactly one restart, the resumed run's first step is the one
#      after the checkpoint, and the final loss is bitwise the reference's (the JSON text).
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

steps=12
args=$(st_train_args $steps)

# 1. reference
st_submit reference TRIDENT_TP=2 TRIDENT_PP=2 "TRIDENT_RUN_DIR=$ST_TMP/reference" \
  "TRIDENT_ARGS=$args" -- --ntasks=4
ref=$ST_JID
st_wait_end "$ref" 150
st_job_in_state "$ref" COMPLETED || st_fail "reference job $ref is $(st_job_field "$ref" JobState)"
ref_loss=$(st_last_loss "$ST_TMP/reference")
[[ -n $ref_loss ]] || st_fail "no loss in $ST_TMP/reference/metrics.jsonl"
st_log "reference job $ref: COMPLETED, final loss $ref_loss"

# 2. interrupted. Its 12 steps take a few ms each, less than the signal takes to arrive, so rank 0
# sleeps 400 ms after each step (TRIDENT_TEST_SLOW_RANK, train/straggler.hpp): the run is still
# training when the signal comes, and the sleep changes no result.
st_submit interrupted TRIDENT_TP=2 TRIDENT_PP=2 "TRIDENT_ARGS=$args" TRIDENT_TEST_SLOW_RANK=0:400 \
  -- --ntasks=4
jid=$ST_JID
out=$(st_out interrupted "$jid")
run=$ST_TMP/runs/interrupted-$jid
steps_logged() {  # metrics lines or printed step lines, whichever trident has flushed
  local a b
  a=$(st_metric_lines "$run")
  b=$(grep -c '^step *[0-9]' "$out" 2>/dev/null); b=${b:-0}
  (( a >= $1 || b >= $1 ))
}
st_wait_for 120 "job $jid to log 3 steps" steps_logged 3
st_job_in_state "$jid" RUNNING || st_fail "job $jid is $(st_job_field "$jid" JobState), not RUNNING"
st_log "job $jid logged 3 steps: scancel --batch --signal=USR1 $jid"
timeout 10 scancel --batch --signal=USR1 "$jid" || st_fail "scancel --signal failed"
restarted() { [[ $(st_job_field "$jid" Restarts) -ge 1 ]]; }
restarted_or_ended() { restarted || st_job_ended "$jid"; }
st_wait_for 90 "job $jid to be requeued" restarted_or_ended
restarted || st_fail "job $jid ended $(st_job_field "$jid" JobState) without being requeued"
st_log "job $jid requeued: $(st_job_field "$jid" JobState)"
st_wait_end "$jid" 150

# 3. checks
st_job_in_state "$jid" COMPLETED || st_fail "job $jid is $(st_job_field "$jid" JobState), not COMPLETED"
[[ $(st_job_field "$jid" ExitCode) == 0:0 ]] || st_fail "exit code $(st_job_field "$jid" ExitCode)"
[[ $(st_job_field "$jid" Restarts) == 1 ]] || st_fail "restarts: $(st_job_field "$jid" Restarts), expected 1"
grep -q 'batch shell got SIGUSR1: sending SIGUSR1 to srun' "$out" || st_fail "the signal was not forwarded"
grep -q 'trident exited with code 75' "$out" || st_fail "trident did not exit with 75"
grep -q "requeueing job $jid (restart 1)" "$out" || st_fail "the script did not requeue"
grep -q "job $jid (interrupted), restart 1," "$out" || st_fail "no second run in $out"
grep -q 'training finished' "$out" || st_fail "the second run did not finish"

ckpt=$(sed -n 's/.*checkpointed: .*latest -> \(.*\)$/\1/p' "$out" | head -n1)
[[ -n $ckpt ]] || st_fail "no checkpoint reported in $out"
c=${ckpt##*/}; c=${c%.h5}; c=$(( 10#$(tr -dc 0-9 <<<"$c") ))
st_log "checkpoint at the signal: $ckpt (step $c)"
(( c >= 1 && c < steps )) || st_fail "checkpoint step $c is not inside the run (1..$(( steps - 1 )))"
[[ -s $run/checkpoints/latest ]] || st_fail "no $run/checkpoints/latest"
latest=$(cat "$run/checkpoints/latest")
[[ -f $run/checkpoints/${latest##*/} || -f $latest ]] || st_fail "latest points to a missing file: $latest"

# The resumed run starts at the step after the checkpoint, not from scratch.
first_resumed=$(sed -n '/restart 1, on/,$p' "$out" | sed -n 's/^step *\([0-9][0-9]*\)\/.*/\1/p' | head -n1)
st_log "first step of the resumed run: ${first_resumed:-none}"
[[ $first_resumed == $(( c + 1 )) ]] || st_fail "the resumed run started at step ${first_resumed:-?}, expected $(( c + 1 ))"

last_step=$(st_step_rows "$run" | tail -n1 | sed -n 's/.*"step"[[:space:]]*:[[:space:]]*\([0-9]*\).*/\1/p')
[[ $last_step == "$steps" ]] || st_fail "the last logged step is ${last_step:-?}, expected $steps"
loss=$(st_last_loss "$run")
st_log "final loss: interrupted + resumed $loss, reference $ref_loss"
[[ $loss == "$ref_loss" ]] || st_fail "final loss $loss differs from the uninterrupted run's $ref_loss"
st_log "PASSED"
