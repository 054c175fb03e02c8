#!/usr/bin/env bash
# The job scripts' own logic, with tests/slurm/mock_trident.sh in place of trident (it keeps
# the trainer's contract but needs no MPI and takes 0.5 s a step), so these cases are quick
# and do not depend on the trainer. The jobs run side by side (2 tasks each):
#   a) SIGTERM to the batch shell (Slurm ending the job: scancel, time limit): passed to the
#      ranks as SIGUSR1, trident checkpoints and exits 75, but the job is NOT requeued;
#   b) trident exits 75 by itself (as with train.exit_after_minutes) at every
#      start: requeued and resumed until TRIDENT_MAX_REQUEUES=1, then FAILED with code 75;
#   c) exit 75 without a new checkpoint (no progress): not requeued;
#   d) gpu.sbatch's layout on one node: tensor = tasks per node, pipeline = nodes, cuda device,
#      and the batch script's arguments reach trident.
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

mock=$ST_SRC/tests/slurm/mock_trident.sh

st_submit sigterm "TRIDENT_BIN=$mock" MOCK_MODE=signal -- --ntasks=2 -- --set train.steps=60
a=$ST_JID
st_submit selfexit "TRIDENT_BIN=$mock" MOCK_MODE=self TRIDENT_MAX_REQUEUES=1 -- --ntasks=2 \
  -- --set train.steps=60
b=$ST_JID
mkdir -p "$ST_TMP/stuck/checkpoints"
echo step_00000004.h5 >"$ST_TMP/stuck/checkpoints/latest"
st_submit stuck "TRIDENT_BIN=$mock" MOCK_MODE=stuck "TRIDENT_RUN_DIR=$ST_TMP/stuck" -- --ntasks=2
c=$ST_JID
ST_SCRIPT=gpu.sbatch st_submit gpu "TRIDENT_BIN=$mock" MOCK_MODE=args -- \
  --nodes=1 --ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1 -- --set train.steps=7
d=$ST_JID

# a) SIGTERM
out_a=$(st_out sigterm "$a")
has_steps() { grep -q '^step 2/' "$1" 2>/dev/null; }
st_wait_for 60 "job $a to log 2 steps" has_steps "$out_a"
timeout 10 scancel --batch --signal=TERM "$a" || st_fail "scancel --signal=TERM failed"
st_wait_end "$a" 60
st_job_in_state "$a" FAILED || st_fail "job $a is $(st_job_field "$a" JobState), not FAILED"
[[ $(st_job_field "$a" ExitCode) == 75:0 ]] || st_fail "job $a: exit code $(st_job_field "$a" ExitCode), expected 75:0"
[[ $(st_job_field "$a" Restarts) == 0 ]] || st_fail "job $a was requeued"
grep -q 'batch shell got SIGTERM: sending SIGUSR1 to srun' "$out_a" || st_fail "SIGTERM was not passed on as SIGUSR1"
grep -q 'Slurm is ending this job (SIGTERM): not requeueing' "$out_a" || st_fail "no SIGTERM verdict in $out_a"
[[ -s $ST_TMP/runs/sigterm-$a/checkpoints/latest ]] || st_fail "job $a wrote no checkpoint"
st_log "a) SIGTERM: checkpointed ($(cat "$ST_TMP/runs/sigterm-$a/checkpoints/latest")), FAILED 75, not requeued"

# c) no progress (ended long ago)
st_wait_end "$c" 30
st_job_in_state "$c" FAILED || st_fail "job $c is $(st_job_field "$c" JobState), not FAILED"
[[ $(st_job_field "$c" Restarts) == 0 ]] || st_fail "job $c was requeued"
grep -q 'no progress since the last start (latest is still step_00000004.h5): not requeueing' \
  "$(st_out stuck "$c")" || st_fail "no 'no progress' verdict"
st_log "c) no progress: FAILED, not requeued"

# d) gpu.sbatch layout
st_wait_end "$d" 30
st_job_in_state "$d" COMPLETED || st_fail "job $d is $(st_job_field "$d" JobState), not COMPLETED"
out_d=$(st_out gpu "$d")
grep -q 'parallel: tensor 2 x pipeline 1 x data 1' "$out_d" || st_fail "gpu.sbatch layout wrong"
grep -q -- '^mock args: .*--set parallel.tensor=2 --set parallel.pipeline=1 --set parallel.data=1 --set train.device=cuda --set train.steps=7 --set log.dir=.* --resume auto$' \
  "$out_d" || st_fail "gpu.sbatch passed the wrong arguments"
st_log "d) gpu.sbatch: tensor 2 x pipeline 1 x data 1, train.device=cuda, script arguments passed"

# b) self-exit 75 at every start, one requeue allowed
st_wait_end "$b" 90
out_b=$(st_out selfexit "$b")
st_job_in_state "$b" FAILED || st_fail "job $b is $(st_job_field "$b" JobState), not FAILED"
[[ $(st_job_field "$b" Restarts) == 1 ]] || st_fail "job $b restarts: $(st_job_field "$b" Restarts), expected 1"
grep -q "requeueing job $b (restart 1): it resumes from step_00000001.h5" "$out_b" || st_fail "job $b was not requeued after step 1"
grep -q 'mock: resumed from step 1' "$out_b" || st_fail "the requeued run did not resume"
grep -q 'already restarted 1 times (TRIDENT_MAX_REQUEUES=1): not requeueing' "$out_b" \
  || st_fail "TRIDENT_MAX_REQUEUES was not applied"
[[ $(cat "$ST_TMP/runs/selfexit-$b/checkpoints/latest") == step_00000002.h5 ]] || st_fail "wrong final checkpoint"
st_log "b) exit 75 by itself: requeued once, resumed at step 2, stopped by TRIDENT_MAX_REQUEUES"

st_log "PASSED"
