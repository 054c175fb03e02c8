# tests/slurm/common.sh: sourced by the tests/slurm/test_slurm_*.sh scenarios.
#
# Each scenario runs as `test_slurm_X.sh [TRIDENT_BIN]` (CTest passes the built binary; the
# default is build/app/trident) and:
#   * makes a temp dir /tmp/trident-slurm-test.XXXXXX (removed at exit unless
#     TRIDENT_TEST_KEEP=1) with a small byte-level corpus and a private one-node Slurm cluster
#     (scripts/slurm_local.sh), torn down at exit, also on failure, SIGINT or SIGTERM;
#   * bounds every wait; on expiry or failure prints the job's scontrol record, its output
#     file and the daemons' logs;
#   * exits 0 (pass), 1 (fail) or 77 (skipped: Slurm cannot be installed or run here).
# shellcheck shell=bash
set -uo pipefail

ST_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ST_BIN=${1:-$ST_SRC/build/app/trident}
ST_NAME=$(basename "$0" .sh)
ST_T0=$SECONDS
ST_JOBS=()  # submitted job ids, for the diagnostics

st_log() { printf '[%s %3ds] %s\n' "$ST_NAME" $(( SECONDS - ST_T0 )) "$*"; }
st_skip() { st_log "SKIPPED: $*"; exit 77; }

# Everything useful when something goes wrong.
st_dump() {
  local j f
  echo "===== diagnostics ($ST_NAME) ====="
  for j in "${ST_JOBS[@]}"; do
    echo "----- scontrol show job $j -----"
    timeout 10 scontrol show job "$j" 2>&1
  done
  for f in "$ST_TMP"/out/*.out; do
    [[ -f $f ]] || continue
    echo "----- $f -----"
    tail -n 80 "$f"
  done
  echo "----- squeue / sinfo -----"
  timeout 10 squeue -t all 2>&1; timeout 10 sinfo 2>&1
  "$ST_SRC/scripts/slurm_local.sh" logs "$ST_TMP/cluster" 2>&1
  echo "===== end of diagnostics ====="
}
st_fail() { st_log "FAILED: $*"; st_dump; exit 1; }

st_cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n ${ST_TMP:-} && -d $ST_TMP ]]; then
    "$ST_SRC/scripts/slurm_local.sh" down "$ST_TMP/cluster" >/dev/null 2>&1
    if [[ ${TRIDENT_TEST_KEEP:-0} == 1 ]]; then
      rm -f "$ST_TMP/owner.pid"  # not a leftover for st_reap_stale
      st_log "kept $ST_TMP"
    else
      rm -rf "$ST_TMP"
    fi
  fi
  st_log "done in $(( SECONDS - ST_T0 )) s (exit $rc)"
  exit "$rc"
}

# Clusters left behind by a test that was killed (SIGKILL: no cleanup ran): their owner pid is
# gone. Stop their daemons and remove them.
st_reap_stale() {
  local d owner
  for d in /tmp/trident-slurm-test.*; do
    [[ -d $d && -f $d/owner.pid ]] || continue
    owner=$(tr -dc 0-9 <"$d/owner.pid")
    [[ -n $owner ]] && kill -0 "$owner" 2>/dev/null && continue
    st_log "removing the leftover cluster of a killed test: $d"
    "$ST_SRC/scripts/slurm_local.sh" down "$d/cluster" >/dev/null 2>&1
    rm -rf "$d"
  done
}

# A wait with a deadline: st_wait_for SECONDS DESCRIPTION COMMAND... Never past the test's
# budget (TRIDENT_SLURM_TEST_BUDGET seconds from the start, below CTest's TIMEOUT), so the test
# fails with diagnostics and cleans up instead of being killed.
ST_BUDGET=${TRIDENT_SLURM_TEST_BUDGET:-300}
st_wait_for() {
  local limit=$1 what=$2 deadline
  shift 2
  deadline=$(( SECONDS + limit ))
  (( deadline <= ST_T0 + ST_BUDGET )) || deadline=$(( ST_T0 + ST_BUDGET ))
  until "$@"; do
    (( SECONDS < deadline )) || st_fail "timed out after ${limit} s waiting for: $what"
    sleep 0.5
  done
}

# One field of `scontrol show job` (JobState, Restarts, ExitCode, ...).
st_job_field() {
  timeout 10 scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n1
}
st_job_in_state() {  # JOB STATE...
  local s j=$1; shift
  s=$(st_job_field "$j" JobState)
  for want in "$@"; do [[ $s == "$want" ]] && return 0; done
  return 1
}
st_job_ended() { st_job_in_state "$1" COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY BOOT_FAIL PREEMPTED; }

# st_wait_end JOB SECONDS: waits until the job has ended (never while it is requeued/pending).
st_wait_end() { st_wait_for "$2" "job $1 to end" st_job_ended "$1"; }

# st_submit NAME [VAR=VALUE...] -- [SBATCH OPTIONS...] [-- SCRIPT ARGS...]: submits
# jobscripts/${ST_SCRIPT:-cpu.sbatch} from the temp dir with TRIDENT_BIN and the given
# environment; sets ST_JID to the job id.
# Output file: $(st_out NAME JOBID).
st_submit() {
  local name=$1 envs=("TRIDENT_BIN=$ST_BIN") opts=() out
  shift
  while (( $# )) && [[ $1 != -- ]]; do envs+=("$1"); shift; done
  [[ ${1:-} == -- ]] && shift
  while (( $# )) && [[ $1 != -- ]]; do opts+=("$1"); shift; done
  [[ ${1:-} == -- ]] && shift
  out=$(cd "$ST_TMP" && env "${envs[@]}" timeout 30 sbatch --parsable --job-name="$name" \
          --output="$ST_TMP/out/%x-%j.out" --time=10 "${opts[@]}" \
          "$ST_SRC/jobscripts/${ST_SCRIPT:-cpu.sbatch}" "$@") \
    || st_fail "sbatch of $name failed: $out"
  ST_JID=${out%%;*}
  ST_JOBS+=("$ST_JID")
  st_log "submitted $name: job $ST_JID"
}
st_out() { echo "$ST_TMP/out/$1-$2.out"; }  # NAME JOBID

# The raw JSON text of `loss` on the last line of RUN_DIR/metrics.jsonl (no float round trip:
# the comparison is bitwise in the text trident wrote).
# Step rows only: records with a "type" (straggler reports, rollback events) are skipped.
st_step_rows() { grep '"step"' "$1/metrics.jsonl" 2>/dev/null | grep -v '"type"'; }
st_last_loss() {
  local line
  line=$(st_step_rows "$1" | tail -n1)
  sed -n 's/.*"loss"[[:space:]]*:[[:space:]]*\([^,}[:space:]]*\).*/\1/p' <<<"$line"
}
st_first_loss() {
  local line
  line=$(st_step_rows "$1" | head -n1)
  sed -n 's/.*"loss"[[:space:]]*:[[:space:]]*\([^,}[:space:]]*\).*/\1/p' <<<"$line"
}
st_metric_lines() { local n; n=$(st_step_rows "$1" | grep -c .); echo "${n:-0}"; }

# The model every scenario trains: tiny, 4 ranks, one thread each (MPICH busy-polls; 2 cores).
st_train_args() {
  echo "--set model.layers=2 --set model.width=32 --set model.heads=4 --set model.seq_len=32" \
       "--set train.global_batch=8 --set train.micro_batch=2 --set train.threads=1" \
       "--set optim.warmup_steps=2 --set log.interval=1 --set eval.interval=0" \
       "--set data.train=$ST_TMP/data/train_*.bin --set data.val=$ST_TMP/data/val_*.bin" \
       "--set train.steps=$1"
}

# ---- setup: runs when this file is sourced ----
trap st_cleanup EXIT
trap 'st_log "interrupted"; exit 1' INT TERM

[[ -x $ST_BIN ]] || { st_log "FAILED: trident binary $ST_BIN not found: build it first"; exit 1; }
# Inside a real Slurm job (CI on a cluster) its SLURM_* variables would leak into our sbatch.
for _v in $(compgen -e | grep '^SLURM_'); do unset "$_v"; done
unset TRIDENT_HOME TRIDENT_CONFIG TRIDENT_RUN_DIR TRIDENT_RUN_ROOT TRIDENT_CKPT_DIR TRIDENT_ARGS \
      TRIDENT_TP TRIDENT_PP TRIDENT_LAYOUT TRIDENT_RESUME TRIDENT_BIN TRIDENT_SRUN_ARGS

st_reap_stale
ST_TMP=$(mktemp -d /tmp/trident-slurm-test.XXXXXX) || { st_log "FAILED: mktemp"; exit 1; }
echo $$ >"$ST_TMP/owner.pid"
mkdir -p "$ST_TMP/out" "$ST_TMP/data"
chmod 755 "$ST_TMP"

# Corpus: a few fortune files (Debian's `fortunes`), else the repository's own documentation.
_corpus=()
for _f in computers science wisdom; do
  [[ -f /usr/share/games/fortunes/$_f ]] && _corpus+=("/usr/share/games/fortunes/$_f")
done
(( ${#_corpus[@]} > 0 )) || _corpus=("$ST_SRC/docs" "$ST_SRC/README.md")
timeout 60 /usr/bin/python3 "$ST_SRC/data_tools/prepare_text.py" "${_corpus[@]}" \
    --out-dir "$ST_TMP/data" >"$ST_TMP/prepare.log" 2>&1 \
  || { cat "$ST_TMP/prepare.log"; st_log "FAILED: prepare_text.py"; exit 1; }

_up_rc=0
SLURM_LOCAL_TIMEOUT=60 timeout 200 "$ST_SRC/scripts/slurm_local.sh" up "$ST_TMP/cluster" \
  >"$ST_TMP/up.log" 2>&1 || _up_rc=$?
if (( _up_rc == 3 )); then
  cat "$ST_TMP/up.log"; st_skip "Slurm cannot be installed or run on this machine (see above)"
elif (( _up_rc != 0 )); then
  cat "$ST_TMP/up.log"; st_log "FAILED: the private Slurm cluster did not come up"; exit 1
fi
export SLURM_CONF=$ST_TMP/cluster/etc/slurm.conf
st_log "cluster up ($ST_TMP), corpus ready; trident: $ST_BIN"
