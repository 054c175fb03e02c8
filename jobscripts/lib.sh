# jobscripts/lib.sh: the part of Trident's Slurm batch scripts shared by cpu.sbatch and
# gpu.sbatch. Sourced by them, never run; docs/slurm.md explains the behaviour.
#
#   tj_setup TP PP      resolve binary, config, run and checkpoint directories, layout
#                       (tensor TP x pipeline PP x data = the rest of the tasks); log them
#   tj_run [ARGS...]    srun trident train in the background, forward signals, wait, and
#                       requeue the job when trident exits 75; exits the batch script
#
# Exit status of the batch script (what Slurm records): trident's own (0 finished, 1 error,
# 75 checkpointed but not requeued), or 1 for a problem found before launching. A requeued
# job leaves through `scontrol requeue` and starts this script again from the top.
# shellcheck shell=bash

readonly TJ_EXIT_REQUEUE=75  # trident: "checkpointed, please requeue" (EX_TEMPFAIL)

tj_log() { printf '[trident-job %(%F %T)T] %s\n' -1 "$*"; }
# A problem found before launching: exit 1, so the job ends FAILED and is not requeued.
tj_die() { tj_log "error: $*"; tj_log "not requeueing"; exit 1; }

# This job as squeue/scontrol name it. An array task (jobscripts/sweep.sh) has a job id of its
# own, but the last task's id is also the whole array's, so that id would select every task
# (squeue would list their states, scontrol requeue would requeue them all): ARRAYID_TASK
# names the task alone.
tj_job_ref() {
  if [[ -n ${SLURM_ARRAY_TASK_ID:-} && -n ${SLURM_ARRAY_JOB_ID:-} ]]; then
    echo "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
  else
    echo "$SLURM_JOB_ID"
  fi
}

# One field of `scontrol show job` for this job (e.g. EndTime, Restarts, JobState).
tj_job_field() {
  scontrol show job -o "$(tj_job_ref)" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n1
}

# ---- the run directory: one per run, stable across requeues, never shared by accident ----
# RUN_DIR/.slurm_job holds the id of the job that owns the directory. Another job may take it
# over only when that job has left the queue (a deliberate continuation with
# TRIDENT_RUN_DIR=...), never while it still runs or waits to run again after a requeue.
tj_claim_run_dir() {
  local owner_file=$RUN_DIR/.slurm_job owner state
  mkdir -p "$RUN_DIR" "$CKPT_DIR" || tj_die "cannot create $RUN_DIR or $CKPT_DIR"
  if [[ -s $owner_file ]]; then
    owner=$(tr -dc 0-9 <"$owner_file")
    if [[ -n $owner && $owner != "$SLURM_JOB_ID" ]]; then
      state=$(squeue -h -t all -j "$owner" -o %T 2>/dev/null | head -n1)
      case $state in
        ""|COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
          tj_log "run directory $RUN_DIR belonged to job $owner (${state:-no longer queued}): continuing that run" ;;
        *)
          tj_die "run directory $RUN_DIR belongs to job $owner, which is $state; give this job its own TRIDENT_RUN_DIR" ;;
      esac
    fi
  fi
  echo "$SLURM_JOB_ID" >"$owner_file" || tj_die "cannot write $owner_file"
}

# tj_setup DEFAULT_TP DEFAULT_PP
tj_setup() {
  [[ -n ${SLURM_JOB_ID:-} ]] || tj_die "not inside a Slurm job: submit with sbatch"
  local default_tp=$1 default_pp=$2

  TRIDENT_BIN=${TRIDENT_BIN:-$TRIDENT_HOME/build/app/trident}
  TRIDENT_CONFIG=${TRIDENT_CONFIG:-$TRIDENT_HOME/configs/tiny.toml}
  [[ -x $TRIDENT_BIN ]] || tj_die "TRIDENT_BIN=$TRIDENT_BIN is not an executable (build Trident or set TRIDENT_BIN)"
  [[ -f $TRIDENT_CONFIG && -r $TRIDENT_CONFIG ]] || tj_die "TRIDENT_CONFIG=$TRIDENT_CONFIG: no such readable file"

  # The run directory contains the job id, which a requeued job keeps: a requeued run finds its
  # own checkpoints, and two submissions never share a directory unless told to.
  local root=${TRIDENT_RUN_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}/runs}
  RUN_DIR=${TRIDENT_RUN_DIR:-$root/${SLURM_JOB_NAME:-trident}-$SLURM_JOB_ID}
  CKPT_DIR=${TRIDENT_CKPT_DIR:-$RUN_DIR/checkpoints}
  case $RUN_DIR in /*) ;; *) RUN_DIR=${SLURM_SUBMIT_DIR:-$PWD}/$RUN_DIR ;; esac
  case $CKPT_DIR in /*) ;; *) CKPT_DIR=${SLURM_SUBMIT_DIR:-$PWD}/$CKPT_DIR ;; esac
  tj_claim_run_dir

  # Layout: tensor x pipeline x data = tasks. TRIDENT_LAYOUT=config leaves parallel.* to the
  # config file and TRIDENT_ARGS.
  local ntasks=${SLURM_NTASKS:-1} nnodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
  TJ_LAYOUT_ARGS=()
  case ${TRIDENT_LAYOUT:-auto} in
    auto)
      TJ_TP=${TRIDENT_TP:-$default_tp}
      TJ_PP=${TRIDENT_PP:-$default_pp}
      [[ $TJ_TP =~ ^[1-9][0-9]*$ && $TJ_PP =~ ^[1-9][0-9]*$ ]] \
        || tj_die "TRIDENT_TP=$TJ_TP and TRIDENT_PP=$TJ_PP must be positive integers"
      (( ntasks % (TJ_TP * TJ_PP) == 0 )) \
        || tj_die "$ntasks tasks are not a multiple of tensor $TJ_TP x pipeline $TJ_PP"
      TJ_DP=$(( ntasks / (TJ_TP * TJ_PP) ))
      TJ_LAYOUT_ARGS=(--set "parallel.tensor=$TJ_TP" --set "parallel.pipeline=$TJ_PP"
                      --set "parallel.data=$TJ_DP")
      ;;
    config) TJ_TP=config; TJ_PP=config; TJ_DP=config ;;
    *) tj_die "TRIDENT_LAYOUT=${TRIDENT_LAYOUT} must be auto or config" ;;
  esac

  # Resume: `auto` (the latest valid checkpoint in CKPT_DIR, else a fresh start), or a
  # checkpoint path for the first run; a requeued run always continues from its own latest.
  TJ_RESTARTS=${SLURM_RESTART_COUNT:-0}
  TJ_RESUME=${TRIDENT_RESUME:-auto}
  if [[ $TJ_RESUME != auto && $TJ_RESTARTS -gt 0 ]]; then
    tj_log "restart $TJ_RESTARTS: resuming from this run's own checkpoints (--resume auto), not $TJ_RESUME"
    TJ_RESUME=auto
  fi

  read -r -a TJ_EXTRA_ARGS <<<"${TRIDENT_ARGS:-}"

  tj_log "job $SLURM_JOB_ID ($SLURM_JOB_NAME), restart $TJ_RESTARTS, on $(hostname -s)"
  tj_log "layout: $ntasks tasks on $nnodes node(s) [${SLURM_JOB_NODELIST:-?}], tasks per node ${SLURM_TASKS_PER_NODE:-?}, cpus per task ${SLURM_CPUS_PER_TASK:-1}, gpus per node ${SLURM_GPUS_PER_NODE:-0}"
  tj_log "parallel: tensor $TJ_TP x pipeline $TJ_PP x data $TJ_DP (TRIDENT_LAYOUT=${TRIDENT_LAYOUT:-auto})"
  tj_log "time limit: $(tj_job_field TimeLimit), ends at $(tj_job_field EndTime)"
  tj_log "binary: $TRIDENT_BIN"
  tj_log "config: $TRIDENT_CONFIG"
  tj_log "run dir: $RUN_DIR"
  tj_log "checkpoints: $CKPT_DIR (latest: $(cat "$CKPT_DIR/latest" 2>/dev/null || echo none))"
}

# ---- signals ----
# The batch shell receives the time-limit warning (--signal=B:USR1@N) or a user's
# `scancel --batch --signal=USR1`. It never signals the ranks itself: it sends SIGUSR1 to srun,
# and srun forwards SIGUSR1 to every task of the step (SIGTERM would not do: srun answers
# SIGTERM by killing the step). A SIGTERM to the batch shell means Slurm is ending the job
# (scancel, time limit, preemption): it is passed on as SIGUSR1 too (checkpoint if there is
# time), but the job is then not requeued.
TJ_SIGNAL=""
TJ_SRUN_PID=""
TJ_INTERRUPTED=0
tj_on_signal() {
  local sig=$1
  TJ_INTERRUPTED=1
  [[ $sig == TERM || -z $TJ_SIGNAL ]] && TJ_SIGNAL=$sig
  if [[ -n $TJ_SRUN_PID ]] && kill -0 "$TJ_SRUN_PID" 2>/dev/null; then
    tj_log "batch shell got SIG$sig: sending SIGUSR1 to srun (pid $TJ_SRUN_PID), which forwards it to every rank; trident checkpoints at the next step boundary and exits $TJ_EXIT_REQUEUE"
    kill -USR1 "$TJ_SRUN_PID" 2>/dev/null
  else
    tj_log "batch shell got SIG$sig while trident was not running"
  fi
}

# tj_run [ARGS...]: trident's arguments are, in this order (a later --set of a key wins):
# the layout, TJ_DEFAULT_ARGS (the batch script's own defaults, e.g. train.device=cuda),
# TRIDENT_ARGS, ARGS (the batch script's arguments), then log.dir, checkpoint.dir, --resume.
TJ_DEFAULT_ARGS=()
TJ_REQUEUED=0
tj_run() {
  local latest_before rc r
  latest_before=$(cat "$CKPT_DIR/latest" 2>/dev/null)
  # --cpus-per-task: srun (Slurm >= 22.05) no longer takes it from sbatch. --distribution=block:
  # consecutive ranks on the same node, as the grid's rank map needs (tensor groups in a node).
  local cmd=(srun --mpi="${TRIDENT_MPI:-pmi2}" --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}"
             --distribution=block)
  local srun_extra=()
  read -r -a srun_extra <<<"${TRIDENT_SRUN_ARGS:-}"
  cmd+=("${srun_extra[@]}" "$TRIDENT_BIN" train --config "$TRIDENT_CONFIG" "${TJ_LAYOUT_ARGS[@]}"
        "${TJ_DEFAULT_ARGS[@]}" "${TJ_EXTRA_ARGS[@]}" "$@"
        --set "log.dir=$RUN_DIR" --set "checkpoint.dir=$CKPT_DIR" --resume "$TJ_RESUME")

  trap 'tj_on_signal USR1' USR1
  trap 'tj_on_signal TERM' TERM
  if [[ -n $TJ_SIGNAL ]]; then
    tj_die "signalled (SIG$TJ_SIGNAL) before trident started: is the time limit shorter than the --signal lead time?"
  fi
  tj_log "launch: ${cmd[*]}"
  "${cmd[@]}" &
  TJ_SRUN_PID=$!

  # `wait` returns early when a trapped signal arrives: wait again until srun has ended.
  rc=""
  while :; do
    TJ_INTERRUPTED=0
    wait "$TJ_SRUN_PID" 2>/dev/null; r=$?
    (( r == 127 )) && [[ -n $rc ]] && break  # already collected by the previous wait
    rc=$r
    (( TJ_INTERRUPTED )) || break
  done
  TJ_SRUN_PID=""
  tj_log "trident exited with code $rc"

  case $rc in
    0) tj_log "training finished"; exit 0 ;;
    "$TJ_EXIT_REQUEUE") ;;
    *) tj_log "trident failed (code $rc): not requeueing"; exit "$rc" ;;
  esac

  local latest_after max=${TRIDENT_MAX_REQUEUES:-20} state
  latest_after=$(cat "$CKPT_DIR/latest" 2>/dev/null)
  tj_log "checkpointed: $CKPT_DIR/latest -> ${latest_after:-none}"
  if [[ $TJ_SIGNAL == TERM ]]; then
    tj_log "Slurm is ending this job (SIGTERM): not requeueing; continue with TRIDENT_RUN_DIR=$RUN_DIR"
    exit "$rc"
  fi
  if [[ -z $latest_after ]]; then
    tj_log "no checkpoint in $CKPT_DIR after exit code $rc: not requeueing"; exit "$rc"
  fi
  if [[ $latest_after == "$latest_before" ]]; then
    tj_log "no progress since the last start (latest is still $latest_after): not requeueing"
    exit "$rc"
  fi
  if (( TJ_RESTARTS >= max )); then
    tj_log "already restarted $TJ_RESTARTS times (TRIDENT_MAX_REQUEUES=$max): not requeueing"
    exit "$rc"
  fi
  state=$(squeue -h -t all -j "$(tj_job_ref)" -o %T 2>/dev/null | head -n1)
  if [[ -n $state && $state != RUNNING && $state != COMPLETING ]]; then
    tj_log "job is $state: not requeueing"; exit "$rc"
  fi
  # Logged first: once the requeue is accepted, Slurm ends this shell at any moment.
  tj_log "requeueing job $SLURM_JOB_ID (restart $(( TJ_RESTARTS + 1 ))): it resumes from ${latest_after}"
  TJ_REQUEUED=1  # for an EXIT trap (sweep.sbatch): this script comes back, the job goes on
  if scontrol requeue "$(tj_job_ref)"; then
    exit 0
  fi
  # shellcheck disable=SC2034  # read by sweep.sbatch's EXIT trap
  TJ_REQUEUED=0
  tj_log "scontrol requeue $SLURM_JOB_ID failed (was the job submitted with --requeue?): resubmit with TRIDENT_RUN_DIR=$RUN_DIR"
  exit "$rc"
}
