#!/usr/bin/env bash
# Scenario 3: jobs that cannot run fail fast, end FAILED and are never requeued:
#   a) a broken config (model.heads=3 does not divide model.width=32): trident's error is in
#      the job's output file;
#   b) a config file that does not exist: the job script stops before srun;
#   c) a run directory that belongs to another job still in the queue: the script refuses it.
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

# Ends FAILED, within LIMIT seconds of submission, with Restarts=0, and stays so.
expect_failed_fast() {  # NAME JOB LIMIT
  local name=$1 jid=$2 limit=$3 t0=$SECONDS
  st_wait_end "$jid" 60
  st_job_in_state "$jid" FAILED || st_fail "job $jid is $(st_job_field "$jid" JobState), not FAILED"
  (( SECONDS - t0 <= limit )) || st_fail "job $jid took $(( SECONDS - t0 )) s to fail (limit $limit s)"
  sleep 3  # a requeue would show by now (cred_expire of the test cluster is 5 s; PENDING at once)
  st_job_in_state "$jid" FAILED || st_fail "job $jid is $(st_job_field "$jid" JobState) after failing"
  [[ $(st_job_field "$jid" Restarts) == 0 ]] || st_fail "job $jid was requeued"
  grep -q 'requeueing job' "$(st_out "$name" "$jid")" 2>/dev/null && st_fail "job $jid requeued itself"
  st_log "job $jid: FAILED, exit $(st_job_field "$jid" ExitCode), restarts 0, after $(( SECONDS - t0 - 3 )) s"
}

# a) broken config
st_submit badheads TRIDENT_TP=2 TRIDENT_PP=2 \
  "TRIDENT_ARGS=$(st_train_args 8) --set model.heads=3" -- --ntasks=4
jid=$ST_JID
expect_failed_fast badheads "$jid" 30
out=$(st_out badheads "$jid")
grep -q '^trident: error: .*model.width (32) must be divisible by model.heads (3)' "$out" \
  || st_fail "trident's error is not in $out"
grep -q 'not requeueing' "$out" || st_fail "the job script did not say it is not requeueing"

# b) missing config file
st_submit noconfig "TRIDENT_CONFIG=$ST_TMP/no-such.toml" -- --ntasks=4
jid=$ST_JID
expect_failed_fast noconfig "$jid" 20
out=$(st_out noconfig "$jid")
grep -q "TRIDENT_CONFIG=$ST_TMP/no-such.toml: no such readable file" "$out" \
  || st_fail "no config error in $out"
grep -q 'launch: srun' "$out" && st_fail "srun was launched for a missing config"

# c) a run directory owned by a job that is still queued (held, so it never runs)
st_submit holder -- --hold --ntasks=1
holder=$ST_JID
mkdir -p "$ST_TMP/shared-run"
echo "$holder" >"$ST_TMP/shared-run/.slurm_job"
st_submit intruder "TRIDENT_RUN_DIR=$ST_TMP/shared-run" "TRIDENT_ARGS=$(st_train_args 8)" -- --ntasks=4
jid=$ST_JID
expect_failed_fast intruder "$jid" 20
grep -q "belongs to job $holder, which is PENDING" "$(st_out intruder "$jid")" \
  || st_fail "the run directory guard did not name job $holder"
[[ $(cat "$ST_TMP/shared-run/.slurm_job") == "$holder" ]] || st_fail "the intruder took the run directory"
timeout 10 scancel "$holder"

st_log "PASSED"
