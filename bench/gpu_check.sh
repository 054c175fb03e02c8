#!/usr/bin/env bash
# The one-shot GPU check of the CUDA trainer, run ON the device machine (one H200) from the
# repository root, with gpu_pack/ (bench/gpu_pack.sh) carried beside the working tree:
#
#   bash bench/gpu_check.sh
#
#   a. the GPU (nvidia-smi), the library path (gpu_pack/lib + the image's CUDA libraries),
#      mpiexec -n 2
#   b. the GPU unit tests: every gpu_pack/bin/test_cuda_* (the _npN ones under mpiexec -n N)
#      (context parallelism: test_cuda_context_attention, the ring kernels against the CPU's;
#      test_cuda_train_np2's GpuTrainer.ContextParallelOverMpiMatchesOneGpu, CP 2 on the 2 ranks
#      sharing the GPU over MPI vs CP 1, fp32 <= 1e-5, which skips while config.cpp's
#      check_context refuses parallel.context > 1 with train.device = "cuda"; the wgmma
#      attention: test_cuda_wgmma's probes of TMA's swizzle and of the two wgmma operand forms,
#      one assumption each, then CudaAttention.WgmmaMatchesMmaSyncAndTheCpu in test_cuda_kernels)
#   c. parity: configs/gpu_parity.toml (2 layers, width 128, seq 128, vocab 256), 10 steps,
#      train.device = cpu vs cuda fp32 (worst relative loss difference <= 1e-5) and cuda bf16
#      (<= 2e-2), and cuda bf16 vs cpu bf16 (<= 5e-3: the CPU's bf16 rounds what the GPU
#      rounds), per step, from the runs' metrics.jsonl; the same shape as a Llama
#      (model.arch = llama, grouped-query attention) cpu vs cuda fp32 (<= 1e-5)
#   d. TP 2 on 2 ranks sharing the GPU over the MPI path (parallel.comm = "mpi") vs TP 1 on the
#      GPU, fp32, 10 steps (<= 1e-5); then GPU selection by identity with ONE visible GPU per
#      rank (CUDA_VISIBLE_DEVICES=0 on both ranks, the form srun --gpus-per-task=1 gives): DP 2,
#      3 steps under parallel.comm = "mpi" must train and report the GPU "shared by ranks 0, 1"
#      with 0 NCCL communicators; the same under "nccl" must be refused at start, in seconds,
#      with the one-line error naming ranks 0 and 1 and the GPU's UUID (a real duplicate: one
#      H200). Distinct GPUs under NCCL (the usual cluster binding) need 2 GPUs: not checked here.
#   e. the cuBLAS bf16 GEMM ceiling (gpu_gemm_ceiling): best TFLOP/s
#   f. GPT-2 124M (configs/gpu_124m.toml: 12 x 768, 12 heads, vocab 50304, seq 1024), bf16,
#      micro-batch 16 (8 if 16 runs out of memory), 20 steps: tokens/s (median of the steps after
#      the first 3), TFLOP/s by bench/train_bench.sh's formula, MFU = that / the ceiling of e
#      (target >= 55%, goal 60%); then the same run with the LM head in 320-row chunks (32 MiB of
#      logits, the GPU's default before 2026-12-04), 11 steps, and the ratio of the two
#   g. the PyTorch eager reference (bench/torch_gpt.py --device cuda --dtype bf16), same shape
#      and batch: tokens/s, and Trident/PyTorch (target >= 1.35)
#   h. checkpoint resume on the GPU, fp32 and bf16: 6 steps straight vs 3 steps
#      (train.exit_interval = 3, exit 75) + --resume auto for 3 more, same layout; losses of
#      steps 1..6 bitwise equal and the final checkpoints bitwise equal (gpu_pack/bin/ckpt_compare,
#      at least one element compared)                                       [H200 est. ~35 s]
#   i. sequence parallelism: TP 2 + parallel.sequence_parallel on 2 ranks sharing the GPU
#      (comm = mpi) vs TP 1 on the GPU, fp32, 10 steps (<= 1e-5): a Llama (4 heads, 2 kv heads)
#      and the GPT-2 shape of c                                             [H200 est. ~25 s]
#   j. pipeline schedules: PP 2 (2 ranks sharing the GPU, comm = mpi) under 1f1b, interleaved
#      (virtual_stages 2) and zb-h1 vs PP 1 on the GPU, fp32, 4 layers, 4 micro-batches per
#      step, 10 steps (<= 1e-5)                                             [H200 est. ~30 s]
#   k. recomputation: train.recompute = selective and full vs none (c's runs), fp32 and bf16,
#      10 steps, losses bitwise equal                                       [H200 est. ~20 s]
#   l. generation: trident generate, greedy, 4 prompts x 48 new tokens from one fp32
#      checkpoint (h's, else a 6-step CPU run): GPU text == CPU text byte for byte, and TP 2
#      (2 ranks on the GPU, comm = mpi) == TP 1 on the GPU; sampled (temperature 1, top-k 40,
#      seed 7) GPU == CPU; the prompt loss beside it                        [H200 est. ~25 s]
#   m. mixture of experts (run right after b): gpu_pack/bin/test_cuda_moe, the CUDA MoE kernels
#      (router, losses, dispatch plan, permutation, grouped expert GEMMs) against the CPU's,
#      fp32 (rel <= 1e-4; the plan exactly equal); the whole MoE model on the GPU against the
#      CPU is GpuTrainer.MoeFp32MatchesTheCpu in b's test_cuda_train_np2   [H200 est. ~5 s]
#   n. the plan on the GPU: `trident bench-hw --device cuda` writes this GPU's hardware file
#      (the trainer's bf16 and fp32 GEMM curves, its bf16 GELU's streaming rate, the memory);
#      `trident plan` then predicts f's run (GPT-2 124M, bf16, f's micro-batch, one GPU) from it
#      and from the datasheet file configs/hardware/h200_dgx.toml (one device of it): predicted
#      against f's measured ms/step, reported                              [H200 est. ~20 s]
#   o. where f's step goes: Nsight Compute's kernel times (gpu__time_duration) of 3 steps of
#      f's run, per kernel and per step, against f's ms/step; and PyTorch's kernels for g's
#      step (torch.profiler); both tables in $OUT/kernels.txt, reported
#                                                                          [H200 est. ~90 s]
#   p. a Llama on the GPU: configs/llama_3.2_1b.toml's shapes (16 x 2048, 32 heads sharing 8
#      kv heads, SwiGLU 8192, tied head) with vocabulary 50304 (the packed random tokens), one
#      GPU, bf16, micro-batch 4 x 2048 tokens, 12 steps: tokens/s, the trainer's TFLOP/s and
#      their share of e's ceiling (target >= 65%); then ncu's kernel times of 3 steps
#      ($OUT/kernels.txt), reported                                       [H200 est. ~60 s]
#   q. attention beside PyTorch's SDPA: gpu_pack/bin/gpu_attention (Trident's bf16 kernels: the
#      default, the wgmma kernels on an H100/H200, whose out and dqkv it compares with the mma_sync
#      kernels' at the shape, <= 2e-2; and again with --kernel mma_sync beside it) and
#      bench/attention_sdpa.py (SDPA's flash and cuDNN backends) at the GPT-2 shape (B 16, 12
#      heads, T 1024, d 64: forward + backward at or under cuDNN's time) and the Llama shape
#      (B 2, T 4096, 32 query / 8 kv heads, d 128: forward >= 450 TFLOP/s); the GPT-2 shape
#      with packed documents of 256 tokens (data.document_mask), reported   [H100 est. ~40 s]
#   r. PyTorch compiled: bench/torch_gpt.py --compile at f's shape and batch (Trident /
#      compiled >= 1.0), and p's Llama shapes in PyTorch, eager and compiled (--shape llama1b),
#      beside p's tokens/s (torch.compile's first steps compile: ~1-2 min each)
#                                                                          [H100 est. ~240 s]
#   s. checkpoints: f's shape for 9 steps without saves, with a synchronous and with an
#      asynchronous save every 3 steps, against `trident plan`'s wait a save from n's measured
#      file (bench-hw measures the storage there), reported              [H100 est. ~50 s]
#   t. FP8 (train.precision = "fp8", cuBLASLt's FP8 GEMMs): e's FP8 GEMM ceiling beside its
#      bf16 one, and p's Llama 3.2 1B shapes in fp8 (current recipe, then delayed) beside p's
#      bf16 tokens/s (target >= 1.3x); the correctness rows are b's (CudaFp8.*, CudaFp8Linear,
#      GpuTrainer.Fp8TracksTheCpuReference)                               [H100 est. ~70 s]
#
# Every step runs under its own `timeout`, the whole under a budget (GPU_CHECK_BUDGET, default
# 530 s: each step's limit is cut so that the later steps keep their minimum; h-l come after
# the throughput steps, so a slow start costs them, not e-g); a failed step is reported and the
# next one runs. Output: the log on stdout, the summary table last; under $OUT
# (default build-gpu/gpu-check-out): gpu_check.md (the table), gpu_check.json (table + raw
# figures), gpu_check.log (stdout), gemm.json, gpu_measured.toml (n's hardware file),
# kernels.txt (o's and p's kernel tables, one after another), logs.tar.gz (every command's
# output, the runs' metrics.jsonl, the gtest JSON, the kernel tables). Seven files: the device
# tool brings back at most 8.
#
# Without a GPU (no nvidia-smi GPU and no /dev/nvidia0), or with --dry-run, it runs what the CPU
# can: the real CUDA commands are still tried (and fail, which is logged), and each GPU run is
# replaced by a CPU stand-in (train.device = cpu, a small shape for f and g), so the library
# path, mpiexec, the log parsing, the comparisons and the table are exercised; those rows say
# DRY when the stand-ins meet the row's target, FAIL when they do not, ERROR when nothing could
# be compared (a missing step, no generated text, no checkpoint element).
# Exit status: 0 when every row is PASS, INFO, DRY or SKIP; 1 otherwise.
#
# Options: --dry-run | --gpu (force the mode), --pack DIR (default gpu_pack), --out DIR,
#          --budget SECONDS, --steps "b c h" (a subset of b-s; a always runs)
# Environment: OUT, GPU_CHECK_BUDGET, GPU_BATCH (16), GPU_STEPS_124M (20), PYTHON (the
#          interpreter with PyTorch; default: the first of python3, /usr/bin/python3 with torch)
set -uo pipefail
ATTENTION_SET=()  # b sets train.attention_kernel = mma_sync for the runs if wgmma's test fails

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

mode=auto
PACK="$repo/gpu_pack"
OUT=${OUT:-$repo/build-gpu/gpu-check-out}
BUDGET=${GPU_CHECK_BUDGET:-530}
STEPS="a b c d e f g h i j k l m n o p q r s t"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) mode=dry; shift ;;
    --gpu) mode=gpu; shift ;;
    --pack) PACK=$(cd "$2" && pwd); shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --steps) STEPS="a $2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
LOGS="$WORK/logs"
RUNS="$WORK/runs"
mkdir -p "$LOGS" "$RUNS"
ROWS="$WORK/rows.tsv"
FACTS="$WORK/facts.json"        # raw figures, one JSON object per line
: >"$ROWS"; : >"$FACTS"
T_START=$SECONDS
DEADLINE=$((SECONDS + BUDGET))
GPU_BATCH=${GPU_BATCH:-16}
GPU_STEPS_124M=${GPU_STEPS_124M:-20}

# ---------------------------------------------------------------- helpers
say() { printf '[gpu_check %4ds] %s\n' "$((SECONDS - T_START))" "$*"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
# row STEP CHECK TARGET MEASURED VERDICT  (VERDICT: PASS FAIL ERROR INFO DRY SKIP)
row() {
  local f=("$@")
  printf '%s\t%s\t%s\t%s\t%s\n' "${f[@]//$'\t'/ }" >>"$ROWS"
  say "RESULT $1 | $2 | target: $3 | $4 | $5"
}
fact() { echo "$1" >>"$FACTS"; }
# Seconds a step may take: at most NOMINAL, leaving RESERVE seconds for the steps after it,
# but at least min(NOMINAL, 15) while the budget lasts.
limit() {
  local hard=$((DEADLINE - SECONDS)) left=$((DEADLINE - SECONDS - $2)) floor=$(($1 < 15 ? $1 : 15))
  ((left > $1)) && left=$1
  ((left < floor)) && left=$floor
  ((left > hard)) && left=$hard
  echo "$left"
}
# The last error-looking line of a log (for the table).
errline() {
  local l
  l=$(grep -v -e '^\[gpu_check' -e 'MPI_Abort' "$1" 2>/dev/null |
      grep -iE 'error|fail|terminate|what\(\)|out of memory|exception' | tail -1)
  [[ -n $l ]] || l=$(grep -v '^\[gpu_check' "$1" 2>/dev/null | grep -v '^ *$' | tail -1)
  echo "${l:0:140}"
}

PY=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import json, statistics' 2>/dev/null; then PY=$p; break; fi
done
[[ -n $PY ]] || { echo "gpu_check.sh: no python3" >&2; exit 1; }

# The parsing and the table, in one helper (standard library only).
cat >"$WORK/gc.py" <<'PYEOF'
import json, math, statistics, sys

def load_jsonl(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows

def steps_losses(path):
    out = {}
    for r in load_jsonl(path):
        if "loss" in r and "step" in r:  # a NaN loss is written as null
            out[int(r["step"])] = math.nan if r["loss"] is None else float(r["loss"])
    return out

def flops_per_token(L, C, V, T):
    # bench/train_bench.sh: 3 * (L*(24*C^2 + 4*T*C) + 2*C*V)
    return 3 * (L * (24 * C * C + 4 * T * C) + 2 * C * V)

def cmd_compare(ref, run, nsteps):
    """Worst relative loss difference |run - ref| / |ref| over the steps; prints one JSON."""
    a, b = steps_losses(ref), steps_losses(run)
    nsteps = int(nsteps)
    res = {"ref_steps": len(a), "run_steps": len(b)}
    expected = list(range(1, nsteps + 1))
    missing = [s for s in expected if s not in a or s not in b]
    if missing:
        res["error"] = (f"steps missing: reference has {sorted(a)[:3]}..({len(a)}), "
                        f"run has {sorted(b)[:3]}..({len(b)}); expected 1..{nsteps}")
        print(json.dumps(res)); return
    worst, worst_step, per = -1.0, None, []
    for s in expected:
        x, y = a[s], b[s]
        rel = abs(y - x) / max(abs(x), 1e-30) if math.isfinite(x) and math.isfinite(y) else math.inf
        per.append({"step": s, "ref": x, "run": y, "rel": rel})
        if rel > worst or not math.isfinite(rel):
            worst, worst_step = rel, s
    res.update(worst=worst, worst_step=worst_step, first=per[0]["rel"], per_step=per)
    print(json.dumps(res))

def generated_lines(path):
    """'INDEX<TAB>TEXT' lines of `trident generate --prompts` and its 'prompt loss' line."""
    texts, loss = {}, None
    with open(path, "rb") as f:
        for raw in f:
            line = raw.rstrip(b"\n")
            if line.startswith(b"prompt loss "):
                loss = float(line.split()[2]); continue
            head, tab, text = line.partition(b"\t")
            if tab and head.isdigit():
                texts[int(head)] = text
    return texts, loss

def cmd_compare_text(ref, run, prompts_file):
    """Greedy generations of two runs, prompt by prompt, byte for byte; prints one JSON.
    Every prompt must have a line in both, longer than the prompt (something generated)."""
    prompts = [l.rstrip("\n").encode() for l in open(prompts_file) if l.strip()]
    a, la = generated_lines(ref)
    b, lb = generated_lines(run)
    res = {"prompts": len(prompts), "ref_lines": len(a), "run_lines": len(b),
           "ref_prompt_loss": la, "run_prompt_loss": lb}
    if la is not None and lb is not None:
        res["prompt_loss_rel"] = abs(lb - la) / max(abs(la), 1e-30)
    short = [i for i in range(len(prompts))
             if len(a.get(i, b"")) <= len(prompts[i]) or len(b.get(i, b"")) <= len(prompts[i])]
    if not prompts or len(a) != len(prompts) or len(b) != len(prompts) or short:
        res["error"] = (f"{len(prompts)} prompts, reference has {len(a)} lines, run {len(b)}; "
                        f"prompts with nothing generated: {short}")
        print(json.dumps(res)); return
    differ, first, compared = 0, None, 0
    for i in range(len(prompts)):
        x, y = a[i], b[i]
        compared += max(len(x), len(y)) - len(prompts[i])
        if x != y:
            differ += 1
            if first is None:
                at = next((k for k in range(min(len(x), len(y))) if x[k] != y[k]), min(len(x), len(y)))
                first = {"prompt": i, "byte": at, "ref": x[at:at + 20].decode(errors="replace"),
                         "run": y[at:at + 20].decode(errors="replace")}
    res.update(generated_bytes=compared, differ=differ, first_difference=first)
    print(json.dumps(res))

def cmd_table_losses(result_json):
    r = json.loads(open(result_json).read())
    for p in r.get("per_step", []):
        print(f"    step {p['step']:3d}  ref {p['ref']:.8f}  run {p['run']:.8f}  rel {p['rel']:.3e}")

def cmd_throughput(metrics, skip, L, C, V, T, B):
    """Median tokens/s over the logged steps after the first `skip`; TFLOP/s by the formula."""
    L, C, V, T, B, skip = map(int, (L, C, V, T, B, skip))
    rows = sorted((r for r in load_jsonl(metrics) if "tokens_per_s" in r), key=lambda r: r["step"])
    res = {"steps_logged": len(rows)}
    timed = rows[skip:]
    if not timed:
        res["error"] = f"{len(rows)} logged steps, need more than {skip}"
        print(json.dumps(res)); return
    tps = statistics.median(float(r["tokens_per_s"]) for r in timed)
    fpt = flops_per_token(L, C, V, T)
    res.update(steps_used=len(timed), tokens_per_s=tps, flops_per_token=fpt,
               tflops=tps * fpt / 1e12,
               ms_per_step=statistics.median(float(r["ms_per_step"]) for r in timed),
               loss_first=rows[0].get("loss"), loss_last=rows[-1].get("loss"))
    g = [float(r["gflops_per_rank"]) for r in timed if r.get("gflops_per_rank") is not None]
    if g:
        res["trainer_tflops"] = statistics.median(g) / 1e3
    print(json.dumps(res))

def cmd_gemm(path):
    try:
        j = json.loads(open(path).read())
    except Exception as e:
        print(json.dumps({"error": f"cannot parse {path}: {e}"})); return
    if "skipped" in j:
        print(json.dumps({"skipped": j["skipped"]})); return
    res = j.get("results", [])
    sq = [r for r in res if r["name"].startswith("square")]
    best = max(sq or res, key=lambda r: r["tflops"]) if res else None
    print(json.dumps({"device": j.get("device"), "best_tflops": best and best["tflops"],
                      "best_name": best and best["name"],
                      "best_any_tflops": max((r["tflops"] for r in res), default=None),
                      "layer_tflops": j.get("gpt2_layer_plus_head_gemms_tflops"),
                      "layer_ms": j.get("gpt2_layer_plus_head_gemms_ms")}))

def cmd_gtest(json_path, log_path):
    """Counts from --gtest_output=json, else from the log's [ OK ] / [ FAILED ] / [ SKIPPED ]."""
    res = {}
    try:
        j = json.loads(open(json_path).read())
        tests = [t for s in j.get("testsuites", []) for t in s.get("testsuite", [])]
        failed = [f"{t['classname']}.{t['name']}" for t in tests if t.get("failures")]
        skipped = [t for t in tests if t.get("result") == "SKIPPED"]
        res = {"source": "json", "tests": len(tests), "failed": len(failed),
               "skipped": len(skipped), "passed": len(tests) - len(failed) - len(skipped),
               "failed_names": failed}
    except Exception:
        ok = fail = skip = 0
        names = set()
        try:
            for line in open(log_path, errors="replace"):
                if line.startswith("[       OK ]"): ok += 1
                elif line.startswith("[  SKIPPED ]") and "(" in line: skip += 1
                elif line.startswith("[  FAILED  ]") and "(" in line:
                    fail += 1; names.add(line.split()[3] if len(line.split()) > 3 else line)
        except OSError:
            pass
        res = {"source": "log", "tests": ok + fail + skip, "passed": ok, "failed": fail,
               "skipped": skip, "failed_names": sorted(names)}
    print(json.dumps(res))

def cmd_get(js, *keys):
    """Prints fields of a JSON object separated by \\x1f (not a whitespace character, so that
    `IFS=$'\\x1f' read` keeps empty fields); '' for a missing one."""
    try:
        j = json.loads(js)
    except Exception:
        j = {}
    vals = []
    for k in keys:
        v = j.get(k)
        vals.append("" if v is None else (f"{v:.6g}" if isinstance(v, float) else str(v)))
    print("\x1f".join(vals))

def cmd_table(rows_tsv, facts, md_path, json_path, title):
    rows = [l.rstrip("\n").split("\t") for l in open(rows_tsv) if l.strip()]
    hdr = ["step", "check", "target", "measured", "verdict"]
    # Console: measured cut at 100 characters (the figures come first; the full text is in the
    # Markdown and the JSON).
    cut = lambda t: t if len(t) <= 100 else t[:99] + "~"
    con = [r[:3] + [cut(r[3])] + r[4:] for r in rows]
    w = [max([len(h)] + [len(r[i]) for r in con]) for i, h in enumerate(hdr)]
    def line(c):
        return "  ".join(c[i].ljust(w[i]) for i in range(5)).rstrip()
    print(line(hdr)); print(line(["-" * x for x in w]))
    for r in con: print(line(r))
    with open(md_path, "w") as md:
        md.write(f"# {title}\n\n| " + " | ".join(hdr) + " |\n|---|---|---|---|---|\n")
        for r in rows:
            md.write("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |\n")
    fl = []
    for l in open(facts):
        try: fl.append(json.loads(l))
        except Exception: pass
    with open(json_path, "w") as f:
        json.dump({"title": title, "rows": [dict(zip(hdr, r)) for r in rows], "facts": fl}, f, indent=1)
    bad = [r for r in rows if r[4] not in ("PASS", "INFO", "DRY", "SKIP")]
    sys.exit(1 if bad else 0)

def cmd_kernels(csv_path, steps, step_ms, out_path):
    """`ncu --import --csv --page raw` of a run of `steps` steps: each kernel's time per step,
    largest first, into out_path; prints one JSON (kernel ms per step, GEMM and attention shares).
    Kernels whose call count is not a multiple of `steps` ran outside the steady step (weight
    init, the first step's one-off work); they are counted all the same."""
    import csv
    steps, step_ms = int(steps), float(step_ms) if step_ms else None
    scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0,
             "ms": 1.0, "second": 1e3, "s": 1e3}
    with open(csv_path, newline="") as f:
        rows = list(csv.reader(f))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head is None:
        print(json.dumps({"error": f"no 'Kernel Name' column in {csv_path}"})); return
    cols = rows[head]
    k_name, k_time = cols.index("Kernel Name"), next(
        (i for i, c in enumerate(cols) if c.startswith("gpu__time_duration")), None)
    if k_time is None:
        print(json.dumps({"error": "no gpu__time_duration column"})); return
    unit, per = "nsecond", {}
    for r in rows[head + 1:]:
        if len(r) <= max(k_name, k_time):
            continue
        v = r[k_time].replace(",", "")
        try:
            ms = float(v)
        except ValueError:
            unit = v or unit  # the units row
            continue
        ms *= scale.get(unit, 1e-6)
        t, n = per.get(r[k_name], (0.0, 0))
        per[r[k_name]] = (t + ms, n + 1)
    if not per:
        print(json.dumps({"error": "no kernel rows"})); return
    total = sum(t for t, _ in per.values()) / steps
    kind = lambda k: ("gemm" if any(w in k.lower() for w in ("gemm", "cutlass", "xmma", "nvjet",
                                                             "cublas", "sm90_", "sm80_",
                                                             "splitkreduce"))
                      else "attention" if any(w in k.lower() for w in ("attention", "attn_",
                                                                       "flash", "fmha"))
                      else "other")
    by_kind = {}
    for k, (t, _) in per.items():
        by_kind[kind(k)] = by_kind.get(kind(k), 0.0) + t / steps
    with open(out_path, "w") as f:
        f.write(f"# Trident, ncu gpu__time_duration of {steps} steps (weight init included): "
                f"{total:.3f} ms of kernels per step"
                + (f" against {step_ms:.3f} ms measured per step" if step_ms else "") + "\n")
        f.write("#   " + ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(by_kind.items())) + "\n")
        f.write("#   ms/step   share  calls/step  kernel\n")
        for k, (t, n) in sorted(per.items(), key=lambda kv: -kv[1][0]):
            f.write(f"{t / steps:11.3f}  {100 * t / steps / total:5.1f}%  {n / steps:10.2f}  {k[:160]}\n")
    top = sorted(per.items(), key=lambda kv: -kv[1][0])[:4]
    print(json.dumps({"kernel_ms_per_step": total, "step_ms": step_ms,
                      "by_kind_ms": by_kind, "kernels": len(per),
                      "kinds": ", ".join(f"{k} {v:.2f} ms" for k, v in sorted(by_kind.items())),
                      "top": "; ".join(f"{k[:40]} {t / steps:.2f} ms" for k, (t, _) in top)}))

if __name__ == "__main__":
    globals()["cmd_" + sys.argv[1]](*sys.argv[2:])
PYEOF
gc() { "$PY" "$WORK/gc.py" "$@"; }
get() { gc get "$@"; }   # get JSON KEY... -> values separated by \x1f

# The card's datasheet hardware file as one device (configs/hardware/h100_dgx.toml or
# h200_dgx.toml by nvidia-smi's name; H200's on another card), written once to
# $WORK/datasheet_one.toml; its path on stdout.
datasheet_one() {
  local f=$WORK/datasheet_one.toml src=configs/hardware/h200_dgx.toml
  if [[ ! -s $f ]]; then
    [[ ${gpu_line:-} == *H100* ]] && src=configs/hardware/h100_dgx.toml
    sed 's/^devices_per_node = .*/devices_per_node = 1/' "$src" >"$f"
  fi
  echo "$f"
}

# plan_rows STEP WHAT MEASURED_MS B CONFIG [plan options...]: `trident plan` of a one-GPU run
# (global batch = micro-batch = B) from n's measured hardware file and from the card's datasheet
# file, each as a row "plan of WHAT, <label> hardware" with the predicted ms/step beside the
# measured and the error (issue 54's target: within 10 %; reported). `--precision fp8` runs
# from the measured file need its FP8 rate: e's best FP8 GEMM (gemm.json) is added to a copy
# as device.peak_tflops_fp8 (bench-hw does not measure FP8).
plan_rows() {
  local step=$1 what=$2 measured=$3 b=$4 config=$5 label file pred err fp8=0 tag
  shift 5
  [[ " $* " == *" --precision fp8 "* ]] && fp8=1
  tag=$(echo "$what" | tr -c 'a-zA-Z0-9\n' '_')
  for src in "measured:$WORK/gpu_measured.toml" "datasheet:$(datasheet_one)"; do
    label=${src%%:*} file=${src#*:}
    if [[ $fp8 == 1 && $label == measured && -s $file ]]; then
      local best
      best=$("$PY" -c 'import json, sys; print(max(r["tflops"] for r in json.load(open(sys.argv[1]))["fp8"]))' \
          "$LOGS/gemm.json" 2>/dev/null)
      if [[ -n $best ]]; then
        sed "/^peak_tflops_bf16 = /a peak_tflops_fp8 = $best" "$file" >"$WORK/plan-$tag.toml"
        file=$WORK/plan-$tag.toml
      else
        file=""
      fi
    fi
    if [[ -z $measured || -z $file || ! -s $file ]]; then
      row "$step" "plan of $what, $label hardware: ms/step" "within 10 % (reported)" \
          "not compared (measured: ${measured:-nothing}; file: $([[ -n $file && -s $file ]] && echo yes || echo none))" \
          "$([[ $DRY == 1 ]] && echo DRY || echo SKIP)"
      continue
    fi
    tenv timeout 60 "$BIN/trident" plan --config "$config" --hardware "$file" --nodes 1 \
        --global-batch "$b" --layout "micro_batch=$b" --json --top 1 "$@" \
        >"$LOGS/plan-$tag-$label.json" 2>"$LOGS/plan-$tag-$label.err"
    pred=$("$PY" -c 'import json, sys; print("%.1f" % (json.load(open(sys.argv[1]))["best"][0]["step_seconds"] * 1e3))' \
        "$LOGS/plan-$tag-$label.json" 2>/dev/null)
    if [[ -z $pred ]]; then
      row "$step" "plan of $what, $label hardware: ms/step" "within 10 % (reported)" \
          "plan failed: $(errline "$LOGS/plan-$tag-$label.err")" ERROR
    else
      err=$("$PY" -c 'import sys; p, m = map(float, sys.argv[1:]); print("%+.1f" % (100 * (p - m) / m))' "$pred" "$measured")
      row "$step" "plan of $what, $label hardware: ms/step" "within 10 % (reported)" \
          "predicted $pred vs measured $measured ($err %)" "$([[ $DRY == 1 ]] && echo DRY || echo INFO)"
    fi
  done
}

# ncu_row STEP WHAT NAME LIMIT READY MS VS CONFIG [--set ...]: Nsight Compute's kernel times
# (gpu__time_duration) of 3 steps of `trident train --config CONFIG ...`, each kernel's time per
# step in $LOGS/NAME.txt (gathered into $OUT/kernels.txt at the end), as one row of STEP ("WHAT
# kernels per step") against the run's measured MS a step (shown as "vs VS ms"). Not run (SKIP)
# in a dry run, without ncu, or when READY is empty (the measured run it profiles did not
# happen); limit LIMIT seconds.
ncu_row() {
  local step=$1 what=$2 name=$3 nominal=$4 ready=$5 ms=$6 vs=$7 config=$8; shift 8
  local ncu t rc res kms err top
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  if [[ $DRY == 1 || -z $ncu || -z $ready ]]; then
    row "$step" "$what kernels per step (ncu)" "reported" "not run (${ncu:-no ncu}; dry run: $DRY)" SKIP
    return
  fi
  rm -rf "${RUNS:?}/ncu-$name"
  t=$(limit "$nominal" 0)
  say "ncu ($what): $ncu (limit ${t}s)"
  tenv timeout -k 10 "$t" "$ncu" --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum -f -o "$WORK/$name" \
      "$BIN/trident" train --config "$config" --set log.dir="$RUNS/ncu-$name" \
      "${ATTENTION_SET[@]}" "$@" --set train.steps=3 >"$LOGS/ncu-$name-run.log" 2>&1
  rc=$?
  "$ncu" -i "$WORK/$name.ncu-rep" --csv --page raw --print-kernel-base function \
      --print-units base >"$LOGS/ncu-$name.csv" 2>"$LOGS/ncu-$name-import.err"
  res=$(gc kernels "$LOGS/ncu-$name.csv" 3 "$ms" "$LOGS/$name.txt" 2>&1)
  fact "{\"what\": \"ncu $name\", \"rc\": $rc, \"result\": $(echo "$res" | "$PY" -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.read())))' 2>/dev/null || echo null)}"
  IFS=$'\x1f' read -r kms err top <<<"$(get "$res" kernel_ms_per_step error top)"
  if [[ -n $err || -z $kms ]]; then
    row "$step" "$what kernels per step (ncu)" "reported" "failed (rc $rc): ${err:-$res} $(errline "$LOGS/ncu-$name-run.log")" ERROR
  else
    row "$step" "$what kernels per step (ncu, 3 steps)" "reported" \
        "$kms ms of kernels per step vs $vs ms; $(get "$res" kinds); top: $top" INFO
  fi
}

main() {
say "gpu_check.sh in $repo; pack $PACK; out $OUT; work $WORK; budget ${BUDGET}s; steps: $STEPS"
[[ -d $PACK/bin ]] || { say "no $PACK/bin: run bench/gpu_pack.sh here and carry gpu_pack"; row a pack "gpu_pack/ present" "missing" ERROR; return; }
say "pack: $(head -2 "$PACK/MANIFEST.txt" 2>/dev/null | tr '\n' ' ')"

# ================================================================ a. GPU, libraries, mpiexec
have_gpu=0
gpu_line=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi >"$LOGS/nvidia-smi.txt" 2>&1
  gpu_line=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv,noheader 2>&1 | head -1)
  timeout 30 nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && have_gpu=1
elif [[ -e /dev/nvidia0 ]]; then
  have_gpu=1; gpu_line="(no nvidia-smi; /dev/nvidia0 present)"
fi
case $mode in
  auto) [[ $have_gpu == 1 ]] && mode=gpu || mode=dry ;;
esac
DRY=0; [[ $mode == dry ]] && DRY=1
say "nvidia-smi: ${gpu_line:-no GPU}"
say "mode: $mode$([[ $DRY == 1 ]] && echo ' (GPU runs replaced by CPU stand-ins; rows marked DRY)')"
cpu_model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
say "host: $(nproc) cores ($cpu_model), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
fact "$(printf '{"what": "host", "mode": "%s", "gpu": "%s", "cores": %d, "cpu": "%s"}' "$mode" "${gpu_line//\"/}" "$(nproc)" "${cpu_model//\"/}")"
row a GPU "nvidia-smi" "${gpu_line:-none}" "$([[ $have_gpu == 1 ]] && echo INFO || echo SKIP)"

# The pack: bin/ unpacked whole into $BIN, the compressed libraries (NAME.xz) into
# $WORK/xzlib, before lib/ on the path; then for every library still unresolved, the image's
# directory that holds it.
unxz_to() {  # FILE.xz DEST
  if command -v xz >/dev/null; then xz -dc "$1" >"$2"
  else "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"
  fi || say "cannot unpack $1"
}
BIN="$WORK/bin"
mkdir -p "$WORK/xzlib" "$BIN"
for f in "$PACK"/lib/*.xz; do
  [[ -f $f ]] && unxz_to "$f" "$WORK/xzlib/$(basename "$f" .xz)"
done
for f in "$PACK"/bin/*; do
  if [[ $f == *.xz ]]; then unxz_to "$f" "$BIN/$(basename "$f" .xz)"; else cp "$f" "$BIN/"; fi
done
chmod +x "$BIN"/*
# The GPU backend module, where trident looks for it: <dir of the executable>/../lib.
mkdir -p "$WORK/lib"
for f in "$PACK"/module/*; do
  [[ -f $f ]] || continue
  if [[ $f == *.xz ]]; then unxz_to "$f" "$WORK/lib/$(basename "$f" .xz)"; else cp "$f" "$WORK/lib/"; fi
done
# The image's own LD_LIBRARY_PATH (the driver's libcuda, say) stays on the path, after the pack.
LIBPATH="$WORK/xzlib:$PACK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unresolved() {
  local b
  for b in "$BIN"/* "$WORK"/lib/*.so; do
    LD_LIBRARY_PATH=$LIBPATH ldd "$b" 2>/dev/null | awk '$3 == "not" {print $1}'
  done | sort -u
}
lib_note=""
add_dir() {  # NAME DIR
  [[ ":$LIBPATH:" == *":$2:"* ]] || LIBPATH="$LIBPATH:$2"
  lib_note+="$1: $2; "
}
need=()
for name in $(unresolved); do
  found=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu \
           /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    if [[ -e $d/$name ]]; then add_dir "$name" "$d"; found=1; break; fi
  done
  [[ -n $found ]] || need+=("$name")
done
if [[ ${#need[@]} -gt 0 ]]; then
  # One search for the rest (e.g. NCCL from the Python environment's nvidia-nccl package).
  expr=(); for name in "${need[@]}"; do expr+=(-o -name "$name"); done
  timeout 60 find /usr/local /opt /usr/lib /usr/lib64 /usr/share -xdev \( "${expr[@]:1}" \) \
    2>/dev/null >"$WORK/found-libs.txt"
  for name in "${need[@]}"; do
    hit=$(grep -m1 "/$name\$" "$WORK/found-libs.txt")
    if [[ -n $hit ]]; then add_dir "$name" "$(dirname "$hit")"
    elif [[ -e $PACK/fallback/$name ]]; then add_dir "$name" "$PACK/fallback"
    fi
  done
fi
still=$(unresolved | tr '\n' ' ')
say "LD_LIBRARY_PATH for the packed binaries: $LIBPATH"
[[ -f $WORK/lib/libtrident_cuda.so ]] && LD_LIBRARY_PATH=$LIBPATH ldd "$WORK/lib/libtrident_cuda.so" 2>&1 |
  grep -E 'cuda|cublas|nccl|mpich|openblas|hdf5' | sed 's/^/    /'
if [[ -z $still ]]; then
  row a libraries "every packed binary resolves" "${lib_note:-all found in the pack or the loader cache}" PASS
else
  row a libraries "every packed binary resolves" "missing: $still" FAIL
fi
export UCX_MODULE_DIR="$PACK/lib/ucx"   # UCX's transport modules: the packed ones only
tenv() { env LD_LIBRARY_PATH="$LIBPATH" PATH="$BIN:$PATH" "$@"; }
MPIEXEC=("$BIN/mpiexec" -launcher fork)
if tenv timeout -k 5 30 "${MPIEXEC[@]}" -n 2 true >"$LOGS/mpiexec-true.log" 2>&1; then
  row a "mpiexec -n 2" "starts 2 ranks" "ok" PASS
else
  row a "mpiexec -n 2" "starts 2 ranks" "failed (rc $?): $(tail -1 "$LOGS/mpiexec-true.log")" FAIL
fi

# ================================================================ b. GPU unit tests
# gtest_row STEP BINARY LIMIT: one GoogleTest binary of the pack (under mpiexec -n N for _npN)
# as one row of STEP.
# gtest_row STEP BINARY LIMIT [FILTER LABEL]: one row for the binary's cases (those FILTER
# selects, --gtest_filter, as LABEL; logs $LOGS/LABEL.*); the verdict also in LAST_VERDICT.
gtest_row() {
  local step=$1 b=$2 t=$3 filter=${4:-} name launch t0 rc dt res measured v
  local n_tests n_pass n_fail n_skip names
  name=${5:-$(basename "$b")}
  launch=()
  [[ $(basename "$b") =~ _np([0-9]+)$ ]] && launch=("${MPIEXEC[@]}" -n "${BASH_REMATCH[1]}")
  LAST_VERDICT=ERROR
  if ((t < 10)); then row "$step" "$name" "0 failures" "not run: no time left" ERROR; return; fi
  say "$step. $name (limit ${t}s)"
  t0=$SECONDS
  tenv timeout -k 10 "$t" "${launch[@]}" "$b" ${filter:+--gtest_filter="$filter"} \
      --gtest_output="json:$LOGS/$name.json" >"$LOGS/$name.log" 2>&1
  rc=$?
  dt=$((SECONDS - t0))
  res=$(gc gtest "$LOGS/$name.json" "$LOGS/$name.log")
  fact "{\"what\": \"$name\", \"rc\": $rc, \"seconds\": $dt, \"counts\": $res}"
  IFS=$'\x1f' read -r n_tests n_pass n_fail n_skip names <<<"$(get "$res" tests passed failed skipped failed_names)"
  measured="$n_pass passed, $n_fail failed, $n_skip skipped of $n_tests (rc $rc, ${dt}s)"
  [[ $rc == 124 || $rc == 137 ]] && measured+=" TIMED OUT"
  [[ $n_fail != 0 ]] && measured+="; failed: $names"
  grep -E '^\[ (cuda|timing) \]|FAILED|Failure' "$LOGS/$name.log" | head -20 | sed 's/^/    /'
  if [[ $DRY == 1 ]]; then
    # 77: an MPI test binary whose cases all skipped (mpi_gtest_main's SKIP_RETURN_CODE).
    v=SKIP; [[ ($rc == 0 || $rc == 77) && ${n_fail:-1} == 0 ]] || v=ERROR
  elif [[ $rc == 0 && ${n_fail:-1} == 0 && ${n_tests:-0} -gt 0 && ${n_skip:-0} -lt ${n_tests:-0} ]]; then v=PASS
  else v=FAIL; fi
  LAST_VERDICT=$v  # SKIP where every case skipped cleanly (the row's verdict says FAIL there)
  [[ $rc == 0 && ${n_fail:-1} == 0 && ${n_skip:-0} -ge ${n_tests:-1} ]] && LAST_VERDICT=SKIP
  row "$step" "$name" "0 failures" "$measured" "$v"
}
if want b; then
  compgen -G "$BIN/test_cuda_*" >/dev/null || row b "test_cuda_*" "0 failures" "no test binary in the pack" ERROR
  # The Hopper attention first, each of its never-run pieces in a process of its own under a
  # short limit: a kernel fault leaves the CUDA context unusable for the rest of its process,
  # and a wait that never completes (an mbarrier) hangs until the limit. The wgmma probes, one
  # assumption each, then the kernels' own test.
  if [[ -x $BIN/test_cuda_wgmma ]]; then
    for probe in TmaWrites SharedMemoryOperands RegisterAAndMnMajorB; do
      gtest_row b "$BIN/test_cuda_wgmma" "$(limit 30 260)" "CudaWgmma.$probe*" \
          "test_cuda_wgmma ($probe)"
    done
  fi
  wgmma_ok=1
  if [[ -x $BIN/test_cuda_kernels ]]; then
    gtest_row b "$BIN/test_cuda_kernels" "$(limit 45 250)" "CudaAttention.Wgmma*" \
        "test_cuda_kernels (wgmma attention)"
    wgmma_verdict=$LAST_VERDICT
    [[ $wgmma_verdict == PASS || $wgmma_verdict == SKIP ]] || wgmma_ok=0
  fi
  for b in "$BIN"/test_cuda_*; do
    [[ -x $b ]] || continue
    case $(basename "$b") in
      test_cuda_moe) want m && continue ;;  # its own row, m
      test_cuda_wgmma) continue ;;          # above
    esac
    filter=""
    [[ $(basename "$b") == test_cuda_kernels ]] && filter="-CudaAttention.Wgmma*"
    # 60 s each: on the H200 the slowest binary took 12 s (test_cuda_kernels), the MPI one 5 s
    # when it passes; a failed case can leave a rank waiting in a collective until the limit.
    gtest_row b "$b" "$(limit 60 230)" "$filter" "$(basename "$b")"
  done
  # The wgmma attention (train.attention_kernel's default on an H100/H200) failing its test
  # (or crashing, or timing out) would spoil every bf16 run after it: those then take mma_sync,
  # and a row says so.
  if [[ $wgmma_ok == 0 ]]; then
    ATTENTION_SET=(--set train.attention_kernel=mma_sync)
    row b "the wgmma attention kernels" "their test passes" \
        "$wgmma_verdict above: the runs after b train with train.attention_kernel = mma_sync" FAIL
  fi
fi

# ================================================================ m. mixture of experts
# Right after b (its reserve covers the later steps): the CUDA MoE kernels against the CPU's.
if want m; then
  if [[ -x $BIN/test_cuda_moe ]]; then
    gtest_row m "$BIN/test_cuda_moe" "$(limit 30 230)"
  else
    row m "test_cuda_moe" "0 failures" "no test_cuda_moe in the pack" ERROR
  fi
fi

# ================================================================ trident runs
# run_trident NAME CONFIG LIMIT NRANKS [--set ...]: one run into $RUNS/NAME; rc returned.
run_trident() {
  local name=$1 config=$2 t=$3 n=$4; shift 4
  local launch=()
  ((n > 1)) && launch=("${MPIEXEC[@]}" -n "$n")
  rm -rf "${RUNS:?}/$name"
  if ((t < 5)); then echo "[gpu_check: not run, no time left]" >"$LOGS/$name.log"; return 125; fi
  say "run $name: ${launch[*]} trident train --config $config $* (limit ${t}s)"
  local t0=$SECONDS
  tenv timeout -k 10 "$t" "${launch[@]}" "$BIN/trident" train --config "$config" \
      --set log.dir="$RUNS/$name" "${ATTENTION_SET[@]}" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  echo "[gpu_check: exit status $rc after $((SECONDS - t0)) s]" >>"$LOGS/$name.log"
  if [[ $rc != 0 ]]; then
    say "run $name FAILED (rc $rc); last lines:"; tail -6 "$LOGS/$name.log" | sed 's/^/    /'
  else
    grep -E '^step ' "$LOGS/$name.log" | tail -2 | sed 's/^/    /'
  fi
  return $rc
}
# gpu_run NAME CONFIG LIMIT NRANKS [--set ...]: a run on the GPU. If it fails with NCCL in its
# log and the arguments do not choose parallel.comm, it is rerun once with parallel.comm = mpi.
# Dry run: the real command first (limit 30 s; it fails, and its last error line goes into the
# note), then a CPU stand-in under the same NAME: the same arguments without train.device,
# train.precision and parallel.comm, plus train.device = cpu, train.precision = fp32.
# Sets run_note.
gpu_run() {
  local name=$1 config=$2 t=$3 n=$4; shift 4
  local rc
  run_note=""
  if [[ $DRY == 0 ]]; then
    run_trident "$name" "$config" "$t" "$n" "$@"
    rc=$?
    if [[ $rc != 0 && $rc != 125 && " $* " != *" parallel.comm="* ]] &&
       grep -v '^\[gpu_check' "$LOGS/$name.log" | grep -qi nccl; then
      cp "$LOGS/$name.log" "$LOGS/$name-nccl-failed.log"
      run_note="failed with NCCL (rc $rc; $name-nccl-failed.log), rerun with parallel.comm=mpi"
      say "$name: $run_note"
      run_trident "$name" "$config" "$(limit "$t" 0)" "$n" "$@" --set parallel.comm=mpi
      rc=$?
    fi
    return $rc
  fi
  run_trident "$name-real" "$config" 30 "$n" "$@"
  rc=$?
  run_note="real GPU command: rc $rc, $(grep -v '^\[gpu_check' "$LOGS/$name-real.log" | grep -iE 'error|refus|cuda' | tail -1 | cut -c1-110)"
  local args=() skip=0 a
  for a in "$@"; do
    if [[ $skip == 1 ]]; then skip=0; continue; fi
    if [[ $a == --set ]]; then args+=("$a"); continue; fi
    case $a in
      train.device=*|train.precision=*|parallel.comm=*) unset 'args[${#args[@]}-1]' ;;  # drop "--set KEY=V"
      *) args+=("$a") ;;
    esac
  done
  run_trident "$name" "$config" "$t" "$n" "${args[@]}" --set train.device=cpu --set train.precision=fp32
}

PARITY=configs/gpu_parity.toml
NSTEPS=10
# compare_row STEP CHECK BOUND REF RUN RUN_RC LABEL [NSTEPS]: the worst relative loss difference
# of RUN against REF over steps 1..NSTEPS (default $NSTEPS; every one must be logged by both),
# PASS when <= BOUND; BOUND 0: bitwise equal. Dry run: DRY when the CPU stand-ins meet the
# bound, FAIL when they do not (the comparison itself is exercised), ERROR when nothing compares.
compare_row() {
  local step=$1 check=$2 bound=$3 ref=$4 run=$5 rc=$6 label=$7 n=${8:-$NSTEPS}
  local target="<= $bound"
  [[ $bound == 0 ]] && target="bitwise (0)"
  if [[ $rc != 0 ]]; then
    row "$step" "$check" "$target" "run failed (rc $rc; $label.log: $(errline "$LOGS/$label.log"))${run_note:+; $run_note}" ERROR; return
  fi
  local res
  res=$(gc compare "$RUNS/$ref/metrics.jsonl" "$RUNS/$run/metrics.jsonl" "$n" 2>&1)
  echo "$res" >"$LOGS/compare-$run.json"
  fact "{\"what\": \"compare $run vs $ref\", \"bound\": $bound, \"result\": $(echo "$res" | "$PY" -c 'import json,sys; d=json.loads(sys.stdin.read()); d.pop("per_step",None); print(json.dumps(d))' 2>/dev/null || echo null)}"
  IFS=$'\x1f' read -r worst wstep first err <<<"$(get "$res" worst worst_step first error)"
  if [[ -n $err || -z $worst ]]; then
    row "$step" "$check" "$target" "cannot compare: ${err:-$res}" ERROR; return
  fi
  gc table_losses "$LOGS/compare-$run.json"
  local v
  v=$("$PY" -c "import sys; print('PASS' if float(sys.argv[1]) <= float(sys.argv[2]) else 'FAIL')" "$worst" "$bound")
  [[ $DRY == 1 && $v == PASS ]] && v=DRY
  row "$step" "$check" "$target" "worst $worst at step $wstep of $n (step 1: $first)${run_note:+; $run_note}" "$v"
}

# ================================================================ c. GPU vs CPU parity
c_cpu_rc=1 c_fp32_rc=1 c_bf16_rc=1
if want c; then
  say "c. parity: $PARITY, $NSTEPS steps: cpu, cuda fp32, cuda bf16"
  run_trident par-cpu "$PARITY" "$(limit 60 210)" 1 --set train.device=cpu
  c_cpu_rc=$?
  if [[ $c_cpu_rc == 0 ]]; then
    res=$(gc throughput "$RUNS/par-cpu/metrics.jsonl" 0 2 128 256 128 8)
    IFS=$'\x1f' read -r l1 ln nlog <<<"$(get "$res" loss_first loss_last steps_logged)"
    if [[ $nlog == "$NSTEPS" ]]; then
      row c "CPU reference run" "$NSTEPS steps logged" "$nlog steps, loss $l1 -> $ln" PASS
    else
      row c "CPU reference run" "$NSTEPS steps logged" "$nlog steps logged ($res)" ERROR
    fi
  else
    row c "CPU reference run" "$NSTEPS steps logged" "failed (rc $c_cpu_rc; par-cpu.log: $(errline "$LOGS/par-cpu.log"))" ERROR
  fi
  gpu_run par-fp32 "$PARITY" "$(limit 60 190)" 1 --set train.device=cuda --set train.precision=fp32
  c_fp32_rc=$?
  compare_row c "GPU fp32 vs CPU, 10 steps: worst rel. loss diff" 1e-5 par-cpu par-fp32 "$c_fp32_rc" par-fp32
  gpu_run par-bf16 "$PARITY" "$(limit 60 170)" 1 --set train.device=cuda --set train.precision=bf16
  c_bf16_rc=$?
  compare_row c "GPU bf16 vs CPU, 10 steps: worst rel. loss diff" 2e-2 par-cpu par-bf16 "$c_bf16_rc" par-bf16
  # The CPU's bf16 (docs/gemm.md "The trainer's bf16") rounds what the GPU rounds: a tighter
  # bound than against the CPU's fp32.
  run_trident par-cpu-bf16 "$PARITY" "$(limit 60 210)" 1 --set train.device=cpu \
      --set train.precision=bf16
  rc=$?
  compare_row c "GPU bf16 vs CPU bf16, 10 steps: worst rel. loss diff" 5e-3 par-cpu-bf16 par-bf16 \
      "$((rc == 0 ? c_bf16_rc : rc))" par-bf16
  # The Llama architecture on the same shape: 2 query heads of 64 sharing 1 kv head.
  llama=(--set model.arch=llama --set model.kv_heads=1 --set model.ffn_width=256)
  run_trident par-llama-cpu "$PARITY" "$(limit 45 150)" 1 --set train.device=cpu "${llama[@]}"
  rc=$?
  gpu_run par-llama-fp32 "$PARITY" "$(limit 45 130)" 1 --set train.device=cuda \
      --set train.precision=fp32 "${llama[@]}"
  rc=$((rc == 0 ? $? : rc))
  compare_row c "llama GPU fp32 vs CPU, 10 steps: worst rel. loss diff" 1e-5 par-llama-cpu par-llama-fp32 "$rc" par-llama-fp32
fi

# ================================================================ d. TP 2, two ranks on one GPU, MPI path
if want d; then
  say "d. TP 2: mpiexec -n 2, parallel.comm = mpi, fp32, vs TP 1 on the GPU"
  ref=par-fp32; ref_label="TP 1 GPU"
  if [[ $c_fp32_rc != 0 || ! -s $RUNS/par-fp32/metrics.jsonl ]]; then
    if [[ $c_cpu_rc == 0 ]]; then ref=par-cpu; ref_label="TP 1 CPU (the GPU TP 1 run failed)"
    else
      gpu_run par-fp32 "$PARITY" "$(limit 60 170)" 1 --set train.device=cuda --set train.precision=fp32
      c_fp32_rc=$?
    fi
  fi
  gpu_run par-tp2 "$PARITY" "$(limit 90 140)" 2 --set parallel.tensor=2 --set train.device=cuda \
      --set train.precision=fp32 --set parallel.comm=mpi
  rc=$?
  compare_row d "TP 2 (2 ranks on 1 GPU, comm=mpi) vs $ref_label, fp32: worst rel. loss diff" 1e-5 "$ref" par-tp2 "$rc" par-tp2

  # One visible GPU per rank. What it proves on one H200: a rank that sees exactly one GPU
  # starts; the UUID all-gather runs on the real device and finds both ranks on the same GPU
  # (allowed over MPI, refused under NCCL with the documented line, before any NCCL call).
  # What it cannot prove: two ranks on two distinct GPUs accepted under NCCL (one GPU here).
  say "d. one visible GPU per rank: CUDA_VISIBLE_DEVICES=0 on 2 ranks, DP 2, comm=mpi then nccl"
  onegpu=(--set parallel.data=2 --set train.steps=3 --set train.device=cuda
          --set train.precision=fp32)
  CUDA_VISIBLE_DEVICES=0 gpu_run par-1gpu-mpi "$PARITY" "$(limit 60 120)" 2 "${onegpu[@]}" \
      --set parallel.comm=mpi
  rc=$?
  dev=$(grep -m1 '^device of rank 0' "$LOGS/par-1gpu-mpi.log" 2>/dev/null | cut -c1-220)
  nsteps=$(grep -c '^step ' "$LOGS/par-1gpu-mpi.log" 2>/dev/null)
  if [[ $DRY == 1 ]]; then
    row d "1 visible GPU per rank, comm=mpi: trains, GPU shared by ranks 0, 1" "rc 0, shared, 0 NCCL comms" "CPU stand-in rc $rc, $nsteps steps; ${run_note}" DRY
  elif [[ $rc == 0 && $dev == *"shared by ranks 0, 1"* && $dev == *"NCCL communicators: 0"* ]]; then
    row d "1 visible GPU per rank, comm=mpi: trains, GPU shared by ranks 0, 1" "rc 0, shared, 0 NCCL comms" "$nsteps step lines; $dev" PASS
  else
    row d "1 visible GPU per rank, comm=mpi: trains, GPU shared by ranks 0, 1" "rc 0, shared, 0 NCCL comms" "rc $rc; ${dev:-no device line}; $(errline "$LOGS/par-1gpu-mpi.log")" FAIL
  fi
  t0=$SECONDS
  CUDA_VISIBLE_DEVICES=0 run_trident par-1gpu-nccl "$PARITY" "$(limit 45 100)" 2 "${onegpu[@]}" \
      --set parallel.comm=nccl
  rc=$?
  dt=$((SECONDS - t0))
  refusal=$(grep -m1 -o 'parallel.comm = "nccl": ranks 0 and 1 (host [^)]*) both use GPU [^ :,]*' \
            "$LOGS/par-1gpu-nccl.log" 2>/dev/null)
  if [[ $DRY == 1 ]]; then
    row d "1 GPU for 2 ranks under nccl: refused at start" "one-line refusal, no hang" "rc $rc after ${dt}s: $(errline "$LOGS/par-1gpu-nccl.log")" DRY
  elif [[ $rc != 0 && $rc != 124 && $rc != 137 && -n $refusal ]]; then
    row d "1 GPU for 2 ranks under nccl: refused at start" "one-line refusal, no hang" "rc $rc after ${dt}s: $refusal" PASS
  else
    row d "1 GPU for 2 ranks under nccl: refused at start" "one-line refusal, no hang" "rc $rc after ${dt}s: $(errline "$LOGS/par-1gpu-nccl.log")" FAIL
  fi
fi

# ================================================================ e. GEMM ceiling
ceiling=""
if want e; then
  t=$(limit 60 120)
  say "e. gpu_gemm_ceiling 8 20 (limit ${t}s)"
  tenv timeout -k 5 "$t" "$BIN/gpu_gemm_ceiling" 8 20 >"$LOGS/gemm.json" 2>"$LOGS/gemm.err"
  rc=$?
  cp "$LOGS/gemm.json" "$OUT/gemm.json" 2>/dev/null
  res=$(gc gemm "$LOGS/gemm.json")
  fact "{\"what\": \"gemm\", \"rc\": $rc, \"result\": $res}"
  IFS=$'\x1f' read -r best bname layer skipped err <<<"$(get "$res" best_tflops best_name layer_tflops skipped error)"
  if [[ -n $skipped ]]; then
    row e "bf16 GEMM ceiling (cuBLAS, 8192^3)" "measured" "skipped: $skipped" "$([[ $DRY == 1 ]] && echo SKIP || echo ERROR)"
  elif [[ $rc != 0 || -z $best ]]; then
    row e "bf16 GEMM ceiling (cuBLAS, 8192^3)" "measured" "failed (rc $rc): ${err:-$(tail -1 "$LOGS/gemm.err")}" ERROR
  else
    ceiling=$best
    row e "bf16 GEMM ceiling (cuBLAS, 8192^3)" "measured" "$best TFLOP/s ($bname); GPT-2 layer+head GEMMs at B=8: $layer TFLOP/s" INFO
  fi
fi

# ================================================================ f. GPT-2 124M, bf16
tri_tps="" f_ms="" B=$GPU_BATCH
if want f; then
  cfg=configs/gpu_124m.toml
  if [[ $DRY == 1 ]]; then
    # Stand-in: a small shape on the CPU (the parsing and the formula are what is exercised).
    L=2 H=2 C=128 V=50304 T=128 B=2 N=5 SKIP=2
  else
    L=12 H=12 C=768 V=50304 T=1024 N=$GPU_STEPS_124M SKIP=3
  fi
  if [[ $DRY == 1 ]]; then flabel="stand-in L$L C$C T$T B=$B, CPU fp32"; else flabel="124M bf16 B=$B"; fi
  shape=(--set model.layers=$L --set model.heads=$H --set model.width=$C --set model.vocab_size=$V
         --set model.seq_len=$T --set train.steps=$N)
  say "f. GPT-2 124M bf16, micro-batch $B, $N steps"
  gpu_run gpt-b$B "$cfg" "$(limit 120 60)" 1 "${shape[@]}" --set train.micro_batch=$B \
      --set train.global_batch=$B --set train.device=cuda --set train.precision=bf16
  rc=$?
  f_note=""
  if [[ $rc != 0 && $DRY == 0 && $B -gt 8 ]] &&
     grep -qiE 'out of memory|cudaErrorMemoryAllocation|ALLOC_FAILED' "$LOGS/gpt-b$B.log"; then
    f_note="B=$B ran out of memory; "
    B=8 flabel="124M bf16 B=8"
    gpu_run gpt-b$B "$cfg" "$(limit 100 60)" 1 "${shape[@]}" --set train.micro_batch=$B \
        --set train.global_batch=$B --set train.device=cuda --set train.precision=bf16
    rc=$?
  fi
  name=gpt-b$B
  if [[ $rc != 0 && -s $RUNS/$name/metrics.jsonl ]] &&
     (( $(wc -l <"$RUNS/$name/metrics.jsonl") > SKIP + 1 )); then
    # Timed out (or died late): the steps it logged still give a rate.
    f_note+="run ended with rc $rc after $(wc -l <"$RUNS/$name/metrics.jsonl") of $N steps; "
    rc=0
  fi
  if [[ $rc != 0 ]]; then
    row f "Trident $flabel: tokens/s" "measured" "${f_note}run failed (rc $rc; $name.log: $(errline "$LOGS/$name.log"))" ERROR
    row f "Trident MFU (achieved / GEMM ceiling)" ">= 55%" "no Trident figure" ERROR
  else
    res=$(gc throughput "$RUNS/$name/metrics.jsonl" "$SKIP" "$L" "$C" "$V" "$T" "$B")
    fact "{\"what\": \"trident 124m\", \"batch\": $B, \"result\": $res}"
    IFS=$'\x1f' read -r tps tfl ttfl ms used err <<<"$(get "$res" tokens_per_s tflops trainer_tflops ms_per_step steps_used error)"
    if [[ -n $err || -z $tps ]]; then
      row f "Trident $flabel: tokens/s" "measured" "cannot parse: ${err:-$res}" ERROR
    else
      tri_tps=$tps f_ms=$ms
      v=INFO; [[ $DRY == 1 ]] && v=DRY
      row f "Trident $flabel: tokens/s (median of $used steps)" "measured" \
          "${f_note}$tps tok/s, $ms ms/step, $tfl TFLOP/s (trainer's own: $ttfl)" "$v"
      if [[ -n $ceiling ]]; then
        mfu=$("$PY" -c "import sys; print(f'{100*float(sys.argv[1])/float(sys.argv[2]):.1f}')" "$tfl" "$ceiling")
        v=$("$PY" -c "import sys; print('PASS' if float(sys.argv[1]) >= 55 else 'FAIL')" "$mfu")
        row f "Trident MFU (achieved / GEMM ceiling)" ">= 55%" "$mfu% ($tfl / $ceiling TFLOP/s)" "$v"
      else
        row f "Trident MFU (achieved / GEMM ceiling)" ">= 55%" "no ceiling measured" "$([[ $DRY == 1 ]] && echo DRY || echo ERROR)"
      fi
    fi
  fi
  # The bias-GELU fusion, side by side (train.fused_bias_gelu, on in the run above: cuBLASLt's
  # GELU_AUX_BIAS and DGELU epilogues): the separate GELU kernels, the same run otherwise. (The
  # LM head's chunk size, compared here before, was measured at 1.17x: bench/README.md.)
  if [[ -n $tri_tps ]]; then
    gpu_run gpt-b$B-gelu-separate "$cfg" "$(limit 60 60)" 1 "${shape[@]}" --set train.steps=$((SKIP + 8)) \
        --set train.micro_batch=$B --set train.global_batch=$B --set train.device=cuda \
        --set train.precision=bf16 --set train.fused_bias_gelu=false
    rc=$?
    res=$(gc throughput "$RUNS/gpt-b$B-gelu-separate/metrics.jsonl" "$SKIP" "$L" "$C" "$V" "$T" "$B" 2>&1)
    IFS=$'\x1f' read -r otps oms err <<<"$(get "$res" tokens_per_s ms_per_step error)"
    v=INFO; [[ $DRY == 1 ]] && v=DRY
    if [[ $rc != 0 || -n $err || -z $otps ]]; then
      row f "the same, train.fused_bias_gelu = false" "reported" "failed (rc $rc): ${err:-$(errline "$LOGS/gpt-b$B-gelu-separate.log")}" ERROR
    else
      ratio=$("$PY" -c "import sys; print(f'{float(sys.argv[1])/float(sys.argv[2]):.3f}')" "$tri_tps" "$otps")
      row f "the same, train.fused_bias_gelu = false" "reported" \
          "$otps tok/s, $oms ms/step; the fused epilogues run $ratio x as fast" "$v"
    fi
  fi
fi

# ================================================================ g. PyTorch eager reference
if want g; then
  PYT=""
  for p in ${PYTHON:-} python3 /usr/bin/python3; do
    command -v "$p" >/dev/null && timeout 120 "$p" -c 'import torch' 2>/dev/null && { PYT=$p; break; }
  done
  if [[ -z ${L:-} ]]; then  # f did not run: its shape
    if [[ $DRY == 1 ]]; then L=2 H=2 C=128 V=50304 T=128 B=2; else L=12 H=12 C=768 V=50304 T=1024; fi
  fi
  if [[ $DRY == 1 ]]; then glabel="stand-in L$L C$C T$T B=$B, CPU autocast bf16"; else glabel="eager 124M bf16 B=$B"; fi
  if [[ -z $PYT ]]; then
    # Dry run: a machine without PyTorch cannot run the stand-in (SKIP); on the GPU: ERROR.
    row g "PyTorch $glabel: tokens/s" "measured" "no python with torch" "$([[ $DRY == 1 ]] && echo SKIP || echo ERROR)"
  else
    if [[ $DRY == 1 ]]; then
      timeout 120 "$PYT" bench/torch_gpt.py --device cuda --dtype bf16 --steps 1 >"$LOGS/torch-real.log" 2>&1
      g_note="real GPU command: rc $?, $(tail -1 "$LOGS/torch-real.log" | cut -c1-100)"
      targs=(--device cpu --dtype bf16 --warmup 1 --steps 2 --threads "$(nproc)")
    else
      g_note=""
      targs=(--device cuda --dtype bf16 --warmup 3 --steps 15 --threads 4)
    fi
    t=$(limit 150 15)
    say "g. $PYT bench/torch_gpt.py ${targs[*]} (limit ${t}s)"
    "$PYT" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | sed 's/^/    /'
    t0=$SECONDS
    PYTHONUNBUFFERED=1 timeout -k 10 "$t" "$PYT" bench/torch_gpt.py --layers "$L" --heads "$H" --width "$C" \
        --vocab "$V" --seq "$T" --batch "$B" "${targs[@]}" >"$LOGS/torch.json" 2>"$LOGS/torch.err"
    rc=$?
    pt=$(tail -1 "$LOGS/torch.json" 2>/dev/null)
    fact "{\"what\": \"pytorch\", \"rc\": $rc, \"seconds\": $((SECONDS - t0)), \"result\": $(echo "${pt:-null}" | "$PY" -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.read())))' 2>/dev/null || echo null)}"
    [[ -n $pt ]] || pt="{}"
    IFS=$'\x1f' read -r ptps pgf adamw mem <<<"$(get "$pt" tokens_per_s gflops adamw max_memory_gib)"
    if [[ $rc != 0 || -z $ptps ]]; then
      row g "PyTorch $glabel: tokens/s" "measured" "failed (rc $rc): $(tail -1 "$LOGS/torch.err" | cut -c1-120)" ERROR
      row g "Trident / PyTorch tokens/s" ">= 1.35" "no PyTorch figure" ERROR
    else
      v=INFO; [[ $DRY == 1 ]] && v=DRY
      ptfl=$("$PY" -c "import sys; print(f'{float(sys.argv[1])/1e3:.4g}')" "$pgf")
      row g "PyTorch $glabel: tokens/s (median)" "measured" \
          "$ptps tok/s, $ptfl TFLOP/s (AdamW $adamw${mem:+, peak ${mem} GiB})${g_note:+; $g_note}" "$v"
      if [[ -n $tri_tps ]]; then
        ratio=$("$PY" -c "import sys; print(f'{float(sys.argv[1])/float(sys.argv[2]):.3f}')" "$tri_tps" "$ptps")
        v=$("$PY" -c "import sys; print('PASS' if float(sys.argv[1]) >= 1.35 else 'FAIL')" "$ratio")
        [[ $DRY == 1 ]] && v=DRY
        row g "Trident / PyTorch tokens/s" ">= 1.35" "$ratio ($tri_tps / $ptps)" "$v"
      else
        row g "Trident / PyTorch tokens/s" ">= 1.35" "no Trident figure" ERROR
      fi
    fi
  fi
fi

# ================================================================ h. checkpoint resume, bitwise
# The same layout twice: 6 steps straight, and 3 steps (train.exit_interval = 3: checkpoint,
# exit 75) + --resume auto for the other 3; the losses of steps 1..6 and the final checkpoints
# (ckpt_compare: every dataset, bit for bit, elements counted) must be equal, fp32 and bf16.
# H200 estimate: 6 one-rank runs of <= 6 steps at ~5 s each (start-up dominates) + 2 compares:
# ~35 s.
resume_rows() {  # PRECISION
  local prec=$1 name=res-$1
  local straight=$RUNS/ckpt-$name-straight split=$RUNS/ckpt-$name-split
  local common=(--set train.steps=6 --set train.device=cuda --set train.precision="$prec"
                --set parallel.comm=mpi)
  rm -rf "$straight" "$split"
  gpu_run "$name-straight" "$PARITY" "$(limit 30 150)" 1 "${common[@]}" --set checkpoint.dir="$straight"
  local rc_straight=$?
  gpu_run "$name-leg1" "$PARITY" "$(limit 30 140)" 1 "${common[@]}" --set checkpoint.dir="$split" \
      --set train.exit_interval=3
  local rc1=$? rc2=125
  if [[ $rc1 == 75 ]]; then
    gpu_run "$name-leg2" "$PARITY" "$(limit 30 130)" 1 "${common[@]}" --set checkpoint.dir="$split" \
        --resume auto
    rc2=$?
  fi
  mkdir -p "$RUNS/$name-split"
  cat "$RUNS/$name-leg1/metrics.jsonl" "$RUNS/$name-leg2/metrics.jsonl" \
      >"$RUNS/$name-split/metrics.jsonl" 2>/dev/null
  local rc=$rc_straight label=$name-straight
  # Leg 1 must stop at step 3 with exit status 75 (checkpointed, as asked); 0 is a failure too.
  if [[ $rc == 0 && $rc1 != 75 ]]; then rc=$((rc1 == 0 ? 1 : rc1)) label=$name-leg1; fi
  if [[ $rc == 0 ]]; then rc=$rc2 label=$name-leg2; fi
  local leg2_line
  leg2_line=$(grep -m1 '^resumed from' "$LOGS/$name-leg2.log" 2>/dev/null)
  compare_row h "resume $prec: 6 steps straight vs 3 + resume 3, losses" 0 "$name-straight" "$name-split" "$rc" "$label" 6
  local a=$straight/step_00000006.h5 b=$split/step_00000006.h5 out v
  if [[ $rc != 0 ]]; then
    row h "resume $prec: final checkpoints (ckpt_compare)" "bitwise, > 0 elements" "no checkpoints: a run failed (see above)" ERROR; return
  fi
  if [[ ! -x $BIN/ckpt_compare ]]; then
    row h "resume $prec: final checkpoints (ckpt_compare)" "bitwise, > 0 elements" "no ckpt_compare in the pack" ERROR; return
  fi
  out=$(tenv timeout -k 5 60 "$BIN/ckpt_compare" "$a" "$b" 2>&1)
  local crc=$?
  echo "$out" >"$LOGS/ckpt-compare-$name.log"
  local counts
  counts=$(echo "$out" | grep -oE 'compared [0-9]+ datasets, [0-9]+ elements: [0-9]+ differ' | tail -1)
  local elements=${counts#*datasets, }; elements=${elements%% *}
  local differ=${counts##*: }; differ=${differ%% *}
  if [[ $crc == 0 && -n $counts && ${elements:-0} -gt 0 && $differ == 0 ]]; then
    v=PASS; [[ $DRY == 1 ]] && v=DRY
  elif [[ -n $counts || $crc == 1 ]]; then v=FAIL
  else v=ERROR; fi
  row h "resume $prec: final checkpoints (ckpt_compare)" "bitwise, > 0 elements" \
      "rc $crc: ${counts:-$(echo "$out" | tail -1 | cut -c1-120)}${leg2_line:+; leg 2 ${leg2_line}}" "$v"
}
if want h; then
  say "h. resume: 6 steps vs 3 + --resume auto 3, fp32 and bf16, one GPU"
  resume_rows fp32
  resume_rows bf16
fi

# ================================================================ i. sequence parallelism
# TP 2 + sequence parallelism, 2 ranks sharing the GPU over MPI, vs TP 1 on the GPU, fp32:
# a Llama (4 query heads of 32 sharing 2 kv heads: one kv head per tensor rank) and the GPT-2
# shape of c (its position table's sequence shard is a GPU kernel of its own).
# H200 estimate: 2 two-rank runs (~8 s) + 1 one-rank run (~5 s): ~25 s.
if want i; then
  say "i. sequence parallelism: TP 2 + SP (mpiexec -n 2, comm=mpi) vs TP 1 on the GPU, fp32"
  sp_llama=(--set model.arch=llama --set model.heads=4 --set model.kv_heads=2 --set model.ffn_width=256)
  gpu_run sp-llama-tp1 "$PARITY" "$(limit 45 120)" 1 "${sp_llama[@]}" --set train.device=cuda \
      --set train.precision=fp32
  rc=$?
  gpu_run sp-llama-tp2 "$PARITY" "$(limit 60 110)" 2 "${sp_llama[@]}" --set parallel.tensor=2 \
      --set parallel.sequence_parallel=true --set train.device=cuda --set train.precision=fp32 \
      --set parallel.comm=mpi
  rc=$((rc == 0 ? $? : rc))
  compare_row i "llama TP 2 + SP (2 ranks on 1 GPU) vs TP 1 GPU, fp32" 1e-5 sp-llama-tp1 sp-llama-tp2 "$rc" sp-llama-tp2
  if [[ $c_fp32_rc != 0 || ! -s $RUNS/par-fp32/metrics.jsonl ]]; then
    gpu_run par-fp32 "$PARITY" "$(limit 45 100)" 1 --set train.device=cuda --set train.precision=fp32
    c_fp32_rc=$?
  fi
  gpu_run sp-gpt2-tp2 "$PARITY" "$(limit 60 100)" 2 --set parallel.tensor=2 \
      --set parallel.sequence_parallel=true --set train.device=cuda --set train.precision=fp32 \
      --set parallel.comm=mpi
  rc=$?
  [[ $c_fp32_rc != 0 ]] && rc=$c_fp32_rc
  compare_row i "gpt2 TP 2 + SP (2 ranks on 1 GPU) vs TP 1 GPU, fp32" 1e-5 par-fp32 sp-gpt2-tp2 "$rc" sp-gpt2-tp2
fi

# ================================================================ j. pipeline schedules
# PP 2 (2 ranks sharing the GPU over MPI) under 1f1b, interleaved (2 virtual stages) and zb-h1
# vs PP 1 on the GPU, fp32: the shape of c with 4 layers (1 per model chunk when interleaved)
# and micro-batch 2 (4 micro-batches per step).
# H200 estimate: 1 one-rank run (~5 s) + 3 two-rank runs (~8 s): ~30 s.
if want j; then
  say "j. schedules: PP 2 (mpiexec -n 2, comm=mpi) 1f1b / interleaved / zb-h1 vs PP 1, fp32"
  pp=(--set model.layers=4 --set train.micro_batch=2 --set train.device=cuda --set train.precision=fp32)
  gpu_run sch-pp1 "$PARITY" "$(limit 45 100)" 1 "${pp[@]}"
  rc_pp1=$?
  for sched in 1f1b interleaved zb-h1; do
    extra=(); [[ $sched == interleaved ]] && extra=(--set parallel.virtual_stages=2)
    gpu_run "sch-$sched" "$PARITY" "$(limit 60 85)" 2 "${pp[@]}" --set parallel.pipeline=2 \
        --set parallel.schedule="$sched" "${extra[@]}" --set parallel.comm=mpi
    rc=$?
    [[ $rc_pp1 != 0 ]] && rc=$rc_pp1
    compare_row j "PP 2 $sched${extra:+ (virtual_stages 2)} vs PP 1 GPU, fp32" 1e-5 sch-pp1 "sch-$sched" "$rc" "sch-$sched"
  done
fi

# ================================================================ k. recomputation
# train.recompute = selective and full vs none (the runs of c), losses bitwise equal, fp32 and
# bf16. H200 estimate: 4 one-rank runs at ~5 s: ~20 s.
if want k; then
  say "k. recomputation: selective, full vs none, fp32 and bf16, bitwise"
  for prec in fp32 bf16; do
    ref=par-$prec
    ref_rc=$c_fp32_rc; [[ $prec == bf16 ]] && ref_rc=$c_bf16_rc
    if [[ $ref_rc != 0 || ! -s $RUNS/$ref/metrics.jsonl ]]; then
      gpu_run "$ref" "$PARITY" "$(limit 45 70)" 1 --set train.device=cuda --set train.precision="$prec"
      ref_rc=$?
    fi
    for mode in selective full; do
      gpu_run "rc-$mode-$prec" "$PARITY" "$(limit 45 60)" 1 --set train.recompute="$mode" \
          --set train.device=cuda --set train.precision="$prec"
      rc=$?
      [[ $ref_rc != 0 ]] && rc=$ref_rc
      compare_row k "recompute $mode vs none, $prec" 0 "$ref" "rc-$mode-$prec" "$rc" "rc-$mode-$prec"
    done
  done
fi

# ================================================================ l. generation
# `trident generate` greedy (temperature 0) from one fp32 checkpoint (h's 6-step run, else a
# 6-step CPU run made here), 4 prompts as one batch, 48 new tokens each: the GPU's text equals
# the CPU's byte for byte (byte-level vocabulary: one byte per token), and TP 2 on the GPU
# (2 ranks, comm=mpi) equals TP 1 on the GPU; then the same GPU vs CPU sampled with one seed.
# The prompt loss (--prompt-loss, prompt 0) is shown.
# H200 estimate: 2 CPU and 3 GPU generations of 4 x 48 tokens (~5 s each): ~25 s.
# run_generate NAME NRANKS LIMIT [ARGS...]: stdout to $LOGS/NAME.out, stderr to $LOGS/NAME.log.
run_generate() {
  local name=$1 n=$2 t=$3; shift 3
  local launch=()
  ((n > 1)) && launch=("${MPIEXEC[@]}" -n "$n")
  if ((t < 5)); then echo "[gpu_check: not run, no time left]" >"$LOGS/$name.log"; : >"$LOGS/$name.out"; return 125; fi
  say "generate $name: ${launch[*]} trident generate --ckpt $gen_ckpt $* (limit ${t}s)"
  tenv timeout -k 10 "$t" "${launch[@]}" "$BIN/trident" generate --ckpt "$gen_ckpt" \
      --prompts "$WORK/prompts.txt" --max-new-tokens 48 "${gen_sampling[@]}" --prompt-loss "$@" \
      >"$LOGS/$name.out" 2>"$LOGS/$name.log"
  local rc=$?
  echo "[gpu_check: exit status $rc]" >>"$LOGS/$name.log"
  head -c 300 "$LOGS/$name.out" | sed 's/^/    /'
  return $rc
}
# gpu_generate NAME NRANKS LIMIT [ARGS...]: on the GPU; dry run: the real command (30 s), then a
# CPU stand-in without train.device, train.precision and parallel.comm. Sets run_note.
gpu_generate() {
  local name=$1 n=$2 t=$3; shift 3
  run_note=""
  if [[ $DRY == 0 ]]; then run_generate "$name" "$n" "$t" "$@"; return; fi
  run_generate "$name-real" "$n" 30 "$@"
  run_note="real GPU command: rc $?, $(grep -iE 'error|cuda' "$LOGS/$name-real.log" | tail -1 | cut -c1-110)"
  local args=() a
  for a in "$@"; do
    case $a in
      train.device=*|train.precision=*|parallel.comm=*) unset 'args[${#args[@]}-1]' ;;
      *) args+=("$a") ;;
    esac
  done
  run_generate "$name" "$n" "$t" "${args[@]}" --set train.device=cpu
}
generate_row() {  # CHECK REF RUN RUN_RC REF_RC
  local check=$1 ref=$2 run=$3 rc=$4 ref_rc=$5 res
  if [[ $rc != 0 ]]; then
    row l "$check" "identical text" "run failed (rc $rc; $run.log: $(errline "$LOGS/$run.log"))${run_note:+; $run_note}" ERROR; return
  fi
  if [[ $ref_rc != 0 ]]; then
    row l "$check" "identical text" "the reference $ref failed (rc $ref_rc; $ref.log: $(errline "$LOGS/$ref.log")); $run itself ran (rc 0)" ERROR; return
  fi
  res=$(gc compare_text "$LOGS/$ref.out" "$LOGS/$run.out" "$WORK/prompts.txt" 2>&1)
  echo "$res" >"$LOGS/compare-$run.json"
  fact "{\"what\": \"generate $run vs $ref\", \"result\": $(echo "$res" | "$PY" -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.read())))' 2>/dev/null || echo null)}"
  local np nb nd first lrel err v
  IFS=$'\x1f' read -r np nb nd first lrel err <<<"$(get "$res" prompts generated_bytes differ first_difference prompt_loss_rel error)"
  if [[ -n $err || -z $nd ]]; then
    row l "$check" "identical text" "cannot compare: ${err:-$res}" ERROR; return
  fi
  if [[ $nd == 0 && ${nb:-0} -gt 0 ]]; then v=PASS; [[ $DRY == 1 ]] && v=DRY; else v=FAIL; fi
  row l "$check" "identical text" "$nd of $np prompts differ, $nb generated bytes compared${first:+ (first: $first)}; prompt loss rel. diff ${lrel:-n/a}${run_note:+; $run_note}" "$v"
}
gen_sampling=(--temperature 0)
if want l; then
  say "l. generation: greedy, cuda vs cpu (fp32), TP 2 on the GPU vs TP 1; sampled, cuda vs cpu"
  printf '%s\n' "The " "Unix is" "A computer scientist" "In the beginning" >"$WORK/prompts.txt"
  gen_ckpt=$RUNS/ckpt-res-fp32-straight/step_00000006.h5
  if [[ ! -f $gen_ckpt ]]; then
    gen_ckpt=$RUNS/ckpt-gen/step_00000006.h5
    run_trident gen-train "$PARITY" "$(limit 45 60)" 1 --set train.steps=6 --set train.device=cpu \
        --set checkpoint.dir="$RUNS/ckpt-gen"
  fi
  say "generation checkpoint: $gen_ckpt"
  run_generate gen-cpu 1 "$(limit 45 45)" --set train.device=cpu
  rc_cpu=$?
  gpu_generate gen-cuda 1 "$(limit 45 25)" --set train.device=cuda --set train.precision=fp32
  rc_cuda=$?
  generate_row "generate greedy, GPU vs CPU, fp32" gen-cpu gen-cuda "$rc_cuda" "$rc_cpu"
  note_tp1=$run_note
  gpu_generate gen-cuda-tp2 2 "$(limit 45 0)" --set train.device=cuda --set train.precision=fp32 \
      --set parallel.comm=mpi
  rc=$?
  generate_row "generate greedy, TP 2 (2 ranks on 1 GPU) vs TP 1, GPU fp32" gen-cuda gen-cuda-tp2 "$rc" "$rc_cuda"
  # A 6-step model's greedy text is mostly its most frequent byte; sampling with one seed
  # (drawn on the host from the whole logits) walks through many more tokens. A draw falls
  # within fp32 rounding of a probability boundary with odds of about 1e-6 per token.
  gen_sampling=(--temperature 1 --top-k 40 --seed 7)
  run_generate gen-cpu-sampled 1 "$(limit 45 20)" --set train.device=cpu
  rc_cpu=$?
  gpu_generate gen-cuda-sampled 1 "$(limit 45 0)" --set train.device=cuda --set train.precision=fp32
  rc=$?
  generate_row "generate sampled (T 1, top-k 40, seed 7), GPU vs CPU, fp32" gen-cpu-sampled gen-cuda-sampled "$rc" "$rc_cpu"
  gen_sampling=(--temperature 0)
fi

# ================================================================ n. the plan on the GPU
if want n; then
  say "n. trident bench-hw --device cuda; the plan of f's run from that file and the datasheet's"
  hwf=$WORK/gpu_measured.toml
  mkdir -p "$WORK/storage"  # where s's checkpoints go: bench-hw measures the same disk
  tenv timeout -k 5 "$(limit 70 0)" "$BIN/trident" bench-hw --device cuda --out "$hwf" \
      --storage-dir "$WORK/storage" >"$LOGS/bench-hw-cuda.log" 2>&1
  rc=$?
  cp "$hwf" "$OUT/gpu_measured.toml" 2>/dev/null
  if [[ $rc != 0 || ! -s $hwf ]]; then
    row n "bench-hw --device cuda" "a hardware file" \
        "failed (rc $rc): $(errline "$LOGS/bench-hw-cuda.log")" "$([[ $DRY == 1 ]] && echo DRY || echo ERROR)"
  else
    row n "bench-hw --device cuda" "a hardware file" \
        "$(grep -E '^(peak_tflops_fp32|peak_tflops_bf16|memory_bandwidth_gbs|host_link_gbs|write_gbs|dataset_ms) =' "$hwf" | tr '\n' ' ')" INFO
  fi
  plan_rows n "f's run" "${f_ms:-}" "${B:-}" configs/gpu_124m.toml
fi

# ================================================================ o. where f's step goes
# Kernel times of 3 steps of f's run under Nsight Compute (one metric, gpu__time_duration: one
# replay pass per kernel; clocks and caches left alone), summed per kernel, against f's measured
# ms/step: what the GPU computes and how long it waits for the host. Then PyTorch's kernels for
# the same step (torch.profiler, 2 steps). Diagnostics, reported; last, so the checks above come
# first. H200 estimate: ~60-120 s.
if want o; then
  say "o. kernel time of f's step: ncu (Trident), torch.profiler (PyTorch)"
  ncu_row o Trident trident_kernels 150 "${L:-}" "${f_ms:-}" "f's ${f_ms:-?}" configs/gpu_124m.toml \
      --set model.layers=${L:-} --set model.heads=${H:-} --set model.width=${C:-} \
      --set model.vocab_size=${V:-} --set model.seq_len=${T:-} --set train.micro_batch=${B:-} \
      --set train.global_batch=${B:-} --set train.device=cuda --set train.precision=bf16
  if [[ $DRY == 0 && -n ${PYT:-} && -n ${L:-} ]]; then
    PYTHONUNBUFFERED=1 timeout -k 10 "$(limit 60 0)" "$PYT" bench/torch_gpt.py --layers "$L" \
        --heads "$H" --width "$C" --vocab "$V" --seq "$T" --batch "$B" --device cuda \
        --dtype bf16 --warmup 3 --steps 1 --threads 4 --profile-out "$LOGS/torch_kernels.txt" \
        >"$LOGS/torch-profile.json" 2>"$LOGS/torch-profile.err"
    rc=$?
    if [[ $rc == 0 && -s $LOGS/torch_kernels.txt ]]; then
      row o "PyTorch kernels per step (torch.profiler, 2 steps)" "reported" "$(head -1 "$LOGS/torch_kernels.txt" | cut -c3-)" INFO
    else
      row o "PyTorch kernels per step (torch.profiler)" "reported" "failed (rc $rc): $(tail -1 "$LOGS/torch-profile.err" | cut -c1-120)" ERROR
    fi
  fi
fi

# ================================================================ p. a Llama's speed
# Llama 3.2 1B's shapes with the packed 50304-token data (uint16 shards cannot hold its 128256
# ids); >= 65% of e's ceiling (issue 52), PyTorch's Llama beside it in r. The trainer's own FLOP count
# (gflops_per_rank) covers grouped-query attention and SwiGLU, which f's GPT-2 formula does not.
if want p; then
  cfg=configs/llama_3.2_1b.toml
  if [[ $DRY == 1 ]]; then
    lshape=(--set model.layers=2 --set model.width=128 --set model.heads=4 --set model.kv_heads=2
            --set model.ffn_width=256 --set model.seq_len=128)
    LB=2 LN=5 LSKIP=2 llabel="stand-in L2 C128 T128 B=2, CPU fp32"
  else
    lshape=() LB=4 LN=12 LSKIP=3 llabel="Llama 3.2 1B shapes, vocab 50304, bf16 B=4 x 2048"
  fi
  lcommon=("${lshape[@]}" --set model.vocab_size=50304 --set data.train=gpu_pack/data/random_50304.bin
           --set data.val= --set parallel.tensor=1 --set parallel.data=1 --set optim.zero_stage=0
           --set eval.interval=0 --set checkpoint.dir= --set log.interval=1
           --set train.micro_batch=$LB --set train.global_batch=$LB)
  say "p. $llabel, $LN steps"
  gpu_run llama-1b "$cfg" "$(limit 90 30)" 1 "${lcommon[@]}" --set train.steps=$LN \
      --set train.device=cuda --set train.precision=bf16
  rc=$?
  v=INFO; [[ $DRY == 1 ]] && v=DRY
  # (L C V T = 1: the GPT-2 formula's TFLOP/s is not used here, only the trainer's own)
  res=$(gc throughput "$RUNS/llama-1b/metrics.jsonl" "$LSKIP" 1 1 1 1 "$LB" 2>&1)
  fact "{\"what\": \"trident llama 1b\", \"rc\": $rc, \"result\": $(echo "$res" | "$PY" -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.read())))' 2>/dev/null || echo null)}"
  IFS=$'\x1f' read -r ltps lms ltfl err <<<"$(get "$res" tokens_per_s ms_per_step trainer_tflops error)"
  if [[ $rc != 0 || -n $err || -z $ltps || -z $ltfl ]]; then
    row p "Trident $llabel: tokens/s" "reported" "failed (rc $rc): ${err:-$(errline "$LOGS/llama-1b.log")}" ERROR
  else
    share="no ceiling measured" pv=$v
    if [[ -n ${ceiling:-} ]]; then
      share=$("$PY" -c "import sys; print(f'{100*float(sys.argv[1])/float(sys.argv[2]):.1f}% of the ceiling ({sys.argv[2]} TFLOP/s)')" "$ltfl" "$ceiling")
      [[ $DRY == 0 ]] && pv=$("$PY" -c "import sys; print('PASS' if 100*float(sys.argv[1])/float(sys.argv[2]) >= 65 else 'FAIL')" "$ltfl" "$ceiling")
    fi
    row p "Trident $llabel: tokens/s (median of $(get "$res" steps_used) steps)" ">= 65% of the ceiling" \
        "$ltps tok/s, $lms ms/step, $ltfl TFLOP/s (trainer's count): $share" "$pv"
  fi
  plan_rows p "p's run" "${lms:-}" "$LB" "$cfg" "${lshape[@]}" --set model.vocab_size=50304 \
      --precision bf16
  ncu_row p Llama llama_kernels 90 "$ltps" "${lms:-}" "${lms:-?}" "$cfg" "${lcommon[@]}" \
      --set train.device=cuda --set train.precision=bf16
fi

# ================================================================ q. attention beside SDPA
# Trident's bf16 attention kernels and PyTorch's SDPA (flash, cuDNN backends) at the same shapes,
# each as one JSON line (the same fields). Targets of issue 52: the GPT-2 shape's forward +
# backward at or under cuDNN's time, the Llama shape's forward >= 450 TFLOP/s.
if want q; then
  qshapes=(16:1024:12:12:64 2:4096:32:8:128)
  [[ $DRY == 1 ]] && qshapes=(2:128:4:4:32 1:256:4:2:64)
  say "q. attention: gpu_attention ${qshapes[*]} (and --documents 256), attention_sdpa.py"
  tenv timeout -k 5 "$(limit 60 20)" "$BIN/gpu_attention" --iters 20 "${qshapes[@]}" \
      >"$LOGS/attention_trident.jsonl" 2>"$LOGS/attention_trident.err"
  qrc=$?
  tenv timeout -k 5 "$(limit 30 20)" "$BIN/gpu_attention" --iters 20 --documents 256 "${qshapes[0]}" \
      >>"$LOGS/attention_trident.jsonl" 2>>"$LOGS/attention_trident.err"
  qrc=$((qrc | $?))
  tenv timeout -k 5 "$(limit 60 20)" "$BIN/gpu_attention" --iters 20 --kernel mma_sync "${qshapes[@]}" \
      >"$LOGS/attention_mma_sync.jsonl" 2>>"$LOGS/attention_trident.err"
  qrc=$((qrc | $?))
  QPY=${PYT:-}
  if [[ -z $QPY ]]; then
    for p in ${PYTHON:-} python3 /usr/bin/python3; do
      command -v "$p" >/dev/null && timeout 120 "$p" -c 'import torch' 2>/dev/null && { QPY=$p; break; }
    done
  fi
  qdev=cuda; [[ $DRY == 1 ]] && qdev=cpu
  if [[ -n $QPY ]]; then
    PYTHONUNBUFFERED=1 timeout -k 5 "$(limit 90 20)" "$QPY" bench/attention_sdpa.py --device "$qdev" \
        --backends flash,cudnn --iters 20 "${qshapes[@]}" >"$LOGS/attention_sdpa.jsonl" 2>"$LOGS/attention_sdpa.err"
  fi
  # One row per comparison, from the two files (python: the JSON and the arithmetic).
  "$PY" - "$LOGS/attention_trident.jsonl" "$LOGS/attention_sdpa.jsonl" "$DRY" "$qrc" \
      "$LOGS/attention_mma_sync.jsonl" >"$WORK/q_rows.tsv" <<'QEOF'
import json, sys
def lines(path):
    try:
        return [json.loads(l) for l in open(path) if l.strip().startswith("{")]
    except (OSError, ValueError):
        return []
tri, sdpa, dry, rc = lines(sys.argv[1]), lines(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
mma = [r for r in lines(sys.argv[5]) if "fwd_ms" in r]
key = lambda r: (r.get("B"), r.get("T"), r.get("NH"), r.get("KVH"), r.get("HS"))
def shape_name(r):
    return f"B{r['B']} T{r['T']} {r['NH']}/{r['KVH']} heads d{r['HS']}"
def verdict(ok):
    return "DRY" if dry else ("PASS" if ok else "FAIL")
out = []
if not tri or "skipped" in tri[0]:
    out.append(("q", "Trident attention (gpu_attention)", "measured",
                f"no figures (rc {rc}: {tri[0].get('skipped', '') if tri else 'no output'})",
                "SKIP" if dry else "ERROR"))
for t in tri:
    if "fwd_ms" not in t:
        continue
    docs = f", documents of {t['documents']}" if t.get("documents") else ""
    out.append(("q", f"Trident attention {shape_name(t)}{docs}, {t.get('kernel', '?')}",
                "measured",
                f"fwd {t['fwd_ms']:.3f} ms ({t['fwd_tflops']} TFLOP/s), bwd {t['bwd_ms']:.3f} ms "
                f"({t['bwd_tflops']} TFLOP/s)", "DRY" if dry else "INFO"))
    if t.get("out_vs_mma_sync", -1) >= 0:  # the wgmma kernels against mma_sync at this shape
        worst = max(t["out_vs_mma_sync"], t["dqkv_vs_mma_sync"])
        out.append(("q", f"the same: wgmma against mma_sync (largest difference / largest value)",
                    "<= 2e-2", f"out {t['out_vs_mma_sync']:.2e}, dqkv {t['dqkv_vs_mma_sync']:.2e}",
                    verdict(worst <= 2e-2)))
    if t.get("documents"):
        continue
    for m in [m for m in mma if key(m) == key(t) and t.get("kernel") != "mma_sync"]:
        out.append(("q", f"the same, mma_sync: {t.get('kernel')}'s speed-up", "reported",
                    f"forward {m['fwd_ms'] / t['fwd_ms']:.3f} x, backward "
                    f"{m['bwd_ms'] / t['bwd_ms']:.3f} x (mma_sync {m['fwd_ms']:.3f} + "
                    f"{m['bwd_ms']:.3f} ms)", "DRY" if dry else "INFO"))
    same = [r for r in sdpa if key(r) == key(t) and "fwd_ms" in r]
    for r in same:
        out.append(("q", f"SDPA {r['backend']} {shape_name(r)}", "measured",
                    f"fwd {r['fwd_ms']:.3f} ms ({r['fwd_tflops']} TFLOP/s), bwd {r['bwd_ms']:.3f} ms "
                    f"({r['bwd_tflops']} TFLOP/s)", "DRY" if dry else "INFO"))
    cudnn = [r for r in same if r["backend"] == "cudnn"]
    if t["HS"] == 64:
        if cudnn:
            ratio = cudnn[0]["fwd_bwd_ms"] / t["fwd_bwd_ms"]
            out.append(("q", f"GPT-2 shape fwd+bwd: cuDNN time / Trident time", ">= 1.0",
                        f"{ratio:.3f} ({cudnn[0]['fwd_bwd_ms']:.3f} / {t['fwd_bwd_ms']:.3f} ms)",
                        verdict(ratio >= 1.0)))
        else:
            out.append(("q", "GPT-2 shape fwd+bwd: cuDNN time / Trident time", ">= 1.0",
                        "no cuDNN figure", "SKIP" if dry else "ERROR"))
    if t["HS"] == 128:
        out.append(("q", "Llama shape forward TFLOP/s", ">= 450", f"{t['fwd_tflops']}",
                    verdict(t["fwd_tflops"] >= 450)))
for r in sdpa:
    if "error" in r:
        out.append(("q", f"SDPA {r['backend']} {shape_name(r)}", "measured", r["error"][:120],
                    "SKIP" if dry else "ERROR"))
for o in out:
    print("\t".join(str(x).replace("\t", " ") for x in o))
QEOF
  while IFS=$'\t' read -r a b c d e; do row "$a" "$b" "$c" "$d" "$e"; done <"$WORK/q_rows.tsv"
fi

# ================================================================ r. PyTorch compiled
# torch.compile (Inductor) at f's GPT-2 shape and batch, and p's Llama shapes eager and
# compiled, beside f's and p's Trident figures. The warm-up steps compile (not timed).
if want r; then
  RPY=${PYT:-${QPY:-}}
  if [[ -z $RPY ]]; then
    for p in ${PYTHON:-} python3 /usr/bin/python3; do
      command -v "$p" >/dev/null && timeout 120 "$p" -c 'import torch' 2>/dev/null && { RPY=$p; break; }
    done
  fi
  if [[ -z ${L:-} ]]; then
    if [[ $DRY == 1 ]]; then L=2 H=2 C=128 V=50304 T=128 B=2; else L=12 H=12 C=768 V=50304 T=1024 B=$GPU_BATCH; fi
  fi
  if [[ $DRY == 1 ]]; then
    rargs=(--device cpu --dtype bf16 --warmup 1 --steps 2 --threads "$(nproc)")
    lshape_py=(--arch llama --layers 2 --heads 4 --kv-heads 2 --width 128 --ffn 256 --vocab 50304 --seq 128 --batch 2)
  else
    rargs=(--device cuda --dtype bf16 --warmup 3 --steps 10 --threads 4)
    lshape_py=(--shape llama1b)
  fi
  if [[ -z $RPY ]]; then
    row r "PyTorch compiled" "measured" "no python with torch" "$([[ $DRY == 1 ]] && echo SKIP || echo ERROR)"
  else
    # name | torch_gpt.py arguments | Trident's tokens/s beside it | target of Trident / it
    rruns=("gpt2-compiled|--layers $L --heads $H --width $C --vocab $V --seq $T --batch $B --compile|${tri_tps:-}|1.0"
           "llama-eager|${lshape_py[*]}|${ltps:-}|-"
           "llama-compiled|${lshape_py[*]} --compile|${ltps:-}|1.0")
    for spec in "${rruns[@]}"; do
      IFS='|' read -r rname rargs_str rtri rtarget <<<"$spec"
      read -r -a rextra <<<"$rargs_str"
      t=$(limit 240 20)
      say "r. PyTorch $rname: bench/torch_gpt.py ${rextra[*]} (limit ${t}s)"
      PYTHONUNBUFFERED=1 timeout -k 10 "$t" "$RPY" bench/torch_gpt.py "${rextra[@]}" "${rargs[@]}" \
          >"$LOGS/torch-$rname.json" 2>"$LOGS/torch-$rname.err"
      rc=$?
      pt=$(tail -1 "$LOGS/torch-$rname.json" 2>/dev/null); [[ -n $pt ]] || pt="{}"
      fact "{\"what\": \"pytorch $rname\", \"rc\": $rc, \"result\": $(echo "$pt" | "$PY" -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.read())))' 2>/dev/null || echo null)}"
      IFS=$'\x1f' read -r rtps rgf <<<"$(get "$pt" tokens_per_s gflops)"
      if [[ $rc != 0 || -z $rtps ]]; then
        row r "PyTorch $rname: tokens/s" "measured" "failed (rc $rc): $(tail -1 "$LOGS/torch-$rname.err" | cut -c1-120)" "$([[ $DRY == 1 ]] && echo DRY || echo ERROR)"
        continue
      fi
      v=INFO; [[ $DRY == 1 ]] && v=DRY
      row r "PyTorch $rname: tokens/s (median)" "measured" "$rtps tok/s, $("$PY" -c "import sys; print(f'{float(sys.argv[1])/1e3:.4g}')" "$rgf") TFLOP/s" "$v"
      if [[ -n $rtri ]]; then
        ratio=$("$PY" -c "import sys; print(f'{float(sys.argv[1])/float(sys.argv[2]):.3f}')" "$rtri" "$rtps")
        if [[ $rtarget == - ]]; then
          v=INFO; tg="reported"
        else
          v=$("$PY" -c "import sys; print('PASS' if float(sys.argv[1]) >= float(sys.argv[2]) else 'FAIL')" "$ratio" "$rtarget")
          tg=">= $rtarget"
        fi
        [[ $DRY == 1 ]] && v=DRY
        row r "Trident / PyTorch $rname tokens/s" "$tg" "$ratio ($rtri / $rtps)" "$v"
      fi
    done
  fi
fi

# ================================================================ s. checkpoints against the plan
# f's shape and micro-batch for 9 steps three times: no saves, a synchronous save every 3
# steps, an asynchronous one (docs/plan.md "Checkpoints"). Measured: a synchronous save's
# `written ... in S s` (the mean of the periodic ones); an asynchronous save's extra training
# time over the run without saves (run summary), per save. Beside `trident plan`'s wait a save
# (`checkpoint.stall_seconds`) from n's measured file, whose [storage] bench-hw measured on the
# disk the saves go to ($WORK/storage) and host_link_gbs the GPU's copy to pinned memory.
# Reported. H100 estimate: 3 runs of ~15 s (start-up, 1.5 GB a save): ~50 s.
if want s; then
  say "s. checkpoints: f's run without saves, with synchronous and with asynchronous ones"
  if [[ -z ${L:-} ]]; then
    if [[ $DRY == 1 ]]; then L=2 H=2 C=128 V=50304 T=128 B=2; else L=12 H=12 C=768 V=50304 T=1024 B=$GPU_BATCH; fi
  fi
  ck_shape=(--set model.layers=$L --set model.heads=$H --set model.width=$C --set model.vocab_size=$V
            --set model.seq_len=$T --set train.micro_batch=$B --set train.global_batch=$B)
  ck_hw=${hwf:-}
  if [[ $DRY == 1 ]]; then  # stand-in: the CPU file with a storage figure, the plan in fp32
    ck_hw=$WORK/ck_standin.toml
    { cat configs/hardware/cpu_2core.toml; printf '\n[storage]\nwrite_gbs = 1.0\n'; } >"$ck_hw"
  fi
  declare -A ck_train=()
  for mode in none sync async; do
    ck_saves=()
    [[ $mode != none ]] && ck_saves=(--set checkpoint.dir="$WORK/storage/ck-$mode" --set checkpoint.interval=3)
    [[ $mode == async ]] && ck_saves+=(--set checkpoint.async=true)
    rm -rf "$WORK/storage/ck-$mode"
    gpu_run "ck-$mode" configs/gpu_124m.toml "$(limit 60 0)" 1 "${ck_shape[@]}" --set train.steps=9 \
        "${ck_saves[@]}" --set train.device=cuda --set train.precision=bf16
    ck_train[$mode]=$(grep -oE 'steps in [0-9.]+ s of training' "$LOGS/ck-$mode.log" | grep -oE '[0-9.]+ s' | tr -d ' s')
  done
  ck_sync=$(grep -E 'written \(step [0-9]+\):' "$LOGS/ck-sync.log" | grep -v 'step 0*9)' |
            grep -oE 'in [0-9.]+ s,' | grep -oE '[0-9.]+' |
            "$PY" -c 'import sys; v=[float(x) for x in sys.stdin.read().split()]; print("%.3f" % (sum(v)/len(v)) if v else "")')
  ck_async_n=$(grep -cE 'written \(step [0-9]+, asynchronous\)' "$LOGS/ck-async.log")
  for mode in sync async; do
    plan_args=(--set checkpoint.dir="$WORK/storage/ck-plan" --set checkpoint.interval=3)
    [[ $mode == async ]] && plan_args+=(--set checkpoint.async=true)
    [[ $DRY == 1 ]] && plan_args+=(--precision fp32)
    pred=""
    if [[ -s ${ck_hw:-/nonexistent} ]]; then
      tenv timeout 60 "$BIN/trident" plan --config configs/gpu_124m.toml --hardware "$ck_hw" \
          --nodes 1 --global-batch "$B" --layout "micro_batch=$B" --json --top 1 "${ck_shape[@]}" \
          "${plan_args[@]}" >"$LOGS/plan-ck-$mode.json" 2>"$LOGS/plan-ck-$mode.err"
      pred=$("$PY" -c 'import json, sys; c = json.load(open(sys.argv[1]))["best"][0]["checkpoint"]; print("%.3f" % c["stall_seconds"] if c["modelled"] else "")' \
          "$LOGS/plan-ck-$mode.json" 2>/dev/null)
    fi
    if [[ $mode == sync ]]; then
      meas=$ck_sync what="a synchronous save's write (mean of the periodic ones)"
    elif [[ -n ${ck_train[async]} && -n ${ck_train[none]} && $ck_async_n -gt 0 ]]; then
      meas=$("$PY" -c 'import sys; a, n, k = map(float, sys.argv[1:]); print("%.3f" % ((a - n) / k))' \
             "${ck_train[async]}" "${ck_train[none]}" "$ck_async_n")
      what="an asynchronous save: training ${ck_train[async]} s against ${ck_train[none]} s without saves, over $ck_async_n saves"
    else
      meas="" what="an asynchronous save"
    fi
    if [[ -z $meas || -z $pred ]]; then
      row s "checkpoint $mode: seconds training waits a save" "reported" \
          "not compared (measured: ${meas:-nothing}; plan: ${pred:-nothing}: $(errline "$LOGS/plan-ck-$mode.err" 2>/dev/null))" \
          "$([[ $DRY == 1 ]] && echo DRY || echo ERROR)"
    else
      row s "checkpoint $mode: seconds training waits a save" "reported" \
          "plan $pred s vs measured $meas s ($what)" "$([[ $DRY == 1 ]] && echo DRY || echo INFO)"
    fi
  done
fi

# ================================================================ t. FP8 on the GPU
# Issue 53: cuBLASLt's FP8 GEMM rate beside the bf16 one (e's gemm.json, its "fp8" entries),
# and p's Llama 3.2 1B shapes with train.precision = "fp8" (every layer but the first and the
# last; the current recipe, then the delayed one) beside p's bf16 run: tokens/s ratio >= 1.3. A GPU without FP8 tensor
# cores is refused at start-up in one line (reported as such).
if want t; then
  say "t. FP8: the GEMM ceiling (e's gemm.json) and p's Llama shapes in fp8"
  fp8c=$("$PY" -c 'import json, sys
g = json.load(open(sys.argv[1]))
f = g.get("fp8")
if not isinstance(f, list): print("not measured: %s" % (f or {}).get("skipped", g.get("skipped", "no fp8 entry"))); sys.exit()
sq = [r for r in g.get("results", []) if r["name"].startswith("square")]
bf = max((r["tflops"] for r in sq), default=0)
print("; ".join("%s %.1f TFLOP/s" % (r["name"], r["tflops"]) for r in f) + ("; bf16 square best %.1f: fp8/bf16 %.2f" % (bf, max(r["tflops"] for r in f) / bf) if bf else ""))'       "$LOGS/gemm.json" 2>&1 | tail -1)
  row t "FP8 GEMM ceiling (cuBLASLt, TN) beside bf16" "measured" "${fp8c:-gemm.json missing (run e)}" \
      "$([[ $DRY == 1 ]] && echo DRY || echo INFO)"
  if [[ -z ${lcommon+x} ]]; then
    cfg=configs/llama_3.2_1b.toml LB=4 LN=12 LSKIP=3
    lcommon=(--set model.vocab_size=50304 --set data.train=gpu_pack/data/random_50304.bin
             --set data.val= --set parallel.tensor=1 --set parallel.data=1 --set optim.zero_stage=0
             --set eval.interval=0 --set checkpoint.dir= --set log.interval=1
             --set train.micro_batch=$LB --set train.global_batch=$LB)
  fi
  # Each recipe: current (the default: a wait for the stream per quantised tensor, its amax
  # read back for its scale) and delayed (the scales fixed before the step, the amaxes taken
  # in the quantise passes into device slots: nothing waits after its first step).
  for recipe in current delayed; do
    run=llama-1b-fp8-$recipe
    gpu_run "$run" configs/llama_3.2_1b.toml "$(limit 90 30)" 1 "${lcommon[@]}" \
        --set train.steps=${LN:-12} --set train.device=cuda --set train.precision=fp8 \
        --set train.fp8_recipe=$recipe
    rc=$?
    res=$(gc throughput "$RUNS/$run/metrics.jsonl" "${LSKIP:-3}" 1 1 1 1 "${LB:-4}" 2>&1)
    IFS=$'\x1f' read -r ftps fms err <<<"$(get "$res" tokens_per_s ms_per_step error)"
    what="Trident Llama 1B shapes, fp8 ($recipe recipe)"
    if [[ $rc != 0 || -n $err || -z $ftps ]]; then
      row t "$what: tokens/s" ">= 1.3x bf16 (p)" \
          "failed (rc $rc): ${err:-$(errline "$LOGS/$run.log")}" ERROR
    elif [[ -z ${ltps:-} ]]; then
      row t "$what: tokens/s" ">= 1.3x bf16 (p)" \
          "$ftps tok/s, $fms ms/step; no bf16 figure (run p)" "$([[ $DRY == 1 ]] && echo DRY || echo INFO)"
    else
      ratio=$("$PY" -c 'import sys; print("%.2f" % (float(sys.argv[1]) / float(sys.argv[2])))' "$ftps" "$ltps")
      tv=$("$PY" -c 'import sys; print("PASS" if float(sys.argv[1]) >= 1.3 else "FAIL")' "$ratio")
      [[ $DRY == 1 ]] && tv=DRY
      row t "$what / bf16 tokens/s" ">= 1.3" "$ftps vs $ltps tok/s: $ratio ($fms ms/step)" "$tv"
    fi
    [[ $rc == 0 && -z $err ]] &&
      plan_rows t "t's $recipe run" "${fms:-}" "${LB:-4}" configs/llama_3.2_1b.toml \
          ${lshape[@]+"${lshape[@]}"} --set model.vocab_size=50304 --precision fp8 \
          --set "train.fp8_recipe=\"$recipe\""
  done
fi
}

main 2>&1 | tee "$WORK/stdout.log"
say "done in $((SECONDS - T_START)) s; summary:"
echo
title="Trident GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)"
gc table "$ROWS" "$FACTS" "$OUT/gpu_check.md" "$OUT/gpu_check.json" "$title" | tee -a "$WORK/stdout.log"
status=${PIPESTATUS[0]}
cp "$WORK/stdout.log" "$OUT/gpu_check.log"
for r in "$RUNS"/*/; do
  [[ -f $r/metrics.jsonl ]] && cp "$r/metrics.jsonl" "$LOGS/$(basename "$r").metrics.jsonl"
done
cp "$PACK/MANIFEST.txt" "$LOGS/" 2>/dev/null
for k in trident_kernels torch_kernels llama_kernels; do
  [[ -s $LOGS/$k.txt ]] && { echo "## $k"; cat "$LOGS/$k.txt"; echo; }
done >"$OUT/kernels.txt"
[[ -s $OUT/kernels.txt ]] || rm -f "$OUT/kernels.txt"
tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs 2>/dev/null
echo
echo "out: $OUT ($(cd "$OUT" && ls | tr '\n' ' ' | sed 's/ $//; s/ /, /g'))"
rm -rf "$WORK"
exit "$status"
