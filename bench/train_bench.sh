#!/usr/bin/env bash
# Trident single-rank training-step benchmark, against two references, in one run.
#
# For each thread count (default 1 2) and shape (default small 124m) it measures
#   sgemm   the sgemm ceiling on those threads: the best GFLOP/s of large square sgemm over
#           every GEMM on the machine (bench_sgemm: the OpenBLAS kernel Trident runs, the
#           other OpenBLAS kernels the core can run, and BLIS, oneDNN and MKL where installed;
#           once per thread count, it does not depend on shape); the linked one is kept too
#   trident tokens/s of `trident train` (median over the logged steps after the first 2)
#   pytorch tokens/s of the same GPT-2 in PyTorch (bench/torch_gpt.py, fp32, AdamW)
# and prints a table with Trident/PyTorch tokens/s (target >= 1.25 against a current PyTorch)
# and Trident GFLOP/s / sgemm ceiling (target >= 0.85 on the 124m shape).
#
# Shapes:  124m  12 layers, 12 heads, width 768, vocab 50304, seq 1024, micro-batch 1
#          small  4 layers,  4 heads, width 256, vocab 50304, seq  256, micro-batch 4
#
# FLOPs per training step (Trident and PyTorch alike; the docs use the same formula):
#   total = 3 * tokens * (L*(24*C^2 + 4*T*C) + 2*C*V),  tokens = micro_batch * T
#   forward, per token and layer: 2*(3C*C + C*C + 4C*C + 4C*C) = 24*C^2 for the four linear
#   layers (qkv, attention out, MLP up, MLP down) plus 2*2*T*C for Q.K^T and A.V counted over
#   the full T x T (no causal discount); 2*C*V for the LM head; backward = 2 x forward.
#   Embeddings, layer norms, softmax, GELU, loss and optimizer are not counted.
#   GFLOP/s = tokens_per_s * total / tokens * 1e-9.
#   124m: 8.75e11 FLOP per step (1024 tokens); small: 1.02e11 FLOP per step (1024 tokens).
#
# Usage: bench/train_bench.sh [options]            (from anywhere; runs in the repo root)
#   --threads "1 2"      thread counts
#   --shapes "small 124m"
#   --precisions "fp32"  fp32 and/or bf16: a bf16 row runs Trident with train.precision =
#                        "bf16" (docs/gemm.md "bf16 on the CPU") beside PyTorch under
#                        torch.autocast(bfloat16) (bench/torch_gpt.py --dtype bf16), and its
#                        ceiling is the better of the sgemm ceiling and the bf16 GEMM's
#                        (bench_sgemm --bf16 on 2048^3, operands rounded beforehand): what the
#                        core can multiply bf16 operands at, by either engine
#   --out DIR            work/output directory (default build-bench/bench-run)
#   --rounds N           run everything N times (default 2; DIR/round-K each) and report each
#                        cell's best: the fastest Trident, the fastest PyTorch and the highest
#                        ceiling over the rounds, side by side with every round's figures.
#                        The VMs this runs on change speed by 10-40 % within minutes, so one
#                        run of a side can land in a slow spell; the best of N of each side is
#                        the machine undisturbed for both alike. --rounds 1: one run, as before.
#   --no-build           skip cmake/ninja (use the binaries already in build-bench)
#   --no-deps            skip scripts/install_deps.sh --bench
#   --no-trident         references only (sgemm + PyTorch); exit 0 without Trident
#   --torch WHICH        the PyTorch to compare against (default venv):
#                          venv    a current PyTorch from PyPI in a virtual environment,
#                                  build-bench/torch-venv (TORCH_VENV=dir), installed there by
#                                  this script when missing (pip install $TORCH_PIP_SPEC numpy,
#                                  default spec "torch"; see bench/README.md for its size)
#                          system  Debian's python3-torch (1.13) run by /usr/bin/python3
#                                  (installed by scripts/install_deps.sh --bench)
#                          PATH    that Python interpreter, which must import torch
# Environment knobs (steps; defaults keep a round within ~8 minutes on 2 cores):
#   TRIDENT_STEPS_SMALL=8 TRIDENT_STEPS_124M=5   (the first 2 logged steps are dropped)
#   TORCH_WARMUP_SMALL=2 TORCH_STEPS_SMALL=5 TORCH_WARMUP_124M=1 TORCH_STEPS_124M=3
#   TORCH_MALLOC=tuned|default (glibc malloc settings for PyTorch; see below; default tuned)
#   TRIDENT_TIMEOUT=900 (seconds per Trident run)
#   GEMM_LIBS="PATH:API ..." more libraries for the ceiling (API cblas or dnnl; bench_sgemm --lib)
#   TRIDENT=path (default build-bench/app/trident)   TRIDENT_CONFIG=path (default configs/tiny.toml)
# Output: the table on stdout; DIR/results.jsonl (one JSON object per thread/shape),
# DIR/table.md (the same table in Markdown), DIR/logs/* (every run's output).
# Exit status: 0 when every run worked; 1 when Trident (or a reference) failed: the table
# is still printed, with FAIL in the failed cells and the log to read.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
build="$repo/build-bench"

threads_list="1 2"
shapes_list="small 124m"
precisions_list="fp32"
out="$repo/build-bench/bench-run"
do_build=1 do_deps=1 do_trident=1
rounds=2
torch_choice=venv
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) threads_list="$2"; shift 2 ;;
    --shapes) shapes_list="$2"; shift 2 ;;
    --precisions) precisions_list="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --no-deps) do_deps=0; shift ;;
    --no-trident) do_trident=0; shift ;;
    --torch) torch_choice="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "train_bench.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

TRIDENT_STEPS_SMALL=${TRIDENT_STEPS_SMALL:-8}
TRIDENT_STEPS_124M=${TRIDENT_STEPS_124M:-5}
TORCH_WARMUP_SMALL=${TORCH_WARMUP_SMALL:-2}
TORCH_STEPS_SMALL=${TORCH_STEPS_SMALL:-5}
TORCH_WARMUP_124M=${TORCH_WARMUP_124M:-1}
TORCH_STEPS_124M=${TORCH_STEPS_124M:-3}
TRIDENT_TIMEOUT=${TRIDENT_TIMEOUT:-900}

trident=${TRIDENT:-$build/app/trident}   # TRIDENT=path overrides (e.g. another build)
sgemm="$build/bench/bench_sgemm"
config=${TRIDENT_CONFIG:-$repo/configs/tiny.toml}

die() { echo "train_bench.sh: error: $*" >&2; exit 1; }
note() { echo "== $*" >&2; }

# The table of DIR/results.jsonl on stdout, and as Markdown in DIR/table.md: one round's
# results, or (rows with per_round) each cell's best over the rounds with every round's
# figures beside it. Standard library only.
print_table() {
  python3 - "$1/results.jsonl" "$1/table.md" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def f(x, nd=1):
    return "—" if x is None else f"{x:.{nd}f}"
def ratio(x, target):  # three decimals where two would round across the target
    if x is None:
        return "—"
    shown = f"{x:.2f}"
    if (float(shown) >= target) != (x >= target):
        shown = f"{x:.3f}"
    return f"{shown} {'ok' if x >= target else 'BELOW'}"
def each(r, key):  # that key in every round, "a/b/..."
    return "/".join("-" if p.get(key) is None else f"{p[key]:.1f}" for p in r["per_round"])
rounds = any("per_round" in r for r in rows)
hdr = ["threads", "shape", "precision", "best sgemm GF/s", "Trident tok/s", "Trident GF/s",
       "PyTorch tok/s", "PyTorch GF/s", "Trident/PyTorch (≥1.25)", "Trident/sgemm (≥0.85)"]
if rounds:
    hdr += ["rounds: Trident", "PyTorch", "sgemm"]
body = []
for r in rows:
    st = r["trident_status"]
    tr_tok = f(r["trident_tokens_per_s"]) if st == "ok" else ("skipped" if st == "skipped" else "FAIL")
    tr_gf = f(r["trident_gflops"]) if st == "ok" else tr_tok
    b = [str(r["threads"]), r["shape"], r.get("precision", "fp32"), f(r["sgemm_gflops"]), tr_tok, tr_gf,
         f(r["pytorch_tokens_per_s"]), f(r["pytorch_gflops"]),
         ratio(r["ratio_trident_pytorch"], 1.25), ratio(r["ratio_trident_sgemm"], 0.85)]
    if rounds:
        b += [each(r, "trident_tokens_per_s"), each(r, "pytorch_tokens_per_s"),
              each(r, "sgemm_gflops")]
    body.append(b)
if not body:
    sys.exit("train_bench.sh: no results in " + sys.argv[1])
w = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(hdr)]
line = lambda cells: "  ".join(c.rjust(w[i]) for i, c in enumerate(cells))
print(line(hdr)); print(line(["-" * x for x in w]))
for b in body: print(line(b))
with open(sys.argv[2], "w") as md:
    md.write("| " + " | ".join(hdr) + " |\n|" + "|".join("---:" for _ in hdr) + "|\n")
    for b in body: md.write("| " + " | ".join(b) + " |\n")
EOF
}

for t in $threads_list; do [[ $t =~ ^[1-9][0-9]*$ ]] || die "bad thread count '$t'"; done
for s in $shapes_list; do [[ $s == small || $s == 124m ]] || die "unknown shape '$s' (small, 124m)"; done
for p in $precisions_list; do [[ $p == fp32 || $p == bf16 ]] || die "unknown precision '$p' (fp32, bf16)"; done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "--rounds '$rounds' must be a whole number >= 1"

# ---------------------------------------------------------------- rounds
# N rounds: this script once per round (--rounds 1, into DIR/round-K; the build and the
# dependencies in the first round only), then each cell's best over the rounds.
if [[ $rounds -gt 1 ]]; then
  mkdir -p "$out"
  pass=(--threads "$threads_list" --shapes "$shapes_list" --precisions "$precisions_list"
        --torch "$torch_choice")
  [[ $do_trident == 1 ]] || pass+=(--no-trident)
  rounds_rc=0
  for ((k = 1; k <= rounds; k++)); do
    flags=()
    if [[ $k -gt 1 || $do_build == 0 ]]; then flags+=(--no-build); fi
    if [[ $k -gt 1 || $do_deps == 0 ]]; then flags+=(--no-deps); fi
    note "round $k of $rounds: bench/train_bench.sh ${pass[*]} ${flags[*]} --rounds 1 --out $out/round-$k"
    bash "$repo/bench/train_bench.sh" "${pass[@]}" "${flags[@]}" --rounds 1 --out "$out/round-$k" ||
      rounds_rc=1
  done
  echo
  echo "best of $rounds rounds (each side's fastest run, the highest ceiling):"
  python3 - "$out" "$rounds" <<'EOF' || die "combining the rounds failed"
import json, os, sys
out, rounds = sys.argv[1], int(sys.argv[2])
cells = {}  # (threads, shape) -> that cell's result of every round, in round order
for k in range(1, rounds + 1):
    path = os.path.join(out, "round-%d" % k, "results.jsonl")
    rows = [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []
    for r in rows:
        cells.setdefault((r["threads"], r["shape"], r.get("precision", "fp32")), []).append(r)
def best(rs, key):
    vals = [r.get(key) for r in rs if r.get(key) is not None]
    return max(vals) if vals else None
with open(os.path.join(out, "results.jsonl"), "w") as f:
    for (t, shape, precision), rs in cells.items():
        flops, tokens = rs[0]["flops_per_step"], rs[0]["tokens_per_step"]
        ok = [r for r in rs if r["trident_status"] == "ok"]
        tr = best(ok, "trident_tokens_per_s")
        pt, sg = best(rs, "pytorch_tokens_per_s"), best(rs, "sgemm_gflops")
        gf = lambda tps: None if tps is None else tps * flops / tokens * 1e-9
        m = {"threads": t, "shape": shape, "precision": precision, "rounds": len(rs),
             "trident_rounds_ok": len(ok),
             "trident_status": "ok" if ok else rs[0]["trident_status"],
             "flops_per_step": flops, "tokens_per_step": tokens,
             "sgemm_gflops": sg, "trident_tokens_per_s": tr, "trident_gflops": gf(tr),
             "pytorch_tokens_per_s": pt, "pytorch_gflops": gf(pt),
             "ratio_trident_pytorch": tr / pt if tr and pt else None,
             "ratio_trident_sgemm": gf(tr) / sg if tr and sg else None,
             "per_round": [{k: r.get(k) for k in ("trident_tokens_per_s", "pytorch_tokens_per_s",
                                                  "sgemm_gflops", "trident_status")} for r in rs]}
        f.write(json.dumps(m) + "\n")
EOF
  print_table "$out" || die "the table of the rounds failed"
  echo
  echo "results: $out/results.jsonl   table (Markdown): $out/table.md   rounds: $out/round-*/"
  exit $rounds_rc
fi

# ---------------------------------------------------------------- dependencies and build
if [[ $do_deps == 1 ]]; then
  deps_flag=""
  [[ $torch_choice == system ]] && deps_flag=--bench   # Debian's python3-torch
  note "dependencies: scripts/install_deps.sh $deps_flag"
  scripts/install_deps.sh $deps_flag || die "scripts/install_deps.sh $deps_flag failed"
fi
# PYTHON: the interpreter with torch; it also writes the data and the table (numpy, stdlib).
case "$torch_choice" in
  system) PYTHON=/usr/bin/python3 ;;
  venv)
    venv=${TORCH_VENV:-$build/torch-venv}
    PYTHON="$venv/bin/python"
    if ! "$PYTHON" -c "import torch, numpy" 2>/dev/null; then
      [[ $do_deps == 1 ]] || die "$venv has no torch and --no-deps was given"
      note "PyTorch: python3 -m venv $venv; pip install ${TORCH_PIP_SPEC:-torch} numpy (PyPI)"
      python3 -m venv "$venv" || die "python3 -m venv $venv failed"
      "$venv/bin/pip" install --quiet ${TORCH_PIP_SPEC:-torch} numpy ||
        die "pip install ${TORCH_PIP_SPEC:-torch} numpy into $venv failed"
    fi ;;
  *) PYTHON="$torch_choice"
     [[ -x $PYTHON ]] || die "--torch '$torch_choice': not system, venv or an executable Python" ;;
esac
"$PYTHON" -c "import torch, numpy" 2>/dev/null ||
  die "$PYTHON cannot import torch and numpy (--torch $torch_choice)"
note "PyTorch: $("$PYTHON" -c 'import torch; print(torch.__version__, torch.__file__)')"

trident_build_ok=1
if [[ $do_build == 1 ]]; then
  note "build: cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release; ninja bench_sgemm trident"
  mkdir -p "$build"
  if [[ -f $build/CMakeCache.txt ]]; then
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >"$build/bench-cmake.log" 2>&1 ||
      { cat "$build/bench-cmake.log" >&2; die "cmake configure failed"; }
  else
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$build/bench-cmake.log" 2>&1 ||
      { cat "$build/bench-cmake.log" >&2; die "cmake configure failed"; }
  fi
  cmake --build "$build" --target bench_sgemm || die "building bench_sgemm failed"
  if [[ $do_trident == 1 ]]; then
    if ! cmake --build "$build" --target trident >"$build/bench-trident-build.log" 2>&1; then
      tail -30 "$build/bench-trident-build.log" >&2
      echo "train_bench.sh: TRIDENT BUILD FAILED (full log: $build/bench-trident-build.log);" \
           "measuring the references only, then exiting 1" >&2
      trident_build_ok=0
    fi
  fi
fi
[[ -x $sgemm ]] || die "$sgemm missing (build it: cmake --build build-bench --target bench_sgemm)"

# ---------------------------------------------------------------- synthetic data
mkdir -p "$out/logs"
shard="$out/random_tokens.bin"
if [[ ! -f $shard ]]; then
  note "data: $shard (llm.c format, 1M random tokens < 50304)"
  "$PYTHON" - "$shard" <<'EOF'
import sys, numpy as np
n = 1 << 20                                   # 1M tokens: far more than any run reads
hdr = np.zeros(256, dtype=np.int32)
hdr[0], hdr[1], hdr[2] = 20240520, 1, n       # magic, version, token count
tok = np.random.default_rng(1234).integers(0, 50304, size=n, dtype=np.uint16)
with open(sys.argv[1] + ".tmp", "wb") as f:
    f.write(hdr.tobytes()); f.write(tok.tobytes())
import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
EOF
fi

# ---------------------------------------------------------------- runs
shape_args() {  # layers heads width vocab seq batch
  case "$1" in
    124m) echo "12 12 768 50304 1024 1" ;;
    small) echo "4 4 256 50304 256 4" ;;
  esac
}
# PyTorch 1.13 on CPU has no caching allocator: every step mallocs and frees its activations,
# and glibc serves blocks over 32 MiB (logits: tokens x 50304 x 4 B = 206 MB) with fresh
# mmap()s, so the default run spends a large share of each step in page faults (measured:
# a fifth to a third of the small-shape step). Trident allocates once; to compare like with like, PyTorch
# runs by default with glibc told never to mmap or trim (TORCH_MALLOC=tuned). TORCH_MALLOC=default
# runs it as installed.
TORCH_MALLOC=${TORCH_MALLOC:-tuned}
case "$TORCH_MALLOC" in
  tuned) torch_malloc_env=(MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1099511627776 MALLOC_TOP_PAD_=268435456) ;;
  default) torch_malloc_env=() ;;
  *) die "TORCH_MALLOC must be 'tuned' or 'default'" ;;
esac

# ---------------------------------------------------------------- GEMMs for the ceiling
# The ceiling is the best sgemm on this machine, not only the linked one: each candidate is
# bench_sgemm (with an OpenBLAS kernel forced, or another library loaded) on 2048^3. The linked
# one is what Trident runs (oneDNN unless TRIDENT_SGEMM=openblas is set: docs/gemm.md).
cand_labels=() cand_cmds=()
add_cand() { cand_labels+=("$1"); cand_cmds+=("$2"); }
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has_flags() { for f in "$@"; do [[ $cpu_flags == *" $f "* ]] || return 1; done; }
if has_flags avx512f avx512bw avx512dq avx512vl; then
  add_cand "OpenBLAS SkylakeX" "TRIDENT_SGEMM=openblas OPENBLAS_CORETYPE=SkylakeX $sgemm"
  add_cand "OpenBLAS Cooperlake" "TRIDENT_SGEMM=openblas OPENBLAS_CORETYPE=Cooperlake $sgemm"
fi
if has_flags avx2 fma; then
  add_cand "OpenBLAS Haswell" "TRIDENT_SGEMM=openblas OPENBLAS_CORETYPE=Haswell $sgemm"
  add_cand "OpenBLAS Zen" "TRIDENT_SGEMM=openblas OPENBLAS_CORETYPE=Zen $sgemm"
fi
for lib in /usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4 /usr/lib/x86_64-linux-gnu/libblis.so.4; do
  [[ -f $lib ]] && { add_cand "BLIS" "$sgemm --lib $lib"; break; }
done
lib=/usr/lib/x86_64-linux-gnu/libdnnl.so.2
[[ -f $lib ]] && add_cand "oneDNN" "$sgemm --lib $lib --api dnnl"
# MKL from PyPI in the PyTorch environment ("pip install mkl" there), GNU OpenMP threading.
lib=$(ls "$(dirname "$PYTHON")"/../lib/libmkl_rt.so* 2>/dev/null | head -1 || true)
[[ -n $lib ]] && add_cand "MKL" "LD_LIBRARY_PATH=$(dirname "$lib") MKL_THREADING_LAYER=GNU $sgemm --lib $lib"
for g in ${GEMM_LIBS:-}; do add_cand "$(basename "${g%:*}")" "$sgemm --lib ${g%:*} --api ${g##*:}"; done

results="$out/results.jsonl"
: >"$results"
failed=()

read -r load1 _ </proc/loadavg
note "load average before the runs: $load1 (anything near or above 0.5 on 2 cores makes numbers noisy)"
[[ -n ${OPENBLAS_CORETYPE:-} ]] &&
  note "OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE is set: Trident and the linked sgemm run that kernel" \
       "(docs/gemm.md); unset it to measure the kernel Trident picks"

for t in $threads_list; do
  export OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t MKL_NUM_THREADS=$t
  note "threads=$t: sgemm ceiling"
  sg_log="$out/logs/sgemm-t$t.json"
  if ! "$sgemm" --threads "$t" --reps 5 >"$sg_log" 2>"$out/logs/sgemm-t$t.err"; then
    echo "train_bench.sh: bench_sgemm --threads $t FAILED (see $out/logs/sgemm-t$t.err)" >&2
    failed+=("sgemm t=$t"); echo '{}' >"$sg_log"
  fi
  cand_logs=()
  for i in "${!cand_labels[@]}"; do
    note "threads=$t: sgemm ceiling of ${cand_labels[$i]}"
    cl="$out/logs/sgemm-cand$i-t$t.json"
    # shellcheck disable=SC2086  # the candidate's command is words: VAR=value ... binary
    env -u OPENBLAS_CORETYPE ${cand_cmds[$i]} --threads "$t" --reps 5 --shapes 2048x2048x2048 \
      >"$cl" 2>"$out/logs/sgemm-cand$i-t$t.err" || echo '{}' >"$cl"
    cand_logs+=("${cand_labels[$i]}=$cl")
  done
  # The best of the linked sgemm and every candidate: the ceiling the table uses.
  sg_best="$out/logs/sgemm-best-t$t.json"
  "$PYTHON" - "$sg_log" "${cand_logs[@]}" >"$sg_best" <<'EOF'
import json, sys
def load(p):
    try:
        return json.loads(open(p).read().strip().splitlines()[-1])
    except Exception:
        return {}
linked = load(sys.argv[1])
best = {"ceiling_gflops": linked.get("ceiling_gflops"), "ceiling_shape": linked.get("ceiling_shape"),
        "library": "linked: " + linked.get("library", "?"),
        "linked_gflops": linked.get("ceiling_gflops"), "candidates": {}}
for arg in sys.argv[2:]:
    label, path = arg.split("=", 1)
    c = load(path)
    best["candidates"][label] = c.get("ceiling_gflops")
    if c.get("ceiling_gflops") is not None and (best["ceiling_gflops"] is None or
                                                c["ceiling_gflops"] > best["ceiling_gflops"]):
        best.update(ceiling_gflops=c["ceiling_gflops"], ceiling_shape=c.get("ceiling_shape"),
                    library=label)
print(json.dumps(best))
EOF
  # The bf16 GEMM's ceiling (bf16 rows only): oneDNN's bf16 matmul on operands rounded once.
  bf16_log="$out/logs/bf16-gemm-t$t.json"
  echo '{}' >"$bf16_log"
  if [[ " $precisions_list " == *" bf16 "* ]]; then
    note "threads=$t: bf16 GEMM ceiling"
    "$sgemm" --bf16 --threads "$t" --reps 5 --shapes 2048x2048x2048 >"$bf16_log" \
      2>"$out/logs/bf16-gemm-t$t.err" || echo '{}' >"$bf16_log"
  fi

  for shape in $shapes_list; do
  for prec in $precisions_list; do
    tag=$shape-t$t
    [[ $prec == fp32 ]] || tag=$shape-$prec-t$t
    read -r L H C V T B <<<"$(shape_args "$shape")"
    if [[ $shape == 124m ]]; then
      tsteps=$TRIDENT_STEPS_124M pw=$TORCH_WARMUP_124M ps=$TORCH_STEPS_124M
    else
      tsteps=$TRIDENT_STEPS_SMALL pw=$TORCH_WARMUP_SMALL ps=$TORCH_STEPS_SMALL
    fi

    # -- Trident
    tr_dir="$out/trident-$tag"
    tr_log="$out/logs/trident-$tag.log"
    tr_status=skipped
    if [[ $do_trident == 1 ]]; then
      tr_status=failed
      rm -rf "$tr_dir"
      if [[ $trident_build_ok == 0 ]]; then
        echo "trident was not built (see $build/bench-trident-build.log)" >"$tr_log"
      elif [[ ! -x $trident ]]; then
        echo "$trident missing (build: cmake --build build-bench --target trident)" >"$tr_log"
      elif [[ ! -f $config ]]; then
        echo "$config missing" >"$tr_log"
      else
        note "threads=$t shape=$shape precision=$prec: trident ($tsteps steps)"
        if timeout "$TRIDENT_TIMEOUT" "$trident" train --config "$config" \
            --set model.layers="$L" --set model.heads="$H" --set model.width="$C" \
            --set model.vocab_size="$V" --set model.seq_len="$T" \
            --set train.micro_batch="$B" --set train.global_batch="$B" \
            --set train.threads="$t" --set train.steps="$tsteps" \
            --set train.precision="\"$prec\"" \
            --set optim.warmup_steps=0 --set eval.interval=0 \
            --set data.train="$shard" --set data.val="$shard" \
            --set log.dir="$tr_dir" --set log.interval=1 >"$tr_log" 2>&1; then
          tr_status=ok
          grep '^gemm: ' "$tr_log" >&2 || true   # the GEMM Trident ran on (bf16: its engine)
        else
          rc=$?
          if [[ $rc == 124 ]]; then
            echo "[train_bench.sh: trident timed out after ${TRIDENT_TIMEOUT}s (TRIDENT_TIMEOUT)]" >>"$tr_log"
          else
            echo "[train_bench.sh: trident exited with status $rc]" >>"$tr_log"
          fi
        fi
      fi
      if [[ $tr_status != ok ]]; then
        echo "train_bench.sh: TRIDENT FAILED (threads=$t shape=$shape precision=$prec); last lines of $tr_log:" >&2
        tail -15 "$tr_log" | sed 's/^/    /' >&2
        failed+=("trident $shape $prec t=$t")
      fi
    fi

    # -- PyTorch (thread variables set in its environment before torch is imported)
    note "threads=$t shape=$shape precision=$prec: pytorch ($pw warm-up + $ps timed steps)"
    pt_log="$out/logs/pytorch-$tag.json"
    if ! env "${torch_malloc_env[@]}" "$PYTHON" bench/torch_gpt.py --layers "$L" --heads "$H" --width "$C" --vocab "$V" \
        --seq "$T" --batch "$B" --threads "$t" --warmup "$pw" --steps "$ps" --dtype "$prec" \
        >"$pt_log" 2>"$out/logs/pytorch-$tag.err"; then
      echo "train_bench.sh: PYTORCH FAILED (threads=$t shape=$shape precision=$prec; see $out/logs/pytorch-$tag.err)" >&2
      failed+=("pytorch $shape $prec t=$t"); echo '{}' >"$pt_log"
    fi

    # -- combine
    combine_rc=0
    "$PYTHON" - "$t" "$shape" "$L" "$C" "$V" "$T" "$B" "$sg_best" "$tr_status" \
        "$tr_dir/metrics.jsonl" "$tr_log" "$pt_log" "$tsteps" "$TORCH_MALLOC" "$prec" "$bf16_log" \
        >>"$results" <<'EOF' || combine_rc=$?
import json, statistics, sys
t, shape, L, C, V, T, B = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:8])
sg_log, tr_status, metrics, tr_log, pt_log, tsteps, torch_malloc, prec, bf16_log = sys.argv[8:17]
tokens = B * T
flops = 3 * tokens * (L * (24 * C * C + 4 * T * C) + 2 * C * V)
def load(p):
    try:
        with open(p) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except Exception:
        return {}
sg, pt, bf = load(sg_log), load(pt_log), load(bf16_log)
bf16_gemm = max((x.get("bf16_rounded_gflops") or 0 for x in bf.get("shapes", [])), default=0) or None
if prec == "bf16" and bf16_gemm and (sg.get("ceiling_gflops") or 0) < bf16_gemm:
    sg = dict(sg, ceiling_gflops=bf16_gemm, ceiling_shape="2048x2048x2048",
              library="bf16: " + bf.get("bf16", "?"))
r = {"threads": int(t), "shape": shape, "precision": prec, "bf16_gemm_gflops": bf16_gemm,
     "tokens_per_step": tokens, "flops_per_step": flops,
     "sgemm_gflops": sg.get("ceiling_gflops"), "sgemm_shape": sg.get("ceiling_shape"),
     "sgemm_library": sg.get("library"), "sgemm_linked_gflops": sg.get("linked_gflops"),
     "sgemm_candidates": sg.get("candidates"),
     "trident_status": tr_status, "trident_log": tr_log,
     "trident_tokens_per_s": None, "trident_gflops": None, "trident_steps_used": 0,
     "pytorch_tokens_per_s": pt.get("tokens_per_s"), "pytorch_gflops": pt.get("gflops"),
     "pytorch_step_s": pt.get("step_s_median"), "pytorch_malloc": torch_malloc}
if tr_status == "ok":
    rows = []
    try:
        with open(metrics) as f:
            rows = [json.loads(l) for l in f if l.strip()]
    except Exception as e:
        r["trident_status"] = f"failed: cannot read {metrics}: {e}"
    rows = [x for x in rows if "tokens_per_s" in x]
    rows.sort(key=lambda x: x.get("step", 0))
    timed = rows[2:]                       # the first 2 logged steps are warm-up
    if rows and not timed:
        timed = rows[-1:]
        r["trident_note"] = f"only {len(rows)} logged steps; used the last"
    if timed:
        tps = statistics.median(float(x["tokens_per_s"]) for x in timed)
        r["trident_tokens_per_s"] = round(tps, 2)
        r["trident_gflops"] = round(tps * flops / tokens * 1e-9, 2)
        r["trident_steps_used"] = len(timed)
        g = [float(x.get("gflops", x.get("gflops_per_rank"))) for x in timed
             if x.get("gflops", x.get("gflops_per_rank")) is not None]
        if g:
            r["trident_reported_gflops"] = round(statistics.median(g), 2)
        r["trident_loss_last"] = rows[-1].get("loss")
    elif r["trident_status"] == "ok":
        r["trident_status"] = f"failed: no step with tokens_per_s in {metrics}"
tr, ptk, sgf = r["trident_tokens_per_s"], r["pytorch_tokens_per_s"], r["sgemm_gflops"]
r["ratio_trident_pytorch"] = round(tr / ptk, 3) if tr and ptk else None
r["ratio_trident_sgemm"] = round(r["trident_gflops"] / sgf, 3) if tr and sgf else None
print(json.dumps(r))
sys.exit(3 if tr_status == "ok" and r["trident_status"] != "ok" else 0)
EOF
    if [[ $combine_rc == 3 ]]; then
      echo "train_bench.sh: TRIDENT FAILED (threads=$t shape=$shape precision=$prec): it exited 0 but" \
           "$tr_dir/metrics.jsonl has no usable tokens_per_s (see $results)" >&2
      failed+=("trident-metrics $shape t=$t")
    elif [[ $combine_rc != 0 ]]; then
      die "combining the results failed (threads=$t shape=$shape precision=$prec)"
    fi
  done
  done
done

# ---------------------------------------------------------------- table
print_table "$out" || die "the table failed"
echo
echo "results: $results   table (Markdown): $out/table.md   logs: $out/logs/"
read -r load1 _ </proc/loadavg
note "load average after the runs: $load1"

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "train_bench.sh: FAILED: ${failed[*]} (logs above and in $out/logs/)" >&2
  exit 1
fi
