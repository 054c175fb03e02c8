#!/usr/bin/env bash
# A stand-in for `trident train` that follows the trainer's contract with the job scripts
# (docs/slurm.md) without MPI, so test_slurm_jobscript.sh can check the scripts' signal and
# requeue logic quickly and independently of the trainer:
#   trident train --config F --set section.key=value ... --resume auto|PATH
#   a "step" takes 0.5 s; rank 0 prints `step S/N`, appends {"step": S, "loss": ...} to
#   log.dir/metrics.jsonl; a checkpoint is checkpoint.dir/step_XXXXXXXX.h5 plus `latest`;
#   --resume auto continues after `latest`; exit 0 done, 75 checkpointed, 1 error.
# MOCK_MODE: signal  train until done; on SIGUSR1/SIGTERM checkpoint at the next step, exit 75
#            self    one step per start, then checkpoint and exit 75 (like train.exit_after_minutes)
#            stuck   exit 75 at once without writing a checkpoint
#            args    print the arguments, exit 0
set -uo pipefail
mode=${MOCK_MODE:-signal}
rank=${SLURM_PROCID:-0}
[[ ${1:-} == train ]] || { echo "trident: error: expected 'train'" >&2; exit 1; }
shift
if [[ $mode == args ]]; then [[ $rank == 0 ]] && echo "mock args: $*"; exit 0; fi
steps=10 ckpt="" logdir="" resume=""
while (( $# )); do
  case $1 in
    --config) shift 2 ;;
    --set)
      case $2 in
        train.steps=*) steps=${2#*=} ;;
        checkpoint.dir=*) ckpt=${2#*=} ;;
        log.dir=*) logdir=${2#*=} ;;
      esac
      shift 2 ;;
    --resume) resume=$2; shift 2 ;;
    *) echo "trident: error: unexpected argument '$1'" >&2; exit 1 ;;
  esac
done
[[ -n $ckpt && -n $logdir && $resume == auto ]] \
  || { echo "trident: error: mock needs checkpoint.dir, log.dir and --resume auto" >&2; exit 1; }
[[ $mode == stuck ]] && exit 75
start=0
if [[ -s $ckpt/latest ]]; then
  f=$(<"$ckpt/latest"); f=${f##*/}; f=${f%.h5}; start=$(( 10#${f//[^0-9]/} ))
  [[ $rank == 0 ]] && echo "mock: resumed from step $start"
fi
stop=0
trap 'stop=1' USR1 TERM
checkpoint() {
  [[ $rank == 0 ]] || return 0
  local name; name=$(printf 'step_%08d.h5' "$1")
  echo mock >"$ckpt/$name" && echo "$name" >"$ckpt/latest.tmp" && mv "$ckpt/latest.tmp" "$ckpt/latest"
}
mkdir -p "$ckpt" "$logdir"
for (( s = start + 1; s <= steps; s++ )); do
  sleep 0.5 & wait $!   # `wait` lets the trap run at once
  if [[ $rank == 0 ]]; then
    echo "step $s/$steps | loss 0.$(( 1000 - s ))"
    echo "{\"step\": $s, \"loss\": 0.$(( 1000 - s ))}" >>"$logdir/metrics.jsonl"
  fi
  if (( stop )) || [[ $mode == self ]]; then
    (( s < steps )) || break
    checkpoint "$s"; exit 75
  fi
done
checkpoint "$steps"
exit 0
