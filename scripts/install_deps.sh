#!/usr/bin/env bash
# Installs Trident's dependencies from Debian's archive, and the Python tools' packages from
# PyPI (`tokenizers`; for the tests also `safetensors`, `tensorboard`) into the venv .venv/ of
# the repository (made with --system-site-packages, so Debian's numpy and h5py are seen
# through it).
# Idempotent: installs only what is missing, so repeated runs cost ~1 s.
#   scripts/install_deps.sh            build + test dependencies (Slurm included)
#   scripts/install_deps.sh --demo     build + the README demo's (fortunes corpus, matplotlib);
#                                      no test packages, so a first demo run installs less
#   scripts/install_deps.sh --bench    build + test + PyTorch (the CPU reference in bench/)
set -euo pipefail

build_packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-openmp-dev
  libdnnl-dev                           # oneDNN: the float GEMM (docs/gemm.md)
  libmpich-dev mpich
  libhdf5-mpich-dev
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev
  libpcre2-dev                          # the tokenizer's pre-tokenizer regexes (lib/tokenizer)
  python3 python3-venv python3-pip
)
test_packages=(
  libgtest-dev hdf5-tools python3-numpy python3-h5py
  slurmctld slurmd slurm-client munge   # the one-node Slurm cluster of tests/slurm
  clang libclang-rt-dev                 # the libFuzzer targets of tests/fuzz
  fortunes                              # the corpus of the tokenizer tests (tests/tools)
  python3-matplotlib                    # compare_runs.py / plot_timeline.py (tests/tools, the
                                        # Slurm sweep's comparison in tests/slurm)
)
packages=("${build_packages[@]}" "${test_packages[@]}")
# PyPI, pinned: tokenizers (data_tools/prepare_text.py); safetensors and tensorboard, the
# independent readers of what `trident export` and log.tensorboard write, and ml_dtypes, the
# independent float8 conversions (tests only; 0.5.4: the last that takes Debian's numpy 1.24).
pypi=(tokenizers==0.23.3 safetensors==0.8.0 tensorboard==2.21.0 ml_dtypes==0.5.4)
pypi_modules=(tokenizers safetensors tensorboard ml_dtypes)
for arg in "$@"; do
  case "$arg" in
    --demo)
      packages=("${build_packages[@]}" fortunes python3-matplotlib)
      pypi=(tokenizers==0.23.3)
      pypi_modules=(tokenizers) ;;
    --bench) packages+=(python3-torch python3-matplotlib fortunes) ;;
    *) echo "install_deps.sh: unknown option '$arg'" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "install_deps.sh: installing ${missing[*]}" >&2
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Python tools' venv (data_tools/, the checks in tests/).
venv=$(cd "$(dirname "$0")/.." && pwd)/.venv
imports=$(IFS=,; echo "${pypi_modules[*]}")
if ! "$venv/bin/python" -c "import $imports" 2>/dev/null; then
  echo "install_deps.sh: installing ${pypi[*]} into $venv" >&2
  [[ -x $venv/bin/pip ]] || /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "${pypi[@]}"
fi
