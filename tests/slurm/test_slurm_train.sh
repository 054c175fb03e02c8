#!/usr/bin/env bash
# Scenario 1: sbatch jobscripts/cpu.sbatch trains the tiny model on 4 ranks (tensor 2 x
# pipeline 2) to the end: the job is COMPLETED with exit code 0, not restarted, the layout is
# logged, metrics.jsonl has every step and the loss falls.
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

steps=8
st_submit train TRIDENT_TP=2 TRIDENT_PP=2 "TRIDENT_ARGS=$(st_train_args $steps)" -- --ntasks=4
jid=$ST_JID
out=$(st_out train "$jid")
run=$ST_TMP/runs/train-$jid   # the default: SUBMIT_DIR/runs/JOBNAME-JOBID

st_wait_end "$jid" 150
st_log "job $jid: $(st_job_field "$jid" JobState), exit $(st_job_field "$jid" ExitCode), restarts $(st_job_field "$jid" Restarts)"
st_job_in_state "$jid" COMPLETED || st_fail "job $jid is $(st_job_field "$jid" JobState), not COMPLETED"
[[ $(st_job_field "$jid" ExitCode) == 0:0 ]] || st_fail "exit code $(st_job_field "$jid" ExitCode)"
[[ $(st_job_field "$jid" Restarts) == 0 ]] || st_fail "the job was restarted"

grep -q 'layout: 4 tasks on 1 node(s)' "$out" || st_fail "no layout line in $out"
grep -q 'parallel: tensor 2 x pipeline 2 x data 1' "$out" || st_fail "no parallel line in $out"
grep -q "run dir: $run\$" "$out" || st_fail "run dir is not $run"
grep -q 'training finished' "$out" || st_fail "no 'training finished' in $out"

n=$(st_metric_lines "$run")
[[ $n == "$steps" ]] || st_fail "$run/metrics.jsonl has $n steps, expected $steps"
first=$(st_first_loss "$run") last=$(st_last_loss "$run")
st_log "loss: $first (step 1) -> $last (step $steps)"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a + 0 > 0 && b + 0 > 0 && b + 0 < a + 0) }' \
  || st_fail "the loss did not fall: $first -> $last"
st_log "PASSED"
