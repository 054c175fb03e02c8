#!/usr/bin/env bash
# The test command: installs the dependencies (Debian packages), builds, runs every test
# (GoogleTest through CTest; MPI tests under hard timeouts). Exit code non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
cd "${TRIDENT_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 600 -j 2 "$@"
