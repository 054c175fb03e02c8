#!/usr/bin/env bash
# The test suite under AddressSanitizer (leaks included) and UndefinedBehaviorSanitizer, any
# report failing its test. Not part of scripts/test.sh: on 2 cores the build takes about 17
# minutes and the run about 10. Builds the CPU backend into ${TRIDENT_SANITIZE_DIR:-build-sanitize}
# (no CUDA module: nvcc does not take these flags) at -O1 with debug information, and runs
# every test but the fuzzers, which libFuzzer builds with its own sanitizers (docs/fuzzing.md).
#   scripts/sanitize.sh                 the whole suite
#   scripts/sanitize.sh -R Checkpoint   ctest arguments select tests
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
build_dir=${TRIDENT_SANITIZE_DIR:-build-sanitize}
sanitizers="-fsanitize=address,undefined"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=ON \
  -DTRIDENT_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="-O1 $sanitizers -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
  -DCMAKE_EXE_LINKER_FLAGS="$sanitizers" -DCMAKE_SHARED_LINKER_FLAGS="$sanitizers" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
# halt_on_error: the first report ends the process with a non-zero status (its test fails).
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cd "$build_dir"
ctest --output-on-failure --timeout 900 -j 2 -E '^fuzz_' "$@"
