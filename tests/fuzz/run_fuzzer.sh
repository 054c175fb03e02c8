#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time on its seed corpus (docs/fuzzing.md).
#   run_fuzzer.sh BINARY SEED_DIR WORK_DIR [LIBFUZZER_FLAG ...]
# FUZZ_SECONDS (default 20) sets the time; new inputs go to WORK_DIR/corpus (the seeds in
# the repository are only read), a crashing input to WORK_DIR/artifacts/. Exits non-zero on a
# crash, a timeout (-timeout=10 per input), a leak, a sanitizer report, memory past 2 GiB, or
# (124) a run past FUZZ_SECONDS + 90 s.
set -euo pipefail
binary=$1 seeds=$2 work=$3
shift 3  # what is left: more libFuzzer flags, e.g. -jobs=2 -workers=2
seconds=${FUZZ_SECONDS:-20}
mkdir -p "$work/corpus" "$work/artifacts"
# The seeds are read first (each one must pass), then libFuzzer mutates for $seconds.
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# The whole run is bounded too (a hang outside an input, e.g. in MPI_Init, which libFuzzer's
# per-input -timeout does not see): $seconds plus 90 s for start-up and the seeds.
# libFuzzer's line for each new or reduced input (thousands a run) and its closing dictionary
# are left out, so that a failure's report (what broke, the stack, the input in hex and Base64,
# the artifact's path) stays near the top of what CTest shows instead of in the middle of a
# long log, where a CI excerpt cuts it (sed -u: line by line, as it comes). pipefail gives the
# script the fuzzer's exit status.
timeout -k 5 $((seconds + 90)) \
  "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" "$@" "$work/corpus" "$seeds" 2>&1 |
  sed -u -e '/^###### Recommended dictionary/,/^###### End of recommended dictionary/d' \
         -e '/^#[0-9]*\t\(NEW\|REDUCE\|pulse\) /d' -e '/^\tNEW_FUNC/d'
