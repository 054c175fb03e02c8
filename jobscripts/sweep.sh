#!/bin/bash
# Submits a sweep (data_tools/sweep.py describes the file) as one Slurm job array: one task
# per run, each in its own run directory, each requeued by itself when it stops with exit
# code 75 (time limit, signal; jobscripts/lib.sh). Every run's config is validated with
# `trident config` before anything is submitted.
#
#   jobscripts/sweep.sh SWEEP.toml [SBATCH OPTIONS...]
#   e.g. jobscripts/sweep.sh sweeps/lr.toml --time=02:00:00 --ntasks=4
#
# Environment: TRIDENT_BIN, TRIDENT_TP/PP, TRIDENT_ARGS ... as jobscripts/cpu.sbatch;
#   TRIDENT_RUN_ROOT  parent of the sweep directory                    [$PWD/runs]
#   TRIDENT_SWEEP_DIR the sweep directory (tasks.tsv, manifest.tsv, one run dir per task)
#                                      [TRIDENT_RUN_ROOT/NAME-YYYYmmdd-HHMMSS]
# Prints the job array's id and the manifest (task, name, overrides, run directory). The last
# task to end compares the finished runs into SWEEP_DIR/compare.png and compare.txt
# (sweep.sbatch); by hand at any time:
#   /usr/bin/python3 data_tools/compare_runs.py --manifest SWEEP_DIR/manifest.tsv
set -euo pipefail

die() { echo "sweep.sh: error: $*" >&2; exit 1; }
[[ $# -ge 1 ]] || die "usage: jobscripts/sweep.sh SWEEP.toml [SBATCH OPTIONS...]"
sweep=$1
shift
home=$(cd "$(dirname "$0")/.." && pwd)
bin=${TRIDENT_BIN:-$home/build/app/trident}
[[ -x $bin ]] || die "TRIDENT_BIN=$bin is not an executable (build Trident or set TRIDENT_BIN)"

# The name first (for the directory), then the tasks into it.
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
out=$(/usr/bin/python3 "$home/data_tools/sweep.py" "$sweep" --out-dir "$staging" 2>&1) \
  || { echo "$out" >&2; exit 1; }
read -r name count <<<"$out"
dir=${TRIDENT_SWEEP_DIR:-${TRIDENT_RUN_ROOT:-$PWD/runs}/$name-$(date +%Y%m%d-%H%M%S)}
[[ ! -e $dir/tasks.tsv ]] || die "$dir already holds a sweep: give TRIDENT_SWEEP_DIR another directory"
/usr/bin/python3 "$home/data_tools/sweep.py" "$sweep" --out-dir "$dir" >/dev/null

# Validation, before anything is queued: one error line names the run.
i=0
while IFS=$'\t' read -r -a task; do
  args=()
  IFS=: read -r -a configs <<<"${task[2]}"
  for c in "${configs[@]}"; do args+=(--config "$c"); done
  for s in "${task[@]:3}"; do args+=(--set "$s"); done
  # As the job will run it: jobscripts/lib.sh sets the run and checkpoint directories.
  args+=(--set "log.dir=${task[1]}" --set "checkpoint.dir=${task[1]}/checkpoints")
  if ! err=$("$bin" config "${args[@]}" 2>&1 >/dev/null); then
    die "run ${task[0]} (task $i): $(grep -m1 'error' <<<"$err")"
  fi
  i=$(( i + 1 ))
done <"$dir/tasks.tsv"

jid=$(TRIDENT_HOME=$home TRIDENT_BIN=$bin TRIDENT_SWEEP_DIR=$dir \
      sbatch --parsable --array="0-$(( count - 1 ))" --job-name="$name" "$@" \
             "$home/jobscripts/sweep.sbatch") || die "sbatch failed"
jid=${jid%%;*}
echo "$jid" >"$dir/job_array"
echo "submitted sweep $name: job array $jid, $count tasks"
echo "manifest: $dir/manifest.tsv"
echo "comparison (written by the last task to end): $dir/compare.png, $dir/compare.txt"
