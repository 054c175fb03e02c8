#!/usr/bin/env bash
# Configures and builds Trident (Release) into ${TRIDENT_BUILD_DIR:-build}.
#   scripts/build.sh          everything: the trident executable, the tests, the benchmarks
#   scripts/build.sh --demo   only the trident executable (what scripts/demo.sh runs); a new
#                             build directory is configured without tests (GoogleTest not
#                             needed), an existing one keeps its setting (so the tests a
#                             scripts/test.sh built stay registered with CTest)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${TRIDENT_BUILD_DIR:-build}
testing=(-DBUILD_TESTING=ON)
targets=()
for arg in "$@"; do
  case "$arg" in
    --demo)
      testing=()
      [[ -f $build_dir/CMakeCache.txt ]] || testing=(-DBUILD_TESTING=OFF)
      targets=(--target trident) ;;
    *) echo "build.sh: unknown option '$arg'" >&2; exit 2 ;;
  esac
done
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${testing[@]}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"
