// Configuration loading: TOML file -> Config, `--set` overrides, validation, and back to TOML.
//
// Everything per key comes from one table, kKeys (name, member, per-key rule, docs), so adding
// a key is one row: reading, overrides, per-key validation, to_toml and the docs table all
// follow it. Only constraints that relate two keys are written out, in check_relations().
#include "config/config.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <variant>

#include <toml++/toml.h>

#include "config/schema.hpp"
#include "config/toml_nesting.hpp"
#include "data/blend.hpp"
#include "util/error.hpp"
#include "util/input_file.hpp"

namespace trident {
namespace {

// ---------------------------------------------------------------------------------------------
// Schema

// Returns the field of a Config: (c.*Section).*Member. One instantiation per key.
template <auto Section, auto Member>
auto& member(Config& c) {
  return (c.*Section).*Member;
}

using Access = std::variant<int64_t& (*)(Config&), double& (*)(Config&), bool& (*)(Config&),
                            std::string& (*)(Config&), std::vector<int64_t>& (*)(Config&),
                            std::vector<std::string>& (*)(Config&)>;
// = Access's alternative index. kStringList: a string (one entry; "" none) or an array of them.
enum Kind { kInt, kFloat, kBool, kString, kIntList, kStringList };

// A per-key constraint. Numeric bounds apply to integers, floats and each entry of an integer
// array; one_of compares the value's text (so it also serves integers: {"0", "1"}).
struct Rule {
  std::optional<double> lo, hi;
  bool lo_open = false, hi_open = false;
  std::vector<std::string_view> one_of;
  bool non_empty = false;
};

Rule any() { return {}; }
Rule at_least(double lo) {
  Rule r;
  r.lo = lo;
  return r;
}
Rule above(double lo) {
  Rule r = at_least(lo);
  r.lo_open = true;
  return r;
}
Rule between(double lo, double hi) {
  Rule r = at_least(lo);
  r.hi = hi;
  return r;
}
Rule in_unit_interval() {  // [0, 1)
  Rule r = between(0, 1);
  r.hi_open = true;
  return r;
}
Rule one_of(std::initializer_list<std::string_view> v) {
  Rule r;
  r.one_of = v;
  return r;
}
Rule non_empty() {
  Rule r;
  r.non_empty = true;
  return r;
}

struct Key {
  std::string_view section, name;
  Access access;
  Rule rule;
  std::string_view meaning;
  std::string_view relations = {};  // constraints involving other keys (check_relations), docs
  std::string_view why = {};        // appended to a rule violation message
};

#define TRIDENT_KEY(sec, key) \
  #sec, #key, Access { &member<&Config::sec, &decltype(Config::sec)::key> }

// clang-format off
const Key kKeys[] = {
  {TRIDENT_KEY(model, arch), one_of({"gpt2", "llama"}),
   "Architecture. gpt2: LayerNorm, learned position table, GELU MLP, biases. llama: RMSNorm, "
   "rotary position embedding (RoPE), SwiGLU MLP, no biases. See docs/model.md."},
  {TRIDENT_KEY(model, layers), at_least(1), "Transformer blocks.",
   "the sum of `parallel.pipeline_layers` when that is given"},
  {TRIDENT_KEY(model, heads), at_least(1), "Attention (query) heads."},
  {TRIDENT_KEY(model, kv_heads), at_least(0),
   "Key/value heads: grouped-query attention, each key/value head serving heads / kv_heads "
   "query heads; 0: = `model.heads` (multi-head attention).",
   "divides `model.heads` when > 0"},
  {TRIDENT_KEY(model, width), at_least(1),
   "Hidden size (model dimension); the head size is width / heads.",
   "divisible by `model.heads`; with `arch = \"llama\"` width / heads is even (RoPE)"},
  {TRIDENT_KEY(model, ffn_width), at_least(0),
   "MLP hidden size; 0: the architecture's default, gpt2 4 * width, llama 8/3 * width "
   "rounded up to a multiple of 256."},
  {TRIDENT_KEY(model, vocab_size), between(1, 2147483647),
   "Vocabulary size. uint16 token shards (llm.c magic 20240520) and uint16 indexed datasets "
   "can only feed vocab_size <= 65536; uint32 shards (magic 20240801) and int32 Megatron "
   "indexed datasets any size (checked when the data are opened)."},
  {TRIDENT_KEY(model, seq_len), at_least(1), "Context length in tokens."},
  {TRIDENT_KEY(model, vocab_multiple), at_least(1),
   "The vocabulary is padded to a multiple of vocab_multiple * parallel.tensor. Not given "
   "with train.device = \"cuda\": 128 (tensor-core tiles of the LM head)."},
  {TRIDENT_KEY(model, tie_embeddings), any(),
   "The output head is the token embedding matrix (true) or a separate matrix (false). "
   "Not given: true for gpt2, false for llama."},
  {TRIDENT_KEY(model, norm_eps), above(0),
   "RMSNorm epsilon (llama; gpt2's LayerNorm always uses 1e-5)."},
  {TRIDENT_KEY(model, rope_theta), above(0),
   "Rotary position embedding base (llama; unused by gpt2)."},
  {TRIDENT_KEY(model, position_reset), any(),
   "Packed documents: each document's positions start at 0 after the end-of-document token "
   "that ends the one before it (gpt2: the rows of the position table; llama: the RoPE "
   "angles), as Megatron-LM's --reset-position-ids.",
   "needs `data.document_mask = true`"},
  {TRIDENT_KEY(model, moe_experts), between(0, 65536),
   "Mixture of experts: experts per MoE layer, each a copy of the architecture's MLP (gpt2 "
   "GELU, llama SwiGLU) behind a softmax top-k router; 0: dense MLPs. At most 65,536: every "
   "expert's tensors are listed one by one (the flat buffers, the checkpoint, the plan, which "
   "took 30 s at a million). See docs/moe.md.",
   "> 0: `model.moe_top_k` <= moe_experts, divisible by `parallel.expert`; with "
   "`train.device = \"cuda\"`: `train.precision = \"fp32\"` and `parallel.expert` = 1"},
  {TRIDENT_KEY(model, moe_top_k), at_least(1),
   "Experts each token is sent to; their router probabilities are renormalised to sum to 1."},
  {TRIDENT_KEY(model, moe_aux_loss_coeff), at_least(0),
   "Weight of the Switch load-balancing loss E * sum_i f_i P_i, computed per sequence and "
   "averaged over the sequences like the LM loss (per MoE layer, summed over layers)."},
  {TRIDENT_KEY(model, moe_z_loss_coeff), at_least(0),
   "Weight of the router z-loss mean_t logsumexp(router logits)^2 (per sequence, averaged "
   "like the LM loss); 0: off."},
  {TRIDENT_KEY(model, moe_capacity_factor), at_least(0),
   "Token dropping: each expert takes at most ceil(factor * seq_len * top_k / experts) of a "
   "sequence's assignments, in token order; the rest are dropped (the token keeps its "
   "residual). 0: dropless."},
  {TRIDENT_KEY(model, moe_layer_interval), at_least(1),
   "Every this-many-th layer is a MoE layer: layers l with l % interval == 0 (1: all)."},

  {TRIDENT_KEY(parallel, tensor), at_least(1), "Tensor-parallel degree (TP)."},
  {TRIDENT_KEY(parallel, context), at_least(1),
   "Context-parallel degree (CP): each sequence is cut into 2 CP chunks and context rank i "
   "holds chunks i and 2 CP - 1 - i (the causal load balance); attention exchanges the "
   "key/value blocks in a ring over the context group, everything else is local to the "
   "rank's tokens. Weight gradients are reduced over data x context. See "
   "docs/parallelism.md.",
   "`model.seq_len` divisible by 2 * context; under `parallel.sequence_parallel`, "
   "`train.micro_batch * model.seq_len / context` divisible by `parallel.tensor`; > 1 not "
   "with `model.moe_capacity_factor` > 0, `eval.sample_interval` > 0 or "
   "`train.device = \"cuda\"` "
   "(not built yet; the GPU's kernels: not yet checked on a GPU)"},
  {TRIDENT_KEY(parallel, pipeline), at_least(1), "Pipeline stages (PP)."},
  {TRIDENT_KEY(parallel, data), at_least(1), "Data-parallel replicas (DP)."},
  {TRIDENT_KEY(parallel, expert), at_least(1),
   "Expert-parallel degree (EP): the experts of each MoE layer split over EP ranks taken "
   "from inside the data-parallel dimension (not a factor of the world size). See "
   "docs/moe.md.",
   "divides `parallel.data` and `model.moe_experts`; > 1 needs `model.moe_experts` > 0"},
  {TRIDENT_KEY(parallel, ranks_per_node), at_least(0),
   "Ranks per node; 0: detected with MPI_COMM_TYPE_SHARED."},
  {TRIDENT_KEY(parallel, schedule), one_of({"1f1b", "gpipe", "interleaved", "zb-h1", "zb-h2"}),
   "Pipeline schedule. zb-h1: 1F1B with each backward split into the input gradient and the "
   "linear layers' weight gradients, the latter deferred into the bubble. zb-h2: the same "
   "split with more forwards before the first backward and more weight gradients deferred, "
   "holding min(2 * pipeline - 1, micro-batches) micro-batches' activations on every stage "
   "for less bubble when the weight gradient costs less than the input gradient. interleaved: "
   "Megatron-LM's interleaved 1F1B over `parallel.virtual_stages` model chunks per stage "
   "(docs/pipeline.md).",
   "interleaved: `parallel.virtual_stages` >= 2, `parallel.pipeline` >= 2, the micro-batches "
   "per step a multiple of `parallel.pipeline`, no `parallel.pipeline_layers`"},
  {TRIDENT_KEY(parallel, virtual_stages), at_least(1),
   "Model chunks (virtual stages) per pipeline stage under the interleaved schedule: the "
   "layers are cut into pipeline * virtual_stages equal chunks and stage s holds chunks s, "
   "s + pipeline, s + 2 pipeline, ...",
   "> 1 only with `parallel.schedule = \"interleaved\"`; then `model.layers` divisible by "
   "`parallel.pipeline * parallel.virtual_stages`"},
  {TRIDENT_KEY(parallel, comm), one_of({"nccl", "mpi"}),
   "How GPU ranks exchange device buffers: NCCL (one GPU per rank), or MPI through host "
   "memory (several ranks may share a GPU). The CPU backend always uses MPI."},
  {TRIDENT_KEY(parallel, sequence_parallel), any(),
   "Sequence parallelism (TP > 1): shard the activations outside the "
   "tensor-parallel matmuls along the sequence across the tensor group (reduce-scatter and "
   "all-gather in place of the all-reduces).",
   "`train.micro_batch * model.seq_len` divisible by `parallel.tensor`"},
  {TRIDENT_KEY(parallel, tp_overlap), any(),
   "Tensor parallelism (TP > 1, CPU): a column-parallel layer's backward starts the "
   "all-reduce of its input gradient (the reduce-scatter under sequence parallelism) and "
   "computes its weight gradient while it runs, and under sequence parallelism gathers its "
   "recomputed input while the input gradient is computed (as Megatron-LM does), a helper "
   "thread driving MPI's progress; false: blocking collectives (the gather before both "
   "GEMMs, the reduction after both). The same numbers either way on 2 tensor ranks. Off by "
   "default: on a 2-core machine it measured no gain (docs/model.md). Where the ranks' "
   "threads take every core of the node, the helper has none of its own: a note at start "
   "says so."},
  {TRIDENT_KEY(parallel, pipeline_layers), at_least(1),
   "Layers per pipeline stage; empty: the split `parallel.pipeline_balance` chooses.",
   "if not empty: `parallel.pipeline` entries summing to `model.layers`"},
  {TRIDENT_KEY(parallel, pipeline_balance), one_of({"even", "flops"}),
   "How the layers are split over the pipeline stages when `parallel.pipeline_layers` is "
   "empty. even: the same number on each (remainder on the stages before the last). flops: "
   "the last stage, which also runs the LM head and the loss, gets fewer layers so that the "
   "largest stage's training FLOPs are the smallest (docs/pipeline.md).",
   "flops: not with parallel.schedule = \"interleaved\" or `parallel.pipeline_layers`"},
  {TRIDENT_KEY(parallel, dp_bucket_mb), above(0),
   "Size of the data-parallel gradient all-reduce buckets, in MiB."},
  {TRIDENT_KEY(parallel, comm_timeout_s), above(0),
   "Collective watchdog: a rank that has waited this many seconds for one communication "
   "operation (a collective, a send or a receive) prints one line naming the group, the "
   "operation and its sequence number, and ends the whole job with exit code 76. The "
   "environment variable TRIDENT_COMM_TIMEOUT_S, when set, overrides it. See "
   "docs/reliability.md."},

  {TRIDENT_KEY(train, steps), at_least(1), "Optimizer steps."},
  {TRIDENT_KEY(train, seed), any(), "Random seed."},
  {TRIDENT_KEY(train, micro_batch), at_least(1), "Sequences per micro-batch."},
  {TRIDENT_KEY(train, global_batch), at_least(1), "Sequences per optimizer step, all replicas.",
   "divisible by `train.micro_batch * parallel.data`"},
  {TRIDENT_KEY(train, threads), between(0, 1024),
   "CPU threads per rank; 0: OMP_NUM_THREADS where the environment sets it, else one per "
   "physical core the rank may run on (its affinity mask: the node's cores unbound, its own "
   "under srun --cpus-per-task or mpiexec's binding), shared out among the ranks whose masks "
   "hold the same cores (docs/parallelism.md, \"Threads per rank\").",
   {}, "more threads than a rank's share of cores only slow a run down"},
  {TRIDENT_KEY(train, device), one_of({"cpu", "cuda"}),
   "Compute device. cuda: one GPU per rank, picked by the rank's index within its node."},
  {TRIDENT_KEY(train, precision), one_of({"fp32", "bf16", "fp8"}),
   "Compute precision. bf16: bf16 activations and GEMM inputs with fp32 accumulation, fp32 "
   "master weights, gradients and optimizer state; on the CPU the reference of the GPU's bf16 "
   "path, its bf16 values held in fp32 storage (memory as fp32's), products per "
   "`train.cpu_bf16_gemm` (docs/gemm.md \"bf16 on the CPU\"). fp8: the linear layers of "
   "the blocks (qkv, attention output, MLP in and out, and a mixture's experts, each expert "
   "scaled apart) multiply operands quantised to FP8, activations and weights E4M3, "
   "gradients `train.fp8_grad_format`, each tensor scaled per `train.fp8_recipe`, fp32 "
   "accumulation; everything else in the base precision (bf16 on the GPU, through cuBLASLt's "
   "FP8 GEMMs: written, not yet run on a GPU; fp32 on the CPU, the reference), the master "
   "weights, gradients and optimizer state in fp32. See docs/gpu.md \"FP8\".",
   "fp8 with `train.device = \"cuda\"`: a GPU of compute capability 8.9 or later (refused "
   "at start-up otherwise), `model.moe_experts = 0`, and each FP8 GEMM's contraction a "
   "multiple of 16 (the width, the attention, qkv and MLP widths per tensor rank, and "
   "`train.micro_batch` x `model.seq_len` per context rank); fp8 on any device: "
   "`train.fp8_skip_first_layers` + `train.fp8_skip_last_layers` below `model.layers` (at "
   "least one layer in FP8)"},
  {TRIDENT_KEY(train, cpu_bf16_gemm), one_of({"auto", "fma", "onednn"}),
   "train.precision = \"bf16\" on the CPU: what multiplies the bf16 operands (fp32 sums "
   "either way). fma: the fp32 GEMM on the bf16 values (exact products, so a bf16 GEMM's "
   "result up to the order of the sums) at the core's fp32 rate, on any core. onednn: the "
   "dense linear layers, the LM head and the attention's products on oneDNN's bf16 matmul, AMX "
   "tiles or AVX512-BF16 dot products (refused on a core with neither; the experts stay on "
   "fma), the weights read from a packed bf16 copy of them (2 bytes a parameter more). auto (the "
   "default): onednn where the core has AMX, or AVX512-BF16 dot products measured at 1.3x its "
   "fp32 FMAs' rate or more (Zen 5: 1.84x), else fma (an Intel core without AMX runs them at "
   "half the FMA rate; docs/gemm.md), decided by all ranks together: one engine for the whole "
   "job, fma where their cores disagree (a start-up note says so). The start-up line names "
   "the choice and the rates."},
  {TRIDENT_KEY(train, fp8_grad_format), one_of({"e5m2", "e4m3"}),
   "train.precision = \"fp8\": the format of the output gradients in the backward GEMMs. "
   "e5m2 (the default, Transformer Engine's HYBRID recipe): 5 exponent bits, a range of "
   "2^32 against e4m3's 2^18, for gradients whose magnitudes spread wider than activations'; "
   "e4m3: one more mantissa bit."},
  {TRIDENT_KEY(train, fp8_recipe), one_of({"current", "delayed"}),
   "train.precision = \"fp8\": where each tensor's scale comes from. current (the default, "
   "torchtitan's dynamic scaling): the tensor's amax as it is quantised. delayed (Transformer "
   "Engine's DelayedScaling, amax_compute_algo \"max\"): the largest amax of the last "
   "`train.fp8_amax_history` steps, fixed for the step; the step's amaxes, reduced over the "
   "ranks, join the history when it ends (the first step, with none yet, scales as current "
   "does). The histories and scales are saved in checkpoints (docs/checkpoint-format.md)."},
  {TRIDENT_KEY(train, fp8_amax_history), between(1, 65536),
   "train.fp8_recipe = \"delayed\": the number of steps whose amaxes set a tensor's scale "
   "(Transformer Engine's amax_history_len)."},
  {TRIDENT_KEY(train, fp8_margin), between(0, 30),
   "train.precision = \"fp8\": each scale leaves 2^margin of headroom under the format's "
   "largest value (scale = max / amax / 2^margin)."},
  {TRIDENT_KEY(train, fp8_skip_first_layers), at_least(0),
   "train.precision = \"fp8\": this many layers at the start of the model keep their linear "
   "layers in the high precision (the embedding, norms, attention and the LM head always do)."},
  {TRIDENT_KEY(train, fp8_skip_last_layers), at_least(0),
   "train.precision = \"fp8\": this many layers at the end of the model keep their linear "
   "layers in the high precision."},
  {TRIDENT_KEY(train, deterministic), any(),
   "Every kernel gives the same bits on every run of the same layout (true, the default; "
   "resume is then bitwise). false: the GPU's bf16 attention backward accumulates dQ with "
   "atomic adds in its dK/dV pass instead of a second pass over the keys (faster; dQ's last "
   "bits, and so the run's, vary between runs). The CPU's kernels and the GPU's fp32 ones are "
   "deterministic either way. See docs/gpu.md."},
  {TRIDENT_KEY(train, attention_kernel), one_of({"auto", "mma_sync", "wgmma"}),
   "The GPU's bf16 attention kernels. mma_sync: the FlashAttention-2-style kernels (mma.sync "
   "tensor cores, any sm_80+ GPU). wgmma: Hopper's (wgmma, TMA loads and a producer warp; "
   "compute capability 9.0, head size 64 or 128; refused elsewhere). auto (the default): wgmma "
   "where it runs, else mma_sync. Both have the deterministic backward and the atomic-dQ one of "
   "`train.deterministic = false`. The GPU's fp32 path is the SIMT kernels; the CPU ignores the "
   "key. See docs/gpu.md."},
  {TRIDENT_KEY(train, fused_bias_gelu), any(),
   "GPT-2's MLP (model.arch = \"gpt2\"): the up projection's GEMM adds the bias and applies "
   "the GELU in its epilogue, keeping the pre-activation for backward, and the down "
   "projection's input-gradient GEMM multiplies by the GELU's derivative in its own (true, "
   "the default; cuBLASLt's GELU_AUX_BIAS and DGELU epilogues on the GPU in bf16): fewer "
   "passes over the MLP's widest tensor, each way (Megatron-LM's bias-GELU fusion). The GELU "
   "is then taken of the product before its rounding, so in bf16 the bits differ from false's "
   "(the separate GELU kernels, which read the rounded pre-activation); in fp32 they are the "
   "same (the GPU's fp32 path keeps the separate kernels). Layers in FP8 keep them too."},
  {TRIDENT_KEY(train, recompute), one_of({"none", "selective", "full"}),
   "Activation recomputation (Korthikanti et al., arXiv 2205.05198): what a layer keeps from "
   "its forward to its backward. none: everything its backward reads. selective: all but "
   "attention's saved state (one logsumexp per row and head on both backends, so it saves "
   "little since the attention kernels became blocked), recomputed in backward from the kept "
   "q, k, v (about one more attention-core forward). full: only the layer's input; the whole layer's forward, its tensor-parallel "
   "collectives included, is rerun just before its backward (about one more forward). Losses "
   "and gradients are the same to the bit. See docs/model.md."},
  {TRIDENT_KEY(train, lm_head_chunk_rows), at_least(0),
   "The LM head and the cross-entropy run over chunks of this many rows (tokens) of a "
   "micro-batch, so the logits [rows, vocabulary / parallel.tensor] are never whole in memory: "
   "one chunk is held per rank, none per micro-batch: the training forward forms each chunk's "
   "gradient and the head's input and weight gradients while the chunk's logits are there, so "
   "they are computed once. 0: the fewest even chunks (multiples of 32 rows) of at most 128 MiB "
   "of logits on the CPU, 512 MiB on a GPU (train.device = \"cuda\"). Losses and gradients "
   "agree with any chunking to float rounding. See docs/model.md."},
  {TRIDENT_KEY(train, exit_interval), at_least(0),
   "Stop (checkpoint, exit 75) after every step that is a multiple of this; 0: never. For runs split into pieces of a fixed number of steps.",
   "if > 0: `checkpoint.dir` set"},
  {TRIDENT_KEY(train, exit_after_minutes), at_least(0),
   "Checkpoint and stop (exit 75) at the first step boundary after this many minutes; 0: no limit.",
   "if > 0: `checkpoint.dir` set"},
  {TRIDENT_KEY(train, max_consecutive_skips), at_least(0),
   "End the run with an error (exit 1, nothing saved) when this many steps in a row were "
   "skipped for a non-finite gradient norm: training has diverged. 0: never."},
  {TRIDENT_KEY(train, init_from), any(),
   "A model checkpoint (any Trident checkpoint, or one `trident import` made) whose weights "
   "a fresh run starts from instead of the random init; the step counter, the optimizer "
   "state and the data order start fresh. Its model must be this config's (checked key by "
   "key). Any layout reads it. Ignored, with a log line, when the run resumes (`--resume`): "
   "the resume checkpoint wins. Empty: random init."},
  {TRIDENT_KEY(train, spike_factor), at_least(0),
   "Divergence guard: a step whose mean loss is above spike_factor times the median loss of "
   "the last `train.spike_window` good steps is bad, like one with a non-finite gradient "
   "norm: its update is not applied (counted in skipped_steps). 0: loss spikes are not "
   "checked (docs/reliability.md)."},
  {TRIDENT_KEY(train, spike_window), at_least(1),
   "Good steps whose losses form the median of `train.spike_factor`; no step is a spike "
   "before the window is full (at the start of a run and of a resume)."},
  {TRIDENT_KEY(train, max_bad_steps), at_least(0),
   "Roll back inside the running job when this many steps in a row were bad (non-finite "
   "gradient norm or loss spike): the last committed checkpoint is read again and the global "
   "batches of the bad steps are skipped from then on (recorded in later checkpoints). 0: "
   "never roll back.",
   "if > 0: `checkpoint.dir` set"},
  {TRIDENT_KEY(train, max_rollbacks), at_least(0),
   "Rollbacks a run may take (counted over resumes: checkpoints record them); the next one "
   "ends the run with exit code 77 instead, as does a rollback with no committed checkpoint."},
  {TRIDENT_KEY(train, rollback_lr_scale), [] { Rule r = between(0, 1); r.lo_open = true; return r; }(),
   "Learning rate factor per rollback taken: after k rollbacks the schedule's rate times "
   "rollback_lr_scale^k. 1: unchanged."},
  {TRIDENT_KEY(train, skip_batches), at_least(0),
   "Global batch indices (0-based, the batch step s reads without skips is s) left out of "
   "the data order: step s reads the s-th index not in the list. A rollback adds the bad "
   "steps' batches to the run's list. Empty: none."},

  {TRIDENT_KEY(optim, lr), above(0), "Peak learning rate."},
  {TRIDENT_KEY(optim, min_lr), at_least(0), "Learning rate at the end of the decay.",
   "<= `optim.lr`"},
  {TRIDENT_KEY(optim, warmup_steps), at_least(0), "Linear warm-up steps (may exceed `train.steps`: a short run then ends inside the warm-up).", {}},
  {TRIDENT_KEY(optim, weight_decay), at_least(0),
   "Decoupled (AdamW) weight decay."},
  {TRIDENT_KEY(optim, beta1), in_unit_interval(), "AdamW first-moment decay."},
  {TRIDENT_KEY(optim, beta2), in_unit_interval(), "AdamW second-moment decay."},
  {TRIDENT_KEY(optim, eps), above(0), "AdamW epsilon."},
  {TRIDENT_KEY(optim, grad_clip), at_least(0), "Global gradient-norm clip; 0: no clipping."},
  {TRIDENT_KEY(optim, zero_stage), one_of({"0", "1", "2", "3"}),
   "ZeRO stage over the data (x context) group: 1 shards the AdamW moments, 2 also the "
   "gradients (each layer's reduce-scattered as its backward ends), 3 also the fp32 weights "
   "(each layer's compute copy gathered when read, the next layer's prefetched); "
   "docs/parallelism.md \"ZeRO stages\"."},
  {TRIDENT_KEY(optim, decay_position_embedding), any(),
   "Also apply weight decay to the position embedding table (gpt2; llama has none and "
   "ignores it)."},

  {TRIDENT_KEY(data, train), non_empty(),
   "Training data: a shard path or glob, or a Megatron indexed dataset's prefix; or a blend, "
   "an array of \"WEIGHT:SOURCE\" entries such as [\"0.7:data/web/part\", "
   "\"0.3:data/code/train_*.bin\"], sampled in Megatron-LM's proportions (docs/data.md).",
   "blend entries: weights finite and > 0, no source twice"},
  {TRIDENT_KEY(data, val), any(),
   "Validation data, as `data.train` (a blend too); empty: none.",
   "blend entries: weights finite and > 0, no source twice"},
  {TRIDENT_KEY(data, shuffle), any(), "Shuffle the order of training sequences."},
  {TRIDENT_KEY(data, document_mask), any(),
   "Packed documents: a token attends only to the tokens of its own document inside the "
   "sequence; a document ends with the token `data.eod_id`, which belongs to the document it "
   "ends (Megatron-LM's --reset-attention-mask, torchtitan's block-causal mask). Training "
   "and validation alike; the loss still counts every token. See docs/data.md.",
   "needs `data.eod_id` in [0, `model.vocab_size`)"},
  {TRIDENT_KEY(data, eod_id), at_least(-1),
   "The end-of-document token id of the data (data_tools/prepare_text.py writes it to "
   "stats.json as eod_id; GPT-2's <|endoftext|> is 50256); -1: none.",
   "given (>= 0) when `data.document_mask = true`"},

  {TRIDENT_KEY(eval, interval), at_least(0), "Evaluate every this many steps; 0: never."},
  {TRIDENT_KEY(eval, steps), at_least(1), "Global batches per evaluation."},
  {TRIDENT_KEY(eval, sample_interval), at_least(0),
   "Print continuations of eval.sample_prompt from the live weights every this many steps "
   "(rank 0; the generation path of `trident generate`, docs/tokenizer.md); 0: never.",
   "needs parallel.pipeline = 1"},
  {TRIDENT_KEY(eval, sample_prompt), non_empty(),
   "The prompt of the samples (eval.sample_interval)."},
  {TRIDENT_KEY(eval, sample_tokens), at_least(1), "New tokens per sample."},
  {TRIDENT_KEY(eval, sample_temperature), at_least(0),
   "Sampling temperature of the samples; 0: greedy (the most likely token). Seed: train.seed."},
  {TRIDENT_KEY(eval, sample_tokenizer), any(),
   "Hugging Face tokenizer.json that encodes the prompt and decodes the samples; empty: "
   "byte-level (ids 0..255, model.vocab_size >= 256)."},

  {TRIDENT_KEY(checkpoint, dir), any(),
   "Checkpoint directory; empty: no checkpoints. Checked when training starts, before the "
   "model is built: created if missing, and it must be a directory in which a file can be "
   "created."},
  {TRIDENT_KEY(checkpoint, interval), at_least(0),
   "Checkpoint every this many steps; 0: only at the end and on a signal."},
  {TRIDENT_KEY(checkpoint, keep), at_least(1), "Most recent checkpoints kept."},
  {TRIDENT_KEY(checkpoint, allow_data_change), any(),
   "Resume from a checkpoint written with another `train.global_batch`, `train.seed`, "
   "`data.shuffle` or `data.train` blend weights (refused otherwise): the run goes on at the "
   "checkpoint's step in the new sample order, so some samples may be seen twice and others "
   "never (docs/checkpoint-format.md)."},
  {TRIDENT_KEY(checkpoint, io_timeout_s), above(0),
   "Checkpoint I/O watchdog: a rank whose checkpoint write or read (collective HDF5 over "
   "MPI-IO) has lasted this many seconds prints one line naming the file and ends the whole "
   "job with exit code 76, as the collective watchdog does (a rank stopped during the write, "
   "a file system that does not answer). Its own limit, longer by default than "
   "`parallel.comm_timeout_s`: writing a large checkpoint takes minutes. See "
   "docs/reliability.md."},
  {TRIDENT_KEY(checkpoint, async), any(),
   "Write checkpoints in a thread of each rank while training goes on: at a checkpoint step "
   "the rank's shards (weights, AdamW moments) are copied into a host staging buffer (during "
   "the next step's forward and backward on the CPU; one device-to-host copy into pinned "
   "memory on a GPU) and the writer commits the same file as a synchronous save. At most one "
   "save is in flight: the next checkpoint step waits for it. The final checkpoint (last "
   "step, signal, time limit) waits for the save in flight and is written synchronously. "
   "Costs a second host copy of the rank's weights and moments; needs MPI_THREAD_MULTIPLE. "
   "See docs/reliability.md."},

  {TRIDENT_KEY(log, dir), any(), "Directory of the run's logs and metrics."},
  {TRIDENT_KEY(log, interval), at_least(1), "Log every this many steps."},
  {TRIDENT_KEY(log, straggler_interval), at_least(0),
   "Straggler report every this many steps: each rank's compute and communication time per "
   "step since the last report, the slowest ranks named with their time relative to the "
   "median, one log line and one metrics.jsonl record (docs/reliability.md); 0: off."},
  {TRIDENT_KEY(log, tensorboard), any(),
   "Also write TensorBoard event files (events.out.tfevents.*) in `log.dir`, from the rank "
   "that writes metrics.jsonl, at every logged step: each number of metrics.jsonl as a scalar "
   "(loss, val_loss, lr, grad_norm, tokens_per_s, ...), and the resolved config as text."},
  {TRIDENT_KEY(log, trace), any(),
   "Write a timeline trace of the steps `log.trace_steps` to `log.dir`/trace.json (Chrome "
   "trace-event JSON, opened by Perfetto and chrome://tracing): one track per rank, a slice "
   "per pipeline operation, communication call, optimizer step and checkpoint save "
   "(docs/pipeline.md, \"Timeline trace\"); data_tools/plot_timeline.py draws it."},
  {TRIDENT_KEY(log, trace_steps), at_least(1),
   "[first, last]: the steps (1-based, as in metrics.jsonl, inclusive) that `log.trace` "
   "records; only these are held in memory. The file is written after the last of them (or "
   "at the end of the run).",
   "two entries, first <= last"},
};
// clang-format on
#undef TRIDENT_KEY

// The provenance of a value an override (`--set`) gave.
constexpr const char* kFromOverride = "--set";

const Key* find_key(std::string_view section, std::string_view name) {
  for (const Key& k : kKeys)
    if (k.section == section && k.name == name) return &k;
  return nullptr;
}

bool is_section(std::string_view section) {
  for (const Key& k : kKeys)
    if (k.section == section) return true;
  return false;
}

std::string full_name(const Key& k) {
  return std::string(k.section) + "." + std::string(k.name);
}

// ---------------------------------------------------------------------------------------------
// Text helpers

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw Error(printable_line(source) + ": " + what);
}

std::string int_text(int64_t v) { return std::to_string(v); }

std::string int128_text(__int128 v) {
  if (v >= INT64_MIN && v <= INT64_MAX) return std::to_string(static_cast<int64_t>(v));
  bool neg = v < 0;
  unsigned __int128 u = neg ? -static_cast<unsigned __int128>(v) : static_cast<unsigned __int128>(v);
  std::string s;
  do {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(u % 10)));
    u /= 10;
  } while (u);
  return neg ? "-" + s : s;
}

// A bound of a rule, as text ("1", "0.5").
std::string bound_text(double b) {
  if (b == std::floor(b) && std::fabs(b) < 1e15) return int_text(static_cast<int64_t>(b));
  return config::toml_float(b);
}

std::string join_or(const std::vector<std::string_view>& v, const char* quote) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += (i + 1 == v.size()) ? " or " : ", ";
    s += quote + std::string(v[i]) + quote;
  }
  return s;
}

// The rule as the text after "must be " (messages) or in the docs' constraints column.
std::string rule_text(const Rule& r, const char* quote) {
  if (!r.one_of.empty()) return join_or(r.one_of, quote);
  if (r.non_empty) return "not empty";
  if (r.lo && r.hi)
    return "in " + std::string(r.lo_open ? "(" : "[") + bound_text(*r.lo) + ", " +
           bound_text(*r.hi) + (r.hi_open ? ")" : "]");
  if (r.lo) return (r.lo_open ? "> " : ">= ") + bound_text(*r.lo);
  if (r.hi) return (r.hi_open ? "< " : "<= ") + bound_text(*r.hi);
  return "";
}

const char* kind_name(int kind) {
  switch (kind) {
    case kInt: return "integer";
    case kFloat: return "float";
    case kBool: return "boolean";
    case kString: return "string";
    case kIntList: return "array of integers";
    default: return "string or array of strings";
  }
}

const char* expected_text(int kind) {
  switch (kind) {
    case kInt: return "an integer";
    case kFloat: return "a float";
    case kBool: return "a boolean";
    case kString: return "a string";
    case kIntList: return "an array of integers";
    default: return "a string or an array of strings";
  }
}

// A TOML value as short one-line text.
std::string node_text(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return config::toml_string(node.as_string()->get());
    case toml::node_type::integer: return int_text(node.as_integer()->get());
    case toml::node_type::floating_point:
      return config::toml_float(node.as_floating_point()->get());
    case toml::node_type::boolean: return node.as_boolean()->get() ? "true" : "false";
    case toml::node_type::array: {
      const toml::array& a = *node.as_array();
      std::string s = "[";
      for (size_t i = 0; i < a.size(); ++i) {
        if (i > 0) s += ", ";
        if (s.size() > 60) {
          s += "...";
          break;
        }
        s += node_text(a[i]);
      }
      return s + "]";
    }
    case toml::node_type::table: return "{...}";
    default: {  // date, time, date-time
      std::ostringstream os;
      if (auto d = node.as_date()) os << *d;
      if (auto t = node.as_time()) os << *t;
      if (auto dt = node.as_date_time()) os << *dt;
      return os.str();
    }
  }
}

std::string node_description(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "string " + node_text(node);
    case toml::node_type::integer: return "integer " + node_text(node);
    case toml::node_type::floating_point: return "float " + node_text(node);
    case toml::node_type::boolean: return "boolean " + node_text(node);
    case toml::node_type::array: return "array " + node_text(node);
    case toml::node_type::table: return "table";
    case toml::node_type::date: return "date " + node_text(node);
    case toml::node_type::time: return "time " + node_text(node);
    case toml::node_type::date_time: return "date-time " + node_text(node);
    default: return "nothing";
  }
}

// A field's value as TOML text.
template <typename T>
std::string value_text(const T& v) {
  if constexpr (std::is_same_v<T, int64_t>) {
    return int_text(v);
  } else if constexpr (std::is_same_v<T, double>) {
    return config::toml_float(v);
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return config::toml_string(v);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    // One entry (the usual single dataset) stays a plain string, none is "".
    if (v.size() <= 1) return config::toml_string(v.empty() ? std::string() : v.front());
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + config::toml_string(v[i]);
    return s + "]";
  } else {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + int_text(v[i]);
    return s + "]";
  }
}

// Reads a field of a const Config through the schema (the accessors take Config&; they only
// form a reference, so reading through them is fine).
template <typename F>
decltype(auto) visit_field(const Key& key, const Config& c, F&& f) {
  return std::visit([&](auto get) { return f(get(const_cast<Config&>(c))); }, key.access);
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; }
    else return false;
    if (i + n >= s.size()) return false;
    for (size_t j = 1; j <= n; ++j) {
      auto cc = static_cast<unsigned char>(s[i + j]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Reading

[[noreturn]] void wrong_type(const Key& key, const std::string& name, const toml::node& got,
                             const std::string& source, const std::string& origin) {
  fail(source, name + ": expected " + expected_text(static_cast<int>(key.access.index())) +
                   ", got " + node_description(got) + origin);
}

// Sets key's field from a TOML node, checking the type. `origin` is appended to errors
// (" (from --set ...)" for overrides).
void assign(const Key& key, const toml::node& node, Config& c, const std::string& source,
            const std::string& origin) {
  const std::string name = full_name(key);
  switch (key.access.index()) {
    case kInt:
      if (auto v = node.as_integer()) std::get<kInt>(key.access)(c) = v->get();
      else wrong_type(key, name, node, source, origin);
      break;
    case kFloat:
      if (auto v = node.as_floating_point()) std::get<kFloat>(key.access)(c) = v->get();
      else if (auto i = node.as_integer())
        std::get<kFloat>(key.access)(c) = static_cast<double>(i->get());
      else wrong_type(key, name, node, source, origin);
      break;
    case kBool:
      if (auto v = node.as_boolean()) std::get<kBool>(key.access)(c) = v->get();
      else wrong_type(key, name, node, source, origin);
      break;
    case kString:
      if (auto v = node.as_string()) std::get<kString>(key.access)(c) = v->get();
      else wrong_type(key, name, node, source, origin);
      break;
    case kIntList: {
      const toml::array* a = node.as_array();
      if (!a) wrong_type(key, name, node, source, origin);
      std::vector<int64_t> values;
      for (size_t i = 0; i < a->size(); ++i) {
        const toml::node& e = (*a)[i];
        if (auto v = e.as_integer()) values.push_back(v->get());
        else
          fail(source, name + "[" + std::to_string(i) + "]: expected an integer, got " +
                           node_description(e) + origin);
      }
      std::get<kIntList>(key.access)(c) = std::move(values);
      break;
    }
    case kStringList: {
      std::vector<std::string> values;
      if (auto v = node.as_string()) {
        if (!v->get().empty()) values.push_back(v->get());
      } else if (const toml::array* a = node.as_array()) {
        for (size_t i = 0; i < a->size(); ++i) {
          const toml::node& e = (*a)[i];
          if (auto v = e.as_string()) values.push_back(v->get());
          else
            fail(source, name + "[" + std::to_string(i) + "]: expected a string, got " +
                             node_description(e) + origin);
        }
      } else {
        wrong_type(key, name, node, source, origin);
      }
      std::get<kStringList>(key.access)(c) = std::move(values);
      break;
    }
  }
}

// Sets every key of a parsed document (`include` already taken out); records `origin` as the
// provenance of each. `source` names the document in errors.
void read_document(const toml::table& root, Config& c, const std::string& source,
                   const std::string& origin) {
  for (auto&& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    if (section == "include")
      fail(source, "include: only a config file given with --config (or included by one) may "
                   "include others");
    if (!is_section(section)) {
      if (section_node.is_table()) fail(source, "unknown section '" + printable_line(section) + "'");
      fail(source, "unknown key '" + printable_line(section) + "'");
    }
    const toml::table* table = section_node.as_table();
    if (!table)
      fail(source, section + ": expected a table, got " + node_description(section_node));
    for (auto&& [key_name, node] : *table) {
      const Key* key = find_key(section, key_name.str());
      if (!key)
        fail(source, "unknown key '" + section + "." + printable_line(key_name.str()) + "'");
      assign(*key, node, c, source, "");
      c.provenance[full_name(*key)] = origin;
    }
  }
}

std::string trim(std::string_view s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

bool is_bare_key(std::string_view s) {
  if (s.empty()) return false;
  for (char ch : s)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-')) return false;
  return true;
}

// "section.key=value": the value is a TOML value, or else (or when a string key gets a
// non-string TOML value, such as a date-like or numeric path) the text itself. Returns the key
// it set.
const Key* apply_override(const std::string& text, Config& c, const std::string& source) {
  const std::string origin = " (from --set " + printable_line(text) + ")";
  const size_t eq = text.find('=');
  const std::string lhs = trim(std::string_view(text).substr(0, eq));
  const size_t dot = lhs.find('.');
  if (eq == std::string::npos || dot == std::string::npos ||
      !is_bare_key(std::string_view(lhs).substr(0, dot)) ||
      !is_bare_key(std::string_view(lhs).substr(dot + 1)))
    fail(source, "malformed override '" + printable_line(text) + "': expected section.key=value");
  const std::string section = lhs.substr(0, dot), name = lhs.substr(dot + 1);
  const Key* key = find_key(section, name);
  if (!key) {
    if (!is_section(section))
      fail(source, "unknown section '" + section + "'" + origin);
    fail(source, "unknown key '" + lhs + "'" + origin);
  }
  const std::string value = trim(std::string_view(text).substr(eq + 1));

  if (const TomlNesting deep = toml_nesting_past(value); deep.line > 0)
    fail(source, "override '" + printable_line(lhs) + "': " + deep.what + origin);
  std::optional<toml::table> parsed;
  try {
    const std::string doc = "v = " + value;
    toml::table t = toml::parse(std::string_view(doc), std::string_view("--set"));
    if (t.size() == 1 && t.contains("v")) parsed = std::move(t);
  } catch (const toml::parse_error&) {
  }
  const toml::node* node = parsed ? parsed->get("v") : nullptr;
  // A string key takes the text itself when it is not a TOML string (a date-like or numeric
  // path); so does a string-list key unless the value is an array.
  const bool textual = key->access.index() == kString ||
                       (key->access.index() == kStringList && !(node && node->is_array()));
  if (node && !(textual && !node->is_string())) {
    assign(*key, *node, c, source, origin);
    return key;
  }
  if (!valid_utf8(value)) fail(source, lhs + ": value is not valid UTF-8" + origin);
  assign(*key, toml::value<std::string>(value), c, source, origin);
  return key;
}

// ---------------------------------------------------------------------------------------------
// Validation

bool violates(const Rule& r, double v) {
  if (r.lo && (r.lo_open ? !(v > *r.lo) : !(v >= *r.lo))) return true;
  if (r.hi && (r.hi_open ? !(v < *r.hi) : !(v <= *r.hi))) return true;
  return false;
}

bool in_list(const Rule& r, std::string_view v) {
  for (std::string_view allowed : r.one_of)
    if (allowed == v) return true;
  return false;
}

void check_rule(const Key& key, const Config& c, const std::string& source) {
  const Rule& r = key.rule;
  const std::string name = full_name(key);
  const std::string why = key.why.empty() ? "" : " (" + std::string(key.why) + ")";
  auto violation = [&](const std::string& who, const std::string& value) {
    fail(source, who + " (" + value + ") must be " + rule_text(r, "") + why);
  };
  visit_field(key, c, [&](const auto& v) {
    using T = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<T, int64_t>) {
      if (!r.one_of.empty() && !in_list(r, int_text(v))) violation(name, int_text(v));
      if (violates(r, static_cast<double>(v))) violation(name, int_text(v));
    } else if constexpr (std::is_same_v<T, double>) {
      if (!std::isfinite(v)) fail(source, name + " (" + value_text(v) + ") must be finite");
      if (violates(r, v)) violation(name, value_text(v));
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!r.one_of.empty() && !in_list(r, v)) violation(name, value_text(v));
      if (r.non_empty && v.empty()) fail(source, name + " must not be empty" + why);
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      for (size_t i = 0; i < v.size(); ++i)
        if (violates(r, static_cast<double>(v[i])))
          violation(name + "[" + std::to_string(i) + "]", int_text(v[i]));
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      if (r.non_empty && v.empty()) fail(source, name + " must not be empty" + why);
    }
  });
}

// parallel.schedule = "interleaved" and parallel.virtual_stages (what pipeline_schedule and
// stage_layer_chunks need, found while the config is read).
void check_interleaved(const Config& c, const std::string& source) {
  const ParallelConfig& p = c.parallel;
  const std::string v = "parallel.virtual_stages (" + int_text(p.virtual_stages) + ")";
  if (p.schedule != "interleaved") {
    if (p.virtual_stages != 1)
      fail(source, v + " > 1 needs parallel.schedule = \"interleaved\" (it is \"" +
                       p.schedule + "\")");
    return;
  }
  if (p.virtual_stages < 2)
    fail(source, "parallel.schedule = \"interleaved\" needs parallel.virtual_stages >= 2 "
                 "model chunks per stage (it is " + int_text(p.virtual_stages) + ")");
  if (p.pipeline < 2)
    fail(source, "parallel.schedule = \"interleaved\" needs parallel.pipeline >= 2 (it is " +
                     int_text(p.pipeline) + ")");
  if (p.pipeline_balance != "even")
    fail(source, "parallel.pipeline_balance = \"" + p.pipeline_balance + "\" cannot be used "
                 "with parallel.schedule = \"interleaved\": its chunks are model.layers / "
                 "(parallel.pipeline * parallel.virtual_stages) layers each");
  if (!p.pipeline_layers.empty())
    fail(source, "parallel.pipeline_layers cannot be used with parallel.schedule = "
                 "\"interleaved\": its chunks are model.layers / (parallel.pipeline * "
                 "parallel.virtual_stages) layers each");
  const __int128 chunks = static_cast<__int128>(p.pipeline) * p.virtual_stages;
  if (c.model.layers % chunks != 0)
    fail(source, "model.layers (" + int_text(c.model.layers) +
                     ") must be divisible by parallel.pipeline * parallel.virtual_stages (" +
                     int_text(p.pipeline) + " * " + int_text(p.virtual_stages) + " = " +
                     int128_text(chunks) + ") under parallel.schedule = \"interleaved\"");
  const int64_t micro = c.num_microbatches();
  if (micro % p.pipeline != 0)
    fail(source, "parallel.schedule = \"interleaved\" needs the micro-batches per step (" +
                     int_text(micro) + " = train.global_batch / (train.micro_batch * "
                     "parallel.data)) to be a multiple of parallel.pipeline (" +
                     int_text(p.pipeline) + ")");
}

// model.moe_* and parallel.expert (model/moe.hpp, docs/moe.md).
void check_moe(const Config& c, const std::string& source) {
  const ModelConfig& m = c.model;
  const int64_t ep = c.parallel.expert;
  if (m.moe_experts == 0) {
    if (ep > 1)
      fail(source, "parallel.expert (" + int_text(ep) +
                       ") > 1 needs a mixture of experts (model.moe_experts > 0, it is 0)");
    return;
  }
  if (m.moe_top_k > m.moe_experts)
    fail(source, "model.moe_top_k (" + int_text(m.moe_top_k) +
                     ") must be <= model.moe_experts (" + int_text(m.moe_experts) + ")");
  if (m.moe_experts % ep != 0)
    fail(source, "model.moe_experts (" + int_text(m.moe_experts) +
                     ") must be divisible by parallel.expert (" + int_text(ep) + ")");
  if (c.parallel.data % ep != 0)
    fail(source, "parallel.expert (" + int_text(ep) + ") must divide parallel.data (" +
                     int_text(c.parallel.data) +
                     "): the expert-parallel ranks are taken from the data-parallel ones");
  // The GPU's MoE kernels (kernels/cuda/moe.cu) are fp32 and checked on one rank's experts.
  if (c.train.device == "cuda" && c.train.precision != "fp32")
    fail(source, "model.moe_experts (" + int_text(m.moe_experts) +
                     ") > 0 with train.device = \"cuda\" needs train.precision = \"fp32\" (the "
                     "GPU's mixture-of-experts kernels are fp32 only)");
}

// parallel.context (model/context_parallel.hpp): the chunk layout and what CP runs with.
void check_context(const Config& c, const std::string& source) {
  const int64_t cp = c.parallel.context;
  if (cp == 1) return;
  const std::string key = "parallel.context (" + int_text(cp) + ")";
  // seq_len % (2 cp), without forming 2 cp (it may overflow).
  if (c.model.seq_len % cp != 0 || (c.model.seq_len / cp) % 2 != 0)
    fail(source, "model.seq_len (" + int_text(c.model.seq_len) + ") must be divisible by 2 * " +
                     key + ": each sequence is cut into 2 * context equal chunks");
  const int64_t tp = c.parallel.tensor;
  if (c.parallel.sequence_parallel && tp > 1 &&
      (static_cast<__int128>(c.train.micro_batch) * (c.model.seq_len / cp)) % tp != 0)
    fail(source, "train.micro_batch * model.seq_len / " + key + " = " +
                     int_text(c.train.micro_batch) + " * " + int_text(c.model.seq_len / cp) +
                     " must be divisible by parallel.tensor (" + int_text(tp) +
                     ") under parallel.sequence_parallel: each tensor rank holds a slice of a "
                     "context rank's tokens");
  // Mixture of experts: dropless (model/moe.hpp).
  if (c.model.moe_experts > 0 && c.model.moe_capacity_factor > 0)
    fail(source, key + " > 1 with model.moe_capacity_factor (" +
                     config::toml_float(c.model.moe_capacity_factor) +
                     ") > 0: token dropping decides per sequence, in order, and a context rank "
                     "holds a part of each; use a dropless mixture of experts "
                     "(model.moe_capacity_factor = 0)");
  if (c.eval.sample_interval > 0)
    fail(source, key + " > 1 with eval.sample_interval (" + int_text(c.eval.sample_interval) +
                     ") > 0: sampling decodes the whole sequence on one rank, which context "
                     "parallelism does not hold (set eval.sample_interval = 0; `trident "
                     "generate` decodes from the checkpoint)");
  if (c.train.device == "cuda")
    fail(source, key + " > 1 with train.device = \"cuda\": the GPU kernels of the context "
                     "ring have not yet been checked on a GPU (use train.device = \"cpu\")");
}

// Packed documents (data.document_mask, model.position_reset).
void check_documents(const Config& c, const std::string& source) {
  const DataConfig& d = c.data;
  if (c.model.position_reset && !d.document_mask)
    fail(source, "model.position_reset = true restarts positions at each document, which needs "
                 "data.document_mask = true (the documents' attention kept apart too)");
  if (!d.document_mask) return;
  if (d.eod_id < 0)
    fail(source, "data.document_mask = true needs data.eod_id, the end-of-document token id "
                 "(data_tools/prepare_text.py's stats.json gives it as eod_id)");
  if (d.eod_id >= c.model.vocab_size)
    fail(source, "data.eod_id (" + int_text(d.eod_id) + ") must be < model.vocab_size (" +
                     int_text(c.model.vocab_size) + ")");
}

// train.precision = "fp8" on the GPU: the FP8 tensor cores take rows of 16-byte multiples
// along the contraction, so every FP8 GEMM's contraction length must be a multiple of 16: the
// forward's (the width, the attention and MLP widths per tensor rank), the input gradient's
// (the qkv, MLP and output widths per tensor rank), the weight gradient's (a micro-batch's rows
// on a rank). Checked when the config loads, not mid-run.
void check_fp8_gpu(const Config& c, const std::string& source) {
  if (c.train.precision != "fp8" || c.train.device != "cuda") return;
  const ModelConfig& m = c.model;
  const int64_t tp = c.parallel.tensor, cp = c.parallel.context;
  const int64_t hs = m.head_size(), F = m.ffn_size();
  const std::pair<const char*, int64_t> lengths[] = {
      {"model.width", m.width},
      {"model.heads x head size / parallel.tensor", m.heads * hs / tp},
      {"(model.heads + 2 kv heads) x head size / parallel.tensor",
       (m.heads + 2 * m.kv_head_count()) * hs / tp},
      {"the MLP width / parallel.tensor", F / tp},
      {"train.micro_batch x model.seq_len / parallel.context",
       c.train.micro_batch * m.seq_len / cp}};
  for (const auto& [what, length] : lengths)
    if (length % 16 != 0)
      fail(source, "train.precision = \"fp8\" with train.device = \"cuda\": " +
                       std::string(what) + " = " + int_text(length) +
                       " must be a multiple of 16 (each FP8 GEMM's contraction: the FP8 tensor "
                       "cores' 16-byte rows)");
}

// train.precision = "fp8" whose skipped first and last layers leave no layer in FP8 would train
// in the base precision under the name fp8: refused (a 2-layer model needs the skips lowered).
void check_fp8_layers(const Config& c, const std::string& source) {
  if (c.train.precision != "fp8") return;
  const int64_t layers = c.model.layers, first = c.train.fp8_skip_first_layers,
                last = c.train.fp8_skip_last_layers;
  if (first >= layers || last >= layers - first)
    fail(source, "train.precision = \"fp8\": train.fp8_skip_first_layers (" + int_text(first) +
                     ") + train.fp8_skip_last_layers (" + int_text(last) +
                     ") leave none of model.layers (" + int_text(layers) +
                     ") in FP8; lower them (0 puts every layer in FP8)");
}

// Constraints between keys (each is described in the `relations` text of its key).
void check_relations(const Config& c, const std::string& source) {
  const ModelConfig& m = c.model;
  if (m.width % m.heads != 0)
    fail(source, "model.width (" + int_text(m.width) + ") must be divisible by model.heads (" +
                     int_text(m.heads) + ")");
  if (m.kv_heads > 0 && m.heads % m.kv_heads != 0)
    fail(source, "model.kv_heads (" + int_text(m.kv_heads) +
                     ") must divide model.heads (" + int_text(m.heads) +
                     "): each key/value head serves a whole group of query heads");
  if (m.is_llama() && m.head_size() % 2 != 0)
    fail(source, "model.width / model.heads (" + int_text(m.width) + " / " +
                     int_text(m.heads) + " = " + int_text(m.head_size()) +
                     ") must be even with model.arch = \"llama\" (RoPE rotates pairs)");
  // ffn_size() computes 8 * width + 255 (llama) or 4 * width (gpt2) when ffn_width is 0.
  if (m.ffn_width == 0 && m.width > (INT64_MAX - 255) / 8)
    fail(source, "model.width (" + int_text(m.width) +
                     ") is too large for the default MLP size (model.ffn_width = 0)");

  check_moe(c, source);
  check_context(c, source);
  check_documents(c, source);
  check_fp8_gpu(c, source);
  check_fp8_layers(c, source);

  const TrainConfig& t = c.train;
  const __int128 per_step = static_cast<__int128>(t.micro_batch) * c.parallel.data;
  if (t.global_batch % per_step != 0)
    fail(source, "train.global_batch (" + int_text(t.global_batch) +
                     ") must be divisible by train.micro_batch * parallel.data (" +
                     int_text(t.micro_batch) + " * " + int_text(c.parallel.data) + " = " +
                     int128_text(per_step) + ")");
  // Sizes the code counts in int64: the tokens of a step, and the largest tensor of one
  // micro-batch (the attention matrix [micro_batch, heads, seq_len, seq_len] of the CPU
  // kernels). Whether a rank's share fits in memory is checked when training starts.
  const __int128 step_tokens = static_cast<__int128>(t.global_batch) * m.seq_len;
  if (step_tokens > INT64_MAX)
    fail(source, "train.global_batch * model.seq_len (" + int_text(t.global_batch) + " * " +
                     int_text(m.seq_len) + " = " + int128_text(step_tokens) +
                     " tokens per step) overflows a 64-bit count");
  const long double attention = static_cast<long double>(t.micro_batch) * m.heads *
                                static_cast<long double>(m.seq_len) * m.seq_len;
  if (attention > static_cast<long double>(INT64_MAX))
    fail(source, "model.seq_len (" + int_text(m.seq_len) +
                     ") is too large: the attention matrix of one micro-batch, train.micro_batch "
                     "* model.heads * model.seq_len^2 = " + int_text(t.micro_batch) + " * " +
                     int_text(m.heads) + " * " + int_text(m.seq_len) +
                     "^2 elements, overflows a 64-bit size");

  // A stop of its own is a stop to be resumed (exit 75, "checkpointed, please requeue"):
  // without a checkpoint there would be nothing to resume from.
  if (c.checkpoint.dir.empty() && (t.exit_interval > 0 || t.exit_after_minutes > 0))
    fail(source, std::string(t.exit_interval > 0 ? "train.exit_interval" : "train.exit_after_minutes") +
                     " stops the run to be resumed, which needs checkpoint.dir (empty: nothing "
                     "would be saved)");

  // A rollback reads the last committed checkpoint: without a checkpoint.dir there is none.
  if (c.checkpoint.dir.empty() && t.max_bad_steps > 0)
    fail(source, "train.max_bad_steps rolls back to the last checkpoint, which needs "
                 "checkpoint.dir (empty: nothing to roll back to)");

  const OptimConfig& o = c.optim;
  if (o.min_lr > o.lr)
    fail(source, "optim.min_lr (" + value_text(o.min_lr) + ") must be <= optim.lr (" +
                     value_text(o.lr) + ")");

  if (c.eval.sample_interval > 0 && c.parallel.pipeline > 1)
    fail(source, "eval.sample_interval (" + int_text(c.eval.sample_interval) +
                     ") samples through the decoding path, which needs the whole model on a "
                     "rank: parallel.pipeline = 1 (it is " + int_text(c.parallel.pipeline) +
                     "); set eval.sample_interval = 0");
  if (c.eval.sample_interval > 0 && m.moe_experts > 0)
    fail(source, "eval.sample_interval (" + int_text(c.eval.sample_interval) +
                     ") samples through the decoding path, which has no mixture of experts yet "
                     "(model.moe_experts = " + int_text(m.moe_experts) +
                     "); set eval.sample_interval = 0");
  if (c.eval.sample_interval > 0 && c.eval.sample_tokenizer.empty() && m.vocab_size < 256)
    fail(source, "eval.sample_interval with the byte-level tokenizer (eval.sample_tokenizer "
                 "empty) needs model.vocab_size >= 256 (it is " + int_text(m.vocab_size) + ")");

  check_interleaved(c, source);

  const std::vector<int64_t>& pl = c.parallel.pipeline_layers;
  if (!pl.empty() && c.parallel.pipeline_balance != "even")
    fail(source, "parallel.pipeline_balance = \"" + c.parallel.pipeline_balance +
                     "\" chooses the split that parallel.pipeline_layers (" + value_text(pl) +
                     ") gives: set one of them");
  if (!pl.empty()) {
    const std::string text = value_text(pl);
    if (static_cast<int64_t>(pl.size()) != c.parallel.pipeline)
      fail(source, "parallel.pipeline_layers (" + text + ") must have parallel.pipeline (" +
                       int_text(c.parallel.pipeline) + ") entries, has " +
                       std::to_string(pl.size()));
    __int128 sum = 0;
    for (int64_t n : pl) sum += n;
    if (sum != m.layers)
      fail(source, "parallel.pipeline_layers (" + text + ") must sum to model.layers (" +
                       int_text(m.layers) + "), sums to " + int128_text(sum));
  }

  const std::vector<int64_t>& ts = c.log.trace_steps;
  if (ts.size() != 2 || ts[0] > ts[1])
    fail(source, "log.trace_steps (" + value_text(ts) +
                     ") must be [first, last] with first <= last (1-based steps)");
}

// data.train / data.val entries: the blend syntax (data/blend.hpp), so that a bad weight stops
// the run while the config is read, naming the file, before any rank opens a dataset.
void check_blends(const Config& c, const std::string& source) {
  const std::pair<const char*, const std::vector<std::string>*> keys[] = {
      {"data.train", &c.data.train}, {"data.val", &c.data.val}};
  for (const auto& [name, entries] : keys) {
    try {
      parse_blend(*entries, name);
    } catch (const Error& e) {
      fail(source, printable_line(e.what()));
    }
  }
}

// A rule violation names what set the key: the file (a base, a later --config file), "--set"
// for an override, or the config's source for a default.
void validate(const Config& c, const std::string& source) {
  for (const Key& key : kKeys) {
    const auto set_by = c.provenance.find(full_name(key));
    check_rule(key, c, set_by != c.provenance.end() ? set_by->second : source);
  }
  check_relations(c, source);
  check_blends(c, source);
}

// ---------------------------------------------------------------------------------------------
// Files and includes

// A config file's text: a regular file of at most 16 MiB (util/input_file.hpp). `shown` names
// the file in errors (with the chain of includes that led to it).
std::string read_config_file(const std::string& path, const std::string& shown) {
  return read_input_file(path, {printable_line(shown), "config", int64_t{16} << 20,
                                "--config needs a TOML file"});
}

toml::table parse_toml(const std::string& toml_text, const std::string& source) {
  if (const TomlNesting deep = toml_nesting_past(toml_text); deep.line > 0)
    throw Error(printable_line(source) + ":" + std::to_string(deep.line) + ": " + deep.what);
  try {
    return toml::parse(std::string_view(toml_text), std::string_view(source));
  } catch (const toml::parse_error& e) {
    const toml::source_position& at = e.source().begin;
    throw Error(printable_line(source) + ":" + std::to_string(at.line) + ":" +
                std::to_string(at.column) + ": TOML syntax error: " + printable_line(e.description()));
  }
}

// One parsed config file, its `include` taken out, in the order the files apply.
struct Layer {
  toml::table root;
  std::string path;   // as opened; the provenance of its values
  std::string shown;  // in errors: the chain of includes that led to it
};

// The files being included, outermost first: the path as opened, and its canonical form (the
// same file reached by two spellings is still a cycle).
struct IncludeChain {
  std::vector<std::string> paths, canonical;
  std::string text(const std::string& last) const {
    std::string s;
    for (const std::string& p : paths) s += p + " -> ";
    return s + last;
  }
};

// The `include` entries of a file's root table, removed from it.
std::vector<std::string> take_includes(toml::table& root, const std::string& shown) {
  std::vector<std::string> includes;
  const toml::node* node = root.get("include");
  if (node == nullptr) return includes;
  auto bad = [&](const std::string& what) {
    fail(shown, "include: expected a file path or an array of them, got " + what);
  };
  if (auto one = node->as_string()) {
    includes.push_back(one->get());
  } else if (auto many = node->as_array()) {
    for (const toml::node& entry : *many) {
      if (!entry.is_string()) bad("an array with " + node_description(entry));
      includes.push_back(entry.as_string()->get());
    }
  } else {
    bad(node_description(*node));
  }
  for (const std::string& include : includes)
    if (include.empty()) fail(shown, "include: an entry is empty (expected a file path)");
  root.erase("include");
  return includes;
}

// Appends the layers of `path` (its includes', depth first, then its own) to `layers`.
void collect_layers(const std::string& path, IncludeChain& chain, std::vector<Layer>& layers) {
  const std::string shown = chain.text(path);
  std::error_code ec;
  const std::string canonical = std::filesystem::weakly_canonical(path, ec).string();
  for (const std::string& including : chain.canonical)
    if (!ec && including == canonical)
      fail(shown, "include cycle: the file includes itself");
  Layer layer{parse_toml(read_config_file(path, shown), shown), path, shown};
  const std::vector<std::string> includes = take_includes(layer.root, shown);
  chain.paths.push_back(path);
  chain.canonical.push_back(ec ? path : canonical);
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  for (const std::string& include : includes)
    collect_layers((dir / include).lexically_normal().string(), chain, layers);
  chain.paths.pop_back();
  chain.canonical.pop_back();
  layers.push_back(std::move(layer));
}

// The layers applied in order, then the overrides; derived defaults; validation.
Config resolve(const std::vector<Layer>& layers, const std::string& source,
               const std::vector<std::string>& overrides) {
  Config c;
  c.source = source;
  for (const Layer& layer : layers) read_document(layer.root, c, layer.shown, layer.path);
  for (const std::string& o : overrides)
    c.provenance[full_name(*apply_override(o, c, source))] = kFromOverride;
  // Keys whose default depends on other keys take it unless a file or an override sets them.
  auto given = [&](const char* name) { return c.provenance.count(name) > 0; };
  // model.tie_embeddings defaults by architecture (an unknown arch is rejected by validate).
  if (!given("model.tie_embeddings")) c.model.tie_embeddings = !c.model.is_llama();
  // On GPUs each tensor rank's LM-head rows are padded to a multiple of 128 (tensor-core tiles).
  if (!given("model.vocab_multiple") && c.train.device == "cuda") c.model.vocab_multiple = 128;
  validate(c, source);
  return c;
}

}  // namespace

// -------------------------------------------------------------------------------------------
// Public API

Config parse_config(const std::string& toml_text, const std::string& source,
                    const std::vector<std::string>& overrides) {
  std::vector<Layer> layers;
  layers.push_back(Layer{parse_toml(toml_text, source), source, source});
  return resolve(layers, source, overrides);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  return load_configs({path}, overrides);
}

Config load_configs(const std::vector<std::string>& paths,
                    const std::vector<std::string>& overrides) {
  if (paths.empty()) throw Error("no config file given (--config FILE)");
  std::vector<Layer> layers;
  std::string source;
  for (const std::string& path : paths) {
    IncludeChain chain;
    collect_layers(path, chain, layers);
    source += (source.empty() ? "" : ", ") + path;
  }
  return resolve(layers, source, overrides);
}

std::string Config::to_toml() const {
  std::string out;
  std::string_view section;
  for (const Key& key : kKeys) {
    if (key.section != section) {
      if (!section.empty()) out += "\n";
      section = key.section;
      out.append("[").append(section).append("]\n");
    }
    out.append(key.name).append(" = ");
    out += visit_field(key, *this, [](const auto& v) { return value_text(v); });
    out += "\n";
  }
  return out;
}

std::string Config::to_toml_with_provenance() const {
  std::string out = "# Resolved config: every key, defaults included; a comment names the file or\n"
                    "# override that set a value. Sources: " + printable_line(source) + "\n\n";
  const Config defaults;
  std::string_view section;
  for (const Key& key : kKeys) {
    if (key.section != section) {
      if (!section.empty()) out += "\n";
      section = key.section;
      out.append("[").append(section).append("]\n");
    }
    const std::string value = visit_field(key, *this, [](const auto& v) { return value_text(v); });
    out.append(key.name).append(" = ").append(value);
    const auto set_by = provenance.find(full_name(key));
    if (set_by != provenance.end()) {
      out += set_by->second == kFromOverride ? "  # --set" : "  # from " + printable_line(set_by->second);
    } else if (value != visit_field(key, defaults, [](const auto& v) { return value_text(v); })) {
      out += "  # derived from other keys";
    }
    out += "\n";
  }
  return out;
}

namespace config {

const std::vector<KeyReference>& key_reference() {
  static const std::vector<KeyReference> reference = [] {
    std::vector<KeyReference> r;
    const Config defaults;
    for (const Key& key : kKeys) {
      KeyReference k;
      k.name = full_name(key);
      k.type = kind_name(static_cast<int>(key.access.index()));
      k.default_toml = visit_field(key, defaults, [](const auto& v) { return value_text(v); });
      k.constraints = rule_text(key.rule, "`");
      if (key.access.index() == kIntList && !k.constraints.empty())
        k.constraints = "entries " + k.constraints;
      if (key.access.index() == kFloat)
        k.constraints = k.constraints.empty() ? "finite" : k.constraints + ", finite";
      if (!key.why.empty()) k.constraints += " (" + std::string(key.why) + ")";
      if (!key.relations.empty())
        k.constraints += (k.constraints.empty() ? "" : "; ") + std::string(key.relations);
      k.meaning = key.meaning;
      r.push_back(std::move(k));
    }
    return r;
  }();
  return reference;
}

std::string reference_markdown() {
  std::string s = "| Key | Type | Default | Constraints | Meaning |\n|---|---|---|---|---|\n";
  for (const KeyReference& k : key_reference())
    s += "| `" + k.name + "` | " + k.type + " | `" + k.default_toml + "` | " + k.constraints +
         " | " + k.meaning + " |\n";
  return s;
}

std::string toml_float(double v) {
  if (std::isnan(v)) return std::signbit(v) ? "-nan" : "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, in scientific form: "-d.ddde-XX".
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  std::string out;
  if (sci.front() == '-') {
    out = "-";
    sci.remove_prefix(1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char ch : sci.substr(0, e_pos))
    if (ch != '.') digits += ch;
  int exp = 0;
  std::string_view exp_text = sci.substr(e_pos + 1);
  if (exp_text.front() == '+') exp_text.remove_prefix(1);
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exp);
  const int n = static_cast<int>(digits.size());  // value = 0.d1d2...dn * 10^(exp + 1)
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (n <= exp + 1) {
        out += digits + std::string(static_cast<size_t>(exp + 1 - n), '0') + ".0";
      } else {
        out += digits.substr(0, static_cast<size_t>(exp + 1)) + "." +
               digits.substr(static_cast<size_t>(exp + 1));
      }
    } else {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    out += "e" + std::to_string(exp);
  }
  return out;
}

std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"') out += "\\\"";
    else if (ch == '\\') out += "\\\\";
    else out += printable_line(std::string_view(&ch, 1));  // control characters escaped
  }
  return out + "\"";
}

}  // namespace config
}  // namespace trident
