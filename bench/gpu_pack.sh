#!/usr/bin/env bash
# Builds Trident (Release, CUDA) into build-gpu/ and assembles gpu_pack/ (git-ignored): what
# bench/gpu_check.sh needs on a device machine whose image has the CUDA toolkit (cudart, cuBLAS,
# NCCL), a driver and a Python with PyTorch, but no MPICH, no parallel HDF5, no OpenBLAS and no
# package registry. Runs HERE (Debian 12, the project's build machine); the device tool then
# carries gpu_pack/ beside the working tree (see bench/README.md, "GPU check").
#
#   gpu_pack/bin/   trident, test_cuda_* (every tests/test_cuda_*.cpp and
#                   tests/mpi/test_cuda_*_npN.cpp that builds; gpu_check.sh runs the _npN ones
#                   under mpiexec -n N),
#                   gpu_gemm_ceiling, gpu_attention (the attention kernels timed for step q),
#                   ckpt_compare (tests/tools: two checkpoints bit for bit,
#                   for the resume row; all stripped), mpiexec (MPICH's mpiexec.hydra) and
#                   hydra_pmi_proxy
#   gpu_pack/module/  libtrident_cuda.so, the GPU backend that trident (and the GPU trainer
#                   tests) load on demand from <dir of the executable>/../lib: gpu_check.sh
#                   unpacks it to lib/ beside its bin/
#   gpu_pack/lib/   every shared library those need that the device image is not expected to
#                   have (MPICH, parallel HDF5, OpenBLAS, gfortran, hwloc, UCX, slurm, curl, ...),
#                   copied from this machine's installed libraries, plus UCX's cma module in
#                   lib/ucx/. NOT packed (the image has them): glibc, libstdc++, libgcc_s and the
#                   CUDA libraries (libcuda, libcudart, libcublas*, libnccl).
#   Every file of bin/, module/ and lib/ over 1 MiB is stored xz-compressed (NAME.xz: libmpich alone is
#   40 MiB, OpenBLAS 35 MiB, each CUDA binary 3-4 MiB; the device tool carries 64 MiB with the
#   working tree); gpu_check.sh unpacks bin/ and lib/ to a scratch directory in /tmp.
#   gpu_pack/fallback/  libcudart.so.13 only: bench/gpu_check.sh puts it on the library path
#                   only if the image has no libcudart.so.13 of its own
#   gpu_pack/data/  tiny_train.bin / tiny_val.bin: byte-level shards (vocab 256) made with
#                   data_tools/prepare_text.py from a few of Debian's fortune files (the repo's
#                   docs if fortune-mod is not installed); random_50304.bin: 1 Mi random tokens
#                   < 50304 (llm.c format, the generator of bench/train_bench.sh) for the GPT-2
#                   124M throughput run
#   gpu_pack/MANIFEST.txt  source revision, build flags, every file with its size and origin
#
# C++ is compiled with -march=x86-64-v3 (-DTRIDENT_ARCH) instead of the project's default
# -march=native: the build machine's CPU is not the device machine's.
#
# Usage: bench/gpu_pack.sh [--head] [--no-build] [--no-verify] [--jobs N]
#   --head       build the committed HEAD (git archive into build-gpu-head/src) instead of the
#                working tree, e.g. while the working tree is mid-edit and does not compile
#   --no-build   pack what build-gpu/ (or build-gpu-head/build) already holds
#   --no-verify  skip the check run (LD_DEBUG) that every library a CPU run and an mpiexec run
#                load here comes from gpu_pack/lib or the set the image is expected to have
# Exit status: 0 pack complete; 1 trident or gpu_gemm_ceiling did not build, or the pack is
# over its size limit; a test_cuda_* target (or ckpt_compare) that fails to build is reported
# and left out.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

from_head=0 do_build=1 do_verify=1 jobs=$(nproc)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --head) from_head=1; shift ;;
    --no-build) do_build=0; shift ;;
    --no-verify) do_verify=0; shift ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_pack.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "gpu_pack.sh: error: $*" >&2; exit 1; }
note() { echo "== $*" >&2; }

pack="$repo/gpu_pack"
limit_mib=${GPU_PACK_LIMIT_MIB:-58}     # the device tool carries 64 MiB, working tree included
PYTHON=${PYTHON:-/usr/bin/python3}

if [[ $from_head == 1 ]]; then
  src="$repo/build-gpu-head/src"
  build="$repo/build-gpu-head/build"
  if [[ $do_build == 1 ]]; then
    note "source: git archive HEAD ($(git rev-parse --short HEAD)) -> $src"
    rm -rf "$src"; mkdir -p "$src" "$build"
    git archive --format=tar HEAD | tar -x -C "$src"
  fi
  revision="HEAD $(git rev-parse HEAD)"
else
  src="$repo"
  build="$repo/build-gpu"
  revision="working tree at HEAD $(git rev-parse HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo ' + uncommitted changes')"
fi

# ---------------------------------------------------------------- build
mkdir -p "$build"

test_targets=()
for f in "$src"/tests/test_cuda_*.cpp "$src"/tests/mpi/test_cuda_*_np*.cpp; do
  [[ -e $f ]] && test_targets+=("$(basename "$f" .cpp)")
done
# Not a test binary, but built and packed the same way (bin/): gpu_check.sh's resume row
# compares the final checkpoints with it.
tool_targets=(ckpt_compare)
built_tools=()
built_tests=() failed_tests=()
if [[ $do_build == 1 ]]; then
  command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] || die "nvcc not found"
  note "configure: $build (Release, TRIDENT_CUDA=ON, -march=x86-64-v3)"
  gen=(); [[ -f $build/CMakeCache.txt ]] || gen=(-G Ninja)
  cmake -S "$src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DTRIDENT_CUDA=ON \
      -DTRIDENT_ARCH=x86-64-v3 >"$build/gpu-pack-cmake.log" 2>&1 ||
    { tail -30 "$build/gpu-pack-cmake.log" >&2; die "cmake configure failed ($build/gpu-pack-cmake.log)"; }
  note "build: trident gpu_gemm_ceiling gpu_attention (-j $jobs)"
  cmake --build "$build" -j "$jobs" --target trident gpu_gemm_ceiling gpu_attention \
      >"$build/gpu-pack-build.log" 2>&1 ||
    { grep -E -A8 "error|FAILED" "$build/gpu-pack-build.log" | head -40 >&2
      die "building trident / gpu_gemm_ceiling / gpu_attention failed (log: $build/gpu-pack-build.log)"; }
  for t in "${test_targets[@]}"; do
    note "build: $t"
    if cmake --build "$build" -j "$jobs" --target "$t" >"$build/gpu-pack-build-$t.log" 2>&1; then
      built_tests+=("$t")
    else
      grep -E -A8 "error|FAILED" "$build/gpu-pack-build-$t.log" | head -20 >&2
      echo "gpu_pack.sh: WARNING: $t did not build; left out of the pack" \
           "(log: $build/gpu-pack-build-$t.log)" >&2
      failed_tests+=("$t")
    fi
  done
  for t in "${tool_targets[@]}"; do
    note "build: $t"
    if cmake --build "$build" -j "$jobs" --target "$t" >"$build/gpu-pack-build-$t.log" 2>&1; then
      built_tools+=("$t")
    else
      echo "gpu_pack.sh: WARNING: $t did not build; left out of the pack" \
           "(log: $build/gpu-pack-build-$t.log)" >&2
      failed_tests+=("$t")
    fi
  done
else
  for t in "${tool_targets[@]}"; do
    if [[ -x $build/tests/tools/$t ]]; then built_tools+=("$t"); else failed_tests+=("$t"); fi
  done
  for t in "${test_targets[@]}"; do
    if [[ -x $build/tests/$t ]]; then built_tests+=("$t"); else failed_tests+=("$t"); fi
  done
fi
ninja -C "$build" -t commands trident 2>/dev/null | grep -- ' -c ' | grep -- '\.cpp' | grep -q -- '-march=native' &&
  echo "gpu_pack.sh: WARNING: some compile commands still use -march=native" >&2
for b in app/trident bench/gpu_gemm_ceiling bench/gpu_attention; do
  [[ -x $build/$b ]] || die "$build/$b missing"
done
[[ -f $build/lib/libtrident_cuda.so ]] || die "$build/lib/libtrident_cuda.so (the GPU backend module) missing"

# ---------------------------------------------------------------- assemble
tmp="$build/gpu_pack.tmp"   # same file system as gpu_pack/: moved into place at the end
rm -rf "$tmp"
mkdir -p "$tmp/bin" "$tmp/module" "$tmp/lib/ucx" "$tmp/fallback" "$tmp/data"
manifest="$tmp/MANIFEST.txt"
{
  echo "gpu_pack: assembled by bench/gpu_pack.sh on $(date -u '+%Y-%m-%d %H:%M UTC') ($(hostname))"
  echo "source: $revision"
  echo "build: $build (Release, TRIDENT_CUDA=ON, C++ -march=x86-64-v3; CUDA sm_80, sm_90a, compute_90 PTX)"
  echo "nvcc: $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version) | grep -o 'release [0-9.]*, V[0-9.]*')"
  echo "mpich: $(mpichversion 2>/dev/null | awk -F'\t' '/Version|Device/{printf "%s ", $NF}')"
  echo "test binaries: ${built_tests[*]:-none}; tools: ${built_tools[*]:-none}${failed_tests:+ (did not build: ${failed_tests[*]})}"
  echo
} >"$manifest"

note "binaries"
cp "$build/app/trident" "$build/bench/gpu_gemm_ceiling" "$build/bench/gpu_attention" "$tmp/bin/"
for t in "${built_tests[@]}"; do cp "$build/tests/$t" "$tmp/bin/"; done
for t in "${built_tools[@]}"; do cp "$build/tests/tools/$t" "$tmp/bin/"; done
cp "$build/lib/libtrident_cuda.so" "$tmp/module/"
strip "$tmp"/bin/* "$tmp"/module/*
hydra=$(readlink -f "$(command -v mpiexec.hydra || command -v mpiexec)")
proxy=$(command -v hydra_pmi_proxy) || die "hydra_pmi_proxy not found (Debian: mpich)"
cp "$hydra" "$tmp/bin/mpiexec"
cp "$proxy" "$tmp/bin/hydra_pmi_proxy"

# The libraries the image is expected to have (glibc, the C++ runtime, the CUDA libraries).
excluded_re='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libmvec\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so)'
ucx_modules=()
ucx_dir=$(dirname "$(readlink -f /usr/lib/x86_64-linux-gnu/libucs.so.0 2>/dev/null || echo /nonexistent/x)")/ucx
for m in "$ucx_dir"/libuct_cma.so.0; do
  # UCX loads its transport modules from <dir of libucs.so>/ucx; the cma module (cross-memory
  # attach, no other dependencies) is the one useful on one node without InfiniBand.
  [[ -f $m ]] || continue
  cp -L "$m" "$tmp/lib/ucx/"; cp -L "$m" "$tmp/lib/ucx/$(basename "$m" .0)"
  ucx_modules+=("$tmp/lib/ucx/$(basename "$m")")
done

note "shared libraries (ldd)"
declare -A origin=()
missing=()
for elf in "$tmp"/bin/* "$tmp"/module/* "${ucx_modules[@]}"; do
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    [[ $name =~ $excluded_re ]] && continue
    if [[ $path == "not" ]]; then missing+=("$name (needed by $(basename "$elf"))"); continue; fi
    [[ -n ${origin[$name]:-} ]] && continue
    origin[$name]=$(readlink -f "$path")
  done < <(ldd "$elf")
done
[[ ${#missing[@]} -eq 0 ]] || die "unresolved libraries here: ${missing[*]}"
for name in $(printf '%s\n' "${!origin[@]}" | sort); do
  cp -L "${origin[$name]}" "$tmp/lib/$name"
done
cudart=$(ldd "$tmp/module/libtrident_cuda.so" | awk '$1 ~ /^libcudart\.so/ {print $3}')
if [[ -n $cudart && -f $cudart ]]; then cp -L "$cudart" "$tmp/fallback/$(basename "$cudart")"; fi

note "data"
corpus_src=()
for f in computers linux science; do
  [[ -f /usr/share/games/fortunes/$f ]] && corpus_src+=("/usr/share/games/fortunes/$f")
done
[[ ${#corpus_src[@]} -gt 0 ]] || corpus_src=("$repo/docs" "$repo/README.md")
"$PYTHON" data_tools/prepare_text.py "${corpus_src[@]}" --out-dir "$tmp/data" --prefix tiny_ \
    --quiet
mv "$tmp/data/tiny_train_000.bin" "$tmp/data/tiny_train.bin"
mv "$tmp/data/tiny_val_000.bin" "$tmp/data/tiny_val.bin"
"$PYTHON" - "$tmp/data/random_50304.bin" <<'EOF'
import sys, numpy as np
n = 1 << 20
hdr = np.zeros(256, dtype=np.int32)
hdr[0], hdr[1], hdr[2] = 20240520, 1, n       # magic, version, token count
tok = np.random.default_rng(1234).integers(0, 50304, size=n, dtype=np.uint16)
with open(sys.argv[1], "wb") as f:
    f.write(hdr.tobytes()); f.write(tok.tobytes())
EOF

{
  echo "corpus: data_tools/prepare_text.py ${corpus_src[*]} -> data/tiny_{train,val}.bin"
  echo "random: data/random_50304.bin, 1048576 tokens < 50304, numpy default_rng(1234)"
  echo
  echo "files (bytes before compression, path, origin; files of bin/, module/ and lib/ over 1 MiB are stored as PATH.xz):"
  (cd "$tmp" && find . -type f ! -name MANIFEST.txt | sort | while read -r f; do
     name=$(basename "$f")
     o=""
     case $f in
       ./lib/ucx/*) o="$ucx_dir/$name" ;;
       ./lib/*) o=${origin[$name]:-} ;;
       ./fallback/*) o=$cudart ;;
       ./bin/mpiexec) o=$hydra ;;
       ./bin/hydra_pmi_proxy) o=$proxy ;;
       ./bin/*|./module/*) o="built (stripped)" ;;
     esac
     if [[ -n $o && $o == /* && -f $o ]] && command -v dpkg >/dev/null; then
       pkg=$( (dpkg -S "$o" 2>/dev/null || dpkg -S "${o#/usr}" 2>/dev/null) | head -1 | cut -d: -f1) || pkg=""
       [[ -n $pkg ]] && o="$o [$pkg $(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null)]"
     fi
     printf '%10d  %s  %s\n' "$(stat -c %s "$f")" "${f#./}" "$o"
   done)
} >>"$manifest"

# MPICH's libmpich (ch4:ucx, ~40 MiB of code) and OpenBLAS (~35 MiB, every CPU kernel) alone
# would fill the 64 MiB the device tool carries: every file of bin/, module/ and lib/ over 1 MiB travels
# xz-compressed (NAME.xz); bench/gpu_check.sh unpacks them to a scratch directory.
note "compress: files of bin/, module/ and lib/ over 1 MiB (xz)"
for f in "$tmp"/lib/* "$tmp"/bin/* "$tmp"/module/*; do
  if [[ -f $f ]] && (( $(stat -c %s "$f") > 1024 * 1024 )); then xz -T0 -6 "$f"; fi
done
size_mib=$(du -sm "$tmp" | cut -f1)
note "pack size: ${size_mib} MiB (limit ${limit_mib} MiB)"
if (( size_mib > limit_mib )); then
  du -a -m "$tmp" | sort -rn | head -15 >&2
  die "gpu_pack is ${size_mib} MiB, over ${limit_mib} MiB (GPU_PACK_LIMIT_MIB)"
fi
rm -rf "$pack"
mv "$tmp" "$pack"

# ---------------------------------------------------------------- verify (here, on the CPU)
if [[ $do_verify == 1 ]]; then
  note "verify: every library a CPU run and an mpiexec run load comes from gpu_pack/lib or the image's set"
  vdir="$build/gpu-pack-verify"
  rm -rf "$vdir"; mkdir -p "$vdir/ld"
  cuda_dir=$(dirname "$(ldconfig -p | awk '/libcublasLt\.so\.[0-9]+ / {print $NF; exit}')" 2>/dev/null || true)
  [[ -d ${cuda_dir:-} ]] || cuda_dir=/usr/local/cuda/lib64
  # Unpacked as gpu_check.sh does: bin/ whole into $vdir/bin, the compressed libraries into
  # $vdir/xzlib (before lib/ on the path).
  mkdir -p "$vdir/xzlib" "$vdir/bin"
  for f in "$pack"/lib/*.xz; do
    if [[ -f $f ]]; then xz -dc "$f" >"$vdir/xzlib/$(basename "$f" .xz)"; fi
  done
  for f in "$pack"/bin/*; do
    if [[ $f == *.xz ]]; then xz -dc "$f" >"$vdir/bin/$(basename "$f" .xz)"; else cp "$f" "$vdir/bin/"; fi
  done
  chmod +x "$vdir"/bin/*
  mkdir -p "$vdir/lib"
  for f in "$pack"/module/*; do
    if [[ $f == *.xz ]]; then xz -dc "$f" >"$vdir/lib/$(basename "$f" .xz)"; else cp "$f" "$vdir/lib/"; fi
  done
  vbin=$vdir/bin
  run_env=(env "LD_LIBRARY_PATH=$vdir/xzlib:$pack/lib:$cuda_dir" "PATH=$vbin:$PATH"
           "UCX_MODULE_DIR=$pack/lib/ucx"
           "LD_DEBUG=libs" "LD_DEBUG_OUTPUT=$vdir/ld/trace")
  common=(train --config configs/gpu_parity.toml --set train.steps=2 --set train.threads=1
          --set log.interval=1)
  ok=1
  "${run_env[@]}" timeout 120 "$vbin/trident" "${common[@]}" --set log.dir="$vdir/tp1" \
      >"$vdir/tp1.log" 2>&1 || { ok=0; echo "gpu_pack.sh: verify: trident (1 rank) failed:" >&2; tail -5 "$vdir/tp1.log" >&2; }
  "${run_env[@]}" timeout 120 "$vbin/mpiexec" -launcher fork -n 2 "$vbin/trident" "${common[@]}" \
      --set parallel.tensor=2 --set log.dir="$vdir/tp2" >"$vdir/tp2.log" 2>&1 ||
    { ok=0; echo "gpu_pack.sh: verify: mpiexec -n 2 trident (TP 2) failed:" >&2; tail -5 "$vdir/tp2.log" >&2; }
  # A GPU run here loads the GPU backend module from bin/../lib and its CUDA libraries, then
  # stops: no GPU. Any other end (the module not found or not loadable) fails the check.
  "${run_env[@]}" timeout 120 "$vbin/trident" "${common[@]}" --set train.device='"cuda"' \
      --set log.dir="$vdir/gpu" >"$vdir/gpu.log" 2>&1 || true
  if grep -q "the GPU backend .* cannot be loaded\|lacks the symbols\|other sources than this trident" "$vdir/gpu.log"; then
    ok=0; echo "gpu_pack.sh: verify: the GPU backend module did not load:" >&2; tail -3 "$vdir/gpu.log" >&2
  fi
  for b in "$vbin"/test_cuda_* "$vbin/gpu_gemm_ceiling" "$vbin/gpu_attention"; do
    [[ -x $b ]] || continue
    launch=()
    [[ $(basename "$b") =~ _np([0-9]+)$ ]] && launch=("$vbin/mpiexec" -launcher fork -n "${BASH_REMATCH[1]}")
    # Exit 77: every case skipped (no GPU here; mpi_gtest_main's SKIP_RETURN_CODE): it ran.
    vrc=0
    "${run_env[@]}" timeout 120 "${launch[@]}" "$b" >"$vdir/$(basename "$b").log" 2>&1 || vrc=$?
    [[ $vrc == 0 || $vrc == 77 ]] ||
      { ok=0; echo "gpu_pack.sh: verify: $(basename "$b") failed (rc $vrc; log: $vdir/$(basename "$b").log)" >&2; }
  done
  # Every object the dynamic loader initialised (dlopen included), from outside gpu_pack/lib.
  outside=$(grep -h "calling init:" "$vdir"/ld/trace.* 2>/dev/null | awk '{print $NF}' | sort -u |
            grep -v -e "^$pack/lib/" -e "^$vdir/xzlib/" -e "^$vdir/lib/" | while read -r p; do
              n=$(basename "$p"); [[ $n =~ $excluded_re ]] || echo "$p"; done)
  loaded=$(grep -h "calling init:" "$vdir"/ld/trace.* 2>/dev/null | awk '{print $NF}' | sort -u | wc -l)
  if [[ -n $outside ]]; then
    ok=0
    echo "gpu_pack.sh: verify: loaded from outside gpu_pack/lib and not in the image's expected set:" >&2
    echo "$outside" | sed 's/^/    /' >&2
  fi
  if [[ $ok == 1 ]]; then
    note "verify: ok ($loaded distinct libraries loaded; logs in $vdir)"
    echo "verify: ok here (CPU run, mpiexec -n 2 TP 2 run, test binaries; LD_DEBUG: $loaded libraries, none from outside gpu_pack/lib except the image's expected set)" >>"$pack/MANIFEST.txt"
  else
    echo "gpu_pack.sh: verify FAILED (logs in $vdir); the pack is written but may not run there" >&2
    echo "verify: FAILED here (see $vdir)" >>"$pack/MANIFEST.txt"
    exit 1
  fi
fi

echo "gpu_pack: $pack, ${size_mib} MiB: $(ls "$pack/bin" | tr '\n' ' ')"
echo "          $(ls "$pack/lib" | wc -l) libraries; data: $(ls "$pack/data" | tr '\n' ' ')"
echo "next: the device tool's run with carry [\"gpu_pack\"] and command 'bash bench/gpu_check.sh'"
