#!/usr/bin/env bash
# The sweep files shipped in configs/sweeps/ go through jobscripts/sweep.sh as far as sbatch:
# every run expands (data_tools/sweep.py) and passes `trident config`; a stub sbatch on PATH
# records what would be submitted. Checks, per file: one array task per manifest line, the
# manifest's task numbers 0..N-1, and the stub got --array=0-(N-1). No Slurm needed.
#   test_sweep_examples.sh TRIDENT_BIN
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(realpath "${1:?usage: test_sweep_examples.sh TRIDENT_BIN}") || exit 1
tmp=$(mktemp -d /tmp/trident-sweep-examples.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

mkdir -p "$tmp/stub"
cat >"$tmp/stub/sbatch" <<STUB
#!/bin/bash
printf '%s\n' "\$@" >"$tmp/stub/args"
echo 4242
STUB
chmod +x "$tmp/stub/sbatch"

checked=0
for sweep in "$src"/configs/sweeps/*.toml; do
  [[ -f $sweep ]] || continue
  dir=$tmp/$(basename "$sweep" .toml)
  rm -f "$tmp/stub/args"
  out=$(cd "$tmp" && PATH=$tmp/stub:$PATH TRIDENT_BIN=$bin TRIDENT_SWEEP_DIR=$dir \
        "$src/jobscripts/sweep.sh" "$sweep" 2>&1) || fail "$sweep: sweep.sh: $out"
  n=$(grep -vc '^#' "$dir/manifest.tsv")
  (( n > 0 )) || fail "$sweep: empty manifest"
  [[ $(cut -f1 <(grep -v '^#' "$dir/manifest.tsv") | tr '\n' ' ') == "$(seq -s ' ' 0 $(( n - 1 ))) " ]] \
    || fail "$sweep: manifest task numbers: $(cut -f1 "$dir/manifest.tsv" | tr '\n' ' ')"
  [[ $(wc -l <"$dir/tasks.tsv") == "$n" ]] || fail "$sweep: tasks.tsv and manifest.tsv differ in length"
  grep -qx -- "--array=0-$(( n - 1 ))" "$tmp/stub/args" \
    || fail "$sweep: sbatch got $(tr '\n' ' ' <"$tmp/stub/args" 2>/dev/null), expected --array=0-$(( n - 1 ))"
  echo "ok: $sweep: $n runs, each accepted by trident config"
  checked=$(( checked + 1 ))
done
(( checked > 0 )) || fail "no sweep files in $src/configs/sweeps"
echo "checked $checked sweep file(s)"
