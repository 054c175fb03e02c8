#!/usr/bin/env bash
# A mixture-of-experts training curve beside the dense model of the same active parameters,
# on the demo corpus (docs/moe.md#training-curve):
#   dense  configs/tiny.toml as scripts/demo.sh trains it: 8 layers, width 128, GELU MLP 512;
#   moe    the same model with every layer's MLP replaced by 8 experts of half the width (256)
#          behind a top-2 router, dropless: each token runs two half-width MLPs, the dense
#          MLP's parameters and FLOPs (plus the router's 8 x 128 and one more fc2 bias).
# Same data (data/fortunes_bpe, prepared with scripts/demo.sh's tools), tokens, steps, learning
# rate schedule and seed; by default the two runs at once, one thread each (--sequential: one
# after the other).
# Prints both models' total and active parameters (from the trainer's start-up log), the
# validation loss at each evaluation side by side, the final difference, each run's steps/s,
# and the MoE's auxiliary loss and expert load shares at the end. Exit 0 when both runs
# finished with a validation loss (and, with --dp2, the DP 2 losses matched).
#
#   bench/moe_vs_dense.sh                     deps, build, data, both runs (8 min on 2 shared cores)
#   bench/moe_vs_dense.sh --no-deps --no-build --steps 100
# Options:
#   --steps N        optimizer steps of each run (default 600, the demo's; the decay ends there)
#   --eval-every N   steps between validation losses (default 50)
#   --threads T      threads of each run (default 1)
#   --concurrent     (the default) dense and MoE at the same time: on 2 cores, one thread each
#                    halves the wall time, and on a machine shared with other jobs both runs
#                    see the same disturbance, so their steps/s stay comparable
#   --sequential     dense, then MoE (give them --threads 2 on 2 cores)
#   --aux C          model.moe_aux_loss_coeff of the MoE run (default 0.01)
#   --capacity F     model.moe_capacity_factor (default 0: dropless)
#   --dp2            also train the MoE on 2 ranks (DP 2, one thread each): its training loss
#                    of every warm-up step (optim.warmup_steps, 30) must be the 1-rank MoE's
#                    within --dp2-tol (default 1e-6); the validation losses of the whole run
#                    are printed beside the 1-rank ones. After the warm-up, at the peak
#                    learning rate, both the dense and the MoE runs amplify the summation-order
#                    differences of DP 2 (the MoE's more: a token's top-2 choice is discrete),
#                    see docs/moe.md#training-curve, so later steps are compared by eye only.
#   --out DIR        run directories (default runs/moe_vs_dense)
#   --no-deps, --no-build
# Arguments after `--` go to every `trident train`.
set -euo pipefail
cd "$(dirname "$0")/.."

steps=600
eval_every=""
threads=1
aux=0.01
capacity=0
dp2=0
concurrent=1
dp2_tol=1e-6
out=runs/moe_vs_dense
deps=1
build=1
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --eval-every) eval_every=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --aux) aux=$2; shift 2 ;;
    --capacity) capacity=$2; shift 2 ;;
    --dp2) dp2=1; shift ;;
    --concurrent) concurrent=1; shift ;;
    --sequential) concurrent=0; shift ;;
    --dp2-tol) dp2_tol=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-deps) deps=0; shift ;;
    --no-build) build=0; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "moe_vs_dense.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[[ -n $eval_every ]] || eval_every=50

[[ $deps -eq 1 ]] && scripts/install_deps.sh --demo
[[ $build -eq 1 ]] && scripts/build.sh --demo
trident=${TRIDENT:-${TRIDENT_BUILD_DIR:-build}/app/trident}
if [[ ! -x $trident ]]; then
  echo "moe_vs_dense.sh: no trident executable at '$trident' (build it, or drop --no-build)" >&2
  exit 1
fi

# The demo's corpus, made as scripts/demo.sh makes it (configs/tiny.toml reads it).
corpus=data/fortunes_bpe
if [[ ! -f $corpus/stats.json ]]; then
  .venv/bin/python data_tools/prepare_text.py /usr/share/games/fortunes --out-dir "$corpus" \
    --train-tokenizer 4096 --output-format megatron --quiet
fi

rm -rf "$out"
mkdir -p "$out"
# The schedule is tiny.toml's (warm-up 30, cosine to min_lr) over --steps steps.
common=(--config configs/tiny.toml --set train.steps="$steps" --set eval.interval="$eval_every"
        --set log.interval=1 --set checkpoint.interval=0)
moe=(--set model.moe_experts=8 --set model.moe_top_k=2 --set model.ffn_width=256
     --set model.moe_layer_interval=1 --set model.moe_capacity_factor="$capacity"
     --set model.moe_aux_loss_coeff="$aux" --set model.moe_z_loss_coeff=0.001)

# train NAME RANKS THREADS ARGS...: one run into $out/NAME (metrics.jsonl, wall_s) with its
# output in $out/NAME.log; a failure is reported with the end of that log (exit status 1).
train() {
  local name=$1 ranks=$2 t=$3
  shift 3
  local start=$SECONDS code=0
  mkdir -p "$out/$name"
  timeout 3600 mpiexec -n "$ranks" "$trident" train "${common[@]}" --set train.threads="$t" \
    --set log.dir="$out/$name" "$@" "${extra[@]}" >"$out/$name.log" 2>&1 || code=$?
  echo $((SECONDS - start)) >"$out/$name/wall_s"
  echo "=== $name: $ranks rank(s) x $t thread(s), $steps steps, $((SECONDS - start)) s"
  grep -E "^(model:|mixture of experts:|tokens per step:)" "$out/$name.log" || true
  grep -E "val loss" "$out/$name.log" | tail -n 1 || true
  if [[ $code -ne 0 ]]; then
    echo "moe_vs_dense.sh: $name exited with code $code; the end of $out/$name.log:" >&2
    tail -n 20 "$out/$name.log" >&2
    return 1
  fi
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) (2 shared cores: other jobs slow both runs)"
if [[ $concurrent -eq 1 ]]; then
  train dense 1 "$threads" & dense_pid=$!
  train moe 1 "$threads" "${moe[@]}" & moe_pid=$!
  failed=0
  wait "$dense_pid" || failed=1
  wait "$moe_pid" || failed=1
  [[ $failed -eq 0 ]] || exit 1
else
  train dense 1 "$threads" || exit 1
  train moe 1 "$threads" "${moe[@]}" || exit 1
fi
if [[ $dp2 -eq 1 ]]; then
  train moe_dp2 2 1 "${moe[@]}" --set parallel.data=2 || exit 1
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 - "$out" "$corpus/stats.json" "$dp2" "$dp2_tol" <<'PY'
import json, re, statistics, sys
out, stats, dp2, tol = sys.argv[1], sys.argv[2], sys.argv[3] == "1", float(sys.argv[4])

def run(name):
    rows = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
    rows = [r for r in rows if "type" not in r]  # step rows only
    log = open(f"{out}/{name}.log").read()
    total = int(re.search(r"^model: \w+, parameters: (\d+)", log, re.M).group(1))
    m = re.search(r"active parameters per token: (\d+)", log)
    active = int(m.group(1)) if m else total  # a dense model uses every parameter per token
    # Step time: the median of the logged steps after the first (which warms the caches up).
    ms = [r["ms_per_step"] for r in rows if r["step"] > 1]
    wall = int(open(f"{out}/{name}/wall_s").read())
    return {"rows": rows, "val": {r["step"]: r["val_loss"] for r in rows if "val_loss" in r},
            "total": total, "active": active, "ms": statistics.median(ms), "wall": wall}

dense, moe = run("dense"), run("moe")
print()
for name, r in (("dense", dense), ("moe", moe)):
    print(f"{name:5s} parameters: {r['total']:>9,d} total, {r['active']:>9,d} active per token")
print(f"active parameters, MoE / dense: {moe['active'] / dense['active']:.4f}")
steps = sorted(dense["val"])
if not steps or sorted(moe["val"]) != steps:
    sys.exit(f"moe_vs_dense: the runs' evaluation steps differ or are empty: "
             f"dense {steps}, moe {sorted(moe['val'])}")
print()
print("| step | dense val loss | MoE val loss | MoE - dense |")
print("| ---: | ---: | ---: | ---: |")
for s in steps:
    d, m = dense["val"][s], moe["val"][s]
    print(f"| {s} | {d:.4f} | {m:.4f} | {m - d:+.4f} |")
last = steps[-1]
diff = moe["val"][last] - dense["val"][last]
entropy = json.load(open(stats))["unigram_entropy_nats"]
print(f"\nfinal (step {last}): MoE - dense = {diff:+.4f} nats "
      f"({'MoE lower' if diff < 0 else 'dense lower or equal'}); "
      f"unigram entropy of the corpus {entropy:.4f}")
for name, r in (("dense", dense), ("moe", moe)):
    print(f"{name:5s} {1e3 / r['ms']:.2f} steps/s (median {r['ms']:.0f} ms/step), "
          f"whole run {r['wall']} s with start-up and evaluations")
end = moe["rows"][-1]
print(f"MoE at step {end['step']}: aux loss {end['moe_aux_loss']:.4f} (summed over the 8 MoE layers: "
      f"8 when balanced), z loss {end['moe_z_loss']:.4f}, expert load share min "
      f"{end['moe_load_min']:.3f} max {end['moe_load_max']:.3f} (even: {1 / 8:.3f}), "
      f"dropped {end['moe_dropped']:.3f}")
ok = True
if dp2:
    two = run("moe_dp2")
    warmup = int(re.search(r"^warmup_steps = (\d+)", open(f"{out}/moe.log").read(), re.M).group(1))
    one_loss = {r["step"]: r["loss"] for r in moe["rows"]}
    two_loss = {r["step"]: r["loss"] for r in two["rows"]}
    early = [s for s in sorted(one_loss) if s <= warmup and s in two_loss]
    worst = max((abs(two_loss[s] - one_loss[s]) for s in early), default=float("inf"))
    print(f"\nMoE DP 2 (2 ranks x 1 thread) against 1 rank: training loss of {len(early)} "
          f"warm-up steps, largest difference {worst:.1e} (bound {tol:g}); "
          f"{1e3 / two['ms']:.2f} steps/s, whole run {two['wall']} s")
    print("validation losses (not bounded: see docs/moe.md#training-curve):")
    for s in steps:
        print(f"  step {s}: 1 rank {moe['val'][s]:.4f}  DP 2 {two['val'].get(s, float('nan')):.4f}"
              f"  difference {two['val'].get(s, float('nan')) - moe['val'][s]:+.4f}")
    ok = len(early) > 0 and worst <= tol
    if not ok:
        print("moe_vs_dense: DP 2 does NOT give the 1-rank MoE losses in the warm-up",
              file=sys.stderr)
sys.exit(0 if ok else 1)
PY
