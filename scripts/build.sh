#!/usr/bin/env bash
# Configures and builds Trident (Release) into ${TRIDENT_BUILD_DIR:-build}.
#   scripts/build.sh          everything: the trident executable, the tests, the benchmarks
#   scripts/build.sh --demo   only the trident executable (what scripts/demo.sh runs); the
#                             build directory is configured without tests (GoogleTest not needed)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${TRIDENT_BUILD_DIR:-build}
testing=ON
targets=()
for arg in "$@"; do
  case "$arg" in
    --demo) testing=OFF; targets=(--target trident) ;;
    *) echo "build.sh: unknown option '$arg'" >&2; exit 2 ;;
  esac
done
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING="$testing" >/dev/null
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"
