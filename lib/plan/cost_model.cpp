// The cost model (docs/plan.md has every formula with its reason). Times are seconds of one
// training step on one device; memory is bytes on one device.
#include "plan/cost_model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "grid/grid.hpp"
#include "model/architecture.hpp"
#include "model/model_stats.hpp"
#include "pipeline/simulator.hpp"
#include "pipeline/stage_split.hpp"
#include "util/error.hpp"

namespace trident {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// kOptimizerBytesPerParam (plan/hardware.hpp); bf16 adds the refreshed compute copy: 2 bytes
// written in the AdamW pass where the rank owns all its parameters, else (ZeRO-1 over several
// replicas) a pass of its own over the gathered weights, 4 read and 2 written.

// Bytes of a stored activation (and of the compute copy's element): bf16's 2 on a GPU; 4 on a
// CPU, whose bf16 holds bf16 values in fp32 storage (model/cpu_bf16_kernels.hpp).
double activation_element_bytes(const std::string& precision, const HardwareSpec& hw) {
  return precision == "bf16" && hw.device.kind == "gpu" ? 2.0 : 4.0;
}

// Bytes a parameter of the packed bf16 copy of the weights that the CPU's oneDNN engine of
// train.precision = "bf16" reads its products' weights from (model/cpu_bf16_kernels.hpp):
// train.cpu_bf16_gemm = "auto" runs that engine where the core multiplies bf16 faster than fp32
// (AMX, or dot products that outrun the FMAs), i.e. where the hardware's bf16 peak is above its
// fp32 peak (bench-hw measures it so on such a core); else the FMA engine, none.
double packed_weight_bytes(const std::string& precision, const HardwareSpec& hw) {
  return precision == "bf16" && hw.device.kind == "cpu" &&
                 hw.device.peak_tflops_bf16 > hw.device.peak_tflops_fp32
             ? 2.0
             : 0.0;
}

// The model with its MoE layers' MLPs dense (model.moe_experts = 0): a dense layer's figures.
ModelConfig dense_of(const ModelConfig& m) {
  ModelConfig d = m;
  d.moe_experts = 0;
  return d;
}

// The model as one context rank sees its tokens: model.seq_len / CP of each sequence. The
// activation counts (model_stats.hpp) take their rows N = micro_batch x seq_len from it; the
// attention still spans the whole sequence (its FLOPs per token, a materialized row's T).
ModelConfig context_local(const ModelConfig& m, int64_t cp) {
  ModelConfig local = m;
  local.seq_len = m.seq_len / cp;
  return local;
}

// The trainer's ActivationShape for a layout (fp32 statistics and saved attention state on
// both backends).
ActivationShape activation_shape(const ModelConfig& m, bool materialized_attention,
                                 int64_t micro_batch, int64_t tp, bool sequence_parallel,
                                 Recompute recompute, double element_bytes) {
  ActivationShape s;
  s.micro_batch = micro_batch;
  s.tp = tp;
  s.sequence_parallel = sequence_parallel;
  s.recompute = recompute;
  s.element_bytes = static_cast<int64_t>(element_bytes);
  s.stat_bytes = 4;
  s.attention_saved_per_row = materialized_attention ? m.seq_len : 1;
  s.attention_saved_bytes = 4;
  return s;
}

// One virtual stage (a chunk): its layers and whether it holds the embedding / the LM head.
struct Chunk {
  int64_t layer_begin = 0, layers = 0;
  bool embedding = false, head = false;
};

std::vector<Chunk> virtual_stages(const ModelConfig& m, const Layout& l) {
  const int k = static_cast<int>(l.pp * l.virtual_stages);
  const std::vector<int64_t> counts = l.virtual_stages == 1
                                          ? stage_split(m, k, {}, l.balance)
                                          : stage_layer_counts(m.layers, k, {});
  std::vector<Chunk> chunks;
  int64_t begin = 0;
  for (int i = 0; i < k; ++i) {
    chunks.push_back({begin, counts[i], i == 0, i == k - 1});
    begin += counts[i];
  }
  return chunks;
}

// MoE layers (ModelConfig::is_moe_layer) among a chunk's layers.
int64_t moe_layers_in(const ModelConfig& m, const Chunk& c) {
  int64_t n = 0;
  for (int64_t l = c.layer_begin; l < c.layer_begin + c.layers; ++l) n += m.is_moe_layer(l) ? 1 : 0;
  return n;
}

// Elements of a chunk's flat parameter buffer on one tensor rank, from the trainer's own
// layout, measured on one-layer shards: a dense layer's share, a MoE layer's apart (its
// experts' stacked tensors, which expert parallelism splits over EP ranks, and the rest:
// attention, norms, router), and the embedding's and the head's extras. A chunk with both
// shares a tied head with the embedding, hence its own figure.
struct ChunkParams {
  double dense_layer = 0, moe_shared = 0, moe_experts = 0;
  double embedding = 0, head = 0, both = 0;
  // The experts' elements of chunk c on one rank of an expert group of `ep`.
  double experts_of(const ModelConfig& m, const Chunk& c, int64_t ep) const {
    return moe_experts / static_cast<double>(ep) * static_cast<double>(moe_layers_in(m, c));
  }
  double of(const ModelConfig& m, const Chunk& c, int64_t ep) const {
    const double ends = c.embedding && c.head ? both
                        : c.embedding         ? embedding
                        : c.head              ? head
                                              : 0.0;
    const double moe = static_cast<double>(moe_layers_in(m, c));
    return dense_layer * (static_cast<double>(c.layers) - moe) + moe_shared * moe +
           experts_of(m, c, ep) + ends;
  }
  // ZeRO-2/3's units (Layout::zero_stage): a layer, its experts a unit of their own under
  // EP > 1; the embedding; the LM head with the final norm (a chunk with both ends holds the
  // embedding, tied head included, and the rest as the head's unit).
  double moe_unit(int64_t ep) const {
    return ep > 1 ? std::max(moe_shared, moe_experts / static_cast<double>(ep))
                  : moe_shared + moe_experts;
  }
  double head_unit(const Chunk& c) const {
    return c.embedding ? both - embedding : head;
  }
  // The largest unit of chunk c, in elements.
  double largest_unit(const ModelConfig& m, const Chunk& c, int64_t ep) const {
    const double moe = static_cast<double>(moe_layers_in(m, c));
    double unit = static_cast<double>(c.layers) > moe ? dense_layer : 0.0;
    if (moe > 0) unit = std::max(unit, moe_unit(ep));
    if (c.embedding) unit = std::max(unit, embedding);
    if (c.head) unit = std::max(unit, head_unit(c));
    return unit;
  }
  // The unit a chunk's forward starts with and its backward ends with: the embedding, or the
  // chunk's first layer (without its experts under EP > 1, a unit of their own).
  double first_unit(const ModelConfig& m, const Chunk& c, int64_t ep) const {
    if (c.embedding) return embedding;
    if (!m.is_moe_layer(c.layer_begin)) return dense_layer;
    return ep > 1 ? moe_shared : moe_shared + moe_experts;
  }
  // The units of chunk c.
  double units(const ModelConfig& m, const Chunk& c, int64_t ep) const {
    const double moe = static_cast<double>(moe_layers_in(m, c));
    return static_cast<double>(c.layers) + (ep > 1 ? moe : 0.0) + (c.embedding ? 1.0 : 0.0) +
           (c.head ? 1.0 : 0.0);
  }
};

ChunkParams chunk_params(const ModelConfig& m, int64_t tp) {
  struct Flat {
    double all = 0, experts = 0;
  };
  auto flat = [&](int64_t layer, bool emb, bool head) {
    ModelShard s;
    s.tp_size = static_cast<int>(tp);
    s.layer_begin = layer;
    s.layer_end = layer + 1;
    s.has_embedding = emb;
    s.has_head = head;
    const ParamLayout pl = parameter_layout(m, s);
    Flat f{static_cast<double>(pl.flat_size), 0.0};
    for (const ParamInfo& p : pl.params)
      if (p.name.find(".mlp.experts.") != std::string::npos) f.experts += static_cast<double>(p.numel());
    return f;
  };
  // Layer 0 is a MoE layer whenever the model has any; layer 1 dense when the interval is > 1.
  const Flat first = flat(0, false, false);
  ChunkParams r;
  if (m.moe_experts > 0) {
    r.moe_shared = first.all - first.experts;
    r.moe_experts = first.experts;
    if (m.moe_layer_interval > 1 && m.layers > 1) r.dense_layer = flat(1, false, false).all;
  } else {
    r.dense_layer = first.all;
  }
  r.embedding = flat(0, true, false).all - first.all;
  r.head = flat(0, false, true).all - first.all;
  r.both = flat(0, true, true).all - first.all;
  return r;
}

// Seconds of one chunk's forward and backward for one micro-batch, with the parts the step
// time reports apart.
struct ChunkCost {
  double forward = 0, backward = 0;  // everything on the op: compute + TP, EP and CP communication
  double weight = 0;                 // the weight-gradient matmuls inside `backward` (zb-h1/h2)
  double tp_comm = 0;                // TP communication inside forward + backward
  double ep_comm = 0;                // EP all-to-alls inside forward + backward
  double cp_comm = 0;                // the CP ring's exposed transfers inside forward + backward
  double cp_ring = 0;                // all the CP ring's transfers, hidden or not
  // FP8 layers' parts (LayerModel's), inside the figures above.
  double fp8_gemm = 0, fp8_quantise_bytes = 0, fp8_quantise = 0, fp8_amax_count = 0,
         fp8_amax = 0;
  // The compute inside forward + backward by part (Prediction::compute_*_seconds).
  double gemm = 0, attention = 0, memory = 0, head = 0;

  // A stage's cost per micro-batch: the sum of its chunks'.
  ChunkCost& operator+=(const ChunkCost& o) {
    forward += o.forward, backward += o.backward, weight += o.weight;
    tp_comm += o.tp_comm, ep_comm += o.ep_comm, cp_comm += o.cp_comm, cp_ring += o.cp_ring;
    fp8_gemm += o.fp8_gemm, fp8_quantise_bytes += o.fp8_quantise_bytes;
    fp8_quantise += o.fp8_quantise, fp8_amax_count += o.fp8_amax_count;
    fp8_amax += o.fp8_amax;
    gemm += o.gemm, attention += o.attention, memory += o.memory, head += o.head;
    return *this;
  }
};

struct LayerModel {
  double fwd_compute = 0, bwd_compute = 0, weight = 0, fwd_comm = 0, bwd_comm = 0;
  double fwd_ep = 0, bwd_ep = 0;  // a MoE layer's all-to-alls (EP > 1)
  double fwd_cp = 0, bwd_cp = 0;  // the CP ring's exposed transfers (CP > 1)
  double cp_ring = 0;             // the CP ring's transfers, forward + backward, hidden or not
  // An FP8 layer's (train.precision = "fp8"), inside the figures above: its linear GEMMs'
  // seconds, its quantisation passes' bytes and seconds, its amax all-reduces (those over a
  // group of more than one rank) and their seconds.
  double fp8_gemm = 0, fp8_quantise_bytes = 0, fp8_quantise = 0, fp8_amax_count = 0,
         fp8_amax = 0;
  // Its compute (fwd_compute + bwd_compute) by part: linear GEMMs, attention core, the rest
  // (memory-bound passes), recomputation's reruns included.
  double gemm = 0, attention = 0, memory = 0;
};

// An FP8 layer's quantisation traffic for one micro-batch on one tensor rank, in elements
// (Fp8Linear, model/fp8_linear.hpp). Each of the four GEMMs (rows N, input width Cin, output
// width OC, W weights: qkv, attention output, MLP up and down; a MoE layer's up and down are
// the experts', over the rows routed to the rank's W = E/EP experts) quantises in forward its
// input x [N, Cin] and weights w [W, OC, Cin], in backward its output gradient dy [N, OC] and
// again x (for dW) and w (for dX); the split backward (zb-h1/h2) quantises dy once in each half
// of a GEMM it defers (not a MoE layer's experts). Each quantisation is an amax pass (reads
// the tensor) and a quantise pass (reads it, writes the copy).
struct Fp8Traffic {
  double forward = 0;   // x and w: sum N Cin + OC Cin
  double backward = 0;  // dy, x and w: sum N OC + N Cin + OC Cin
  double weight = 0;    // what the split backward's weight half quantises: dy and x
  double dy = 0;        // sum N OC: the split backward's second dy
  double gradient = 0;  // sum N OC over the four (the experts' too): the output gradients
};

class CostModel {
 public:
  CostModel(const PlanProblem& p, const Layout& l)
      : p_(p), l_(l), m_(p.model), local_(context_local(p.model, l.cp)), hw_(p.hw),
        base_(p.base_precision()),
        e_(activation_element_bytes(base_, p.hw)),
        vp_(padded_vocab_size(m_, static_cast<int>(l.tp))),
        parts_(training_flops_parts(m_, vp_)),
        dense_linear_(training_flops_parts(dense_of(m_), vp_).layer_linear),
        peak_(hw_.peak_flops(p.precision)),
        fp8_peak_(p.fp8() ? hw_.fp8_gemm_flops() : 0.0),
        n_(static_cast<double>(l.micro_batch * local_.seq_len)),
        t_(static_cast<double>(l.tp)) {}

  // One transformer layer, one micro-batch, one tensor rank: a dense one, or (`moe`) one
  // whose MLP is the experts behind the router; (`fp8`) its linear layers (the experts', not
  // the router) multiply FP8 operands (train.precision = "fp8", docs/plan.md "FP8").
  LayerModel layer(bool moe, bool fp8 = false) const {
    const double C = static_cast<double>(m_.width), T = static_cast<double>(m_.seq_len);
    const double HS = static_cast<double>(m_.head_size());
    const double H = static_cast<double>(m_.heads) * HS;
    const double QKV = static_cast<double>(m_.heads + 2 * m_.kv_head_count()) * HS;
    const double F = static_cast<double>(m_.ffn_size());
    const double U = m_.is_llama() ? 2.0 * F : F;
    // The linear layers' efficiency: their shapes weighted by their FLOPs.
    const double shapes[4][3] = {{n_, C, QKV / t_}, {n_, H / t_, C}, {n_, C, U / t_},
                                 {n_, F / t_, C}};
    double flops = 0, time = 0;
    for (const auto& s : shapes) {
      const double f = s[0] * s[1] * s[2];
      flops += f;
      time += f / hw_.gemm_efficiency(s[0], s[1], s[2], base_);
    }
    const double eff_linear = flops / time;
    // Under CP a rank's attention is CP ring steps of T/CP query rows against T/CP keys.
    const double eff_attention =
        hw_.attention_efficiency(T / static_cast<double>(l_.cp), HS, base_);
    // The part of the attention's time its forward takes (measured: not the FLOPs' third where
    // the softmax's exponentials and per-call costs weigh, HardwareSpec::attention_forward_share).
    const double fwd_share =
        hw_.attention_forward_share(T / static_cast<double>(l_.cp), HS, base_);
    // An FP8 layer's GEMMs (forward and both backward ones) at the FP8 rate on the same curve.
    const double linear_peak = fp8 ? fp8_peak_ : peak_;
    double linear = dense_linear_ * n_ / t_ / (linear_peak * eff_linear);
    double router = 0.0;  // a MoE layer's router GEMMs, in the base precision
    const double attention = parts_.layer_attention * n_ / t_ / (peak_ * eff_attention);
    // Memory-bound work (norms, activations, softmax, residual adds): each stashed byte is
    // written once in forward and read twice in backward (its own op's backward and the
    // gradient it produces).
    // (A MoE layer's expert-side rows are the rows routed to the rank's experts, N K on
    // average, not the N K EP its buffers are sized for.)
    ActivationShape none = shape(Recompute::None);
    none.expert_parallel = 1;
    // The norms' outputs and the MLP activation are recomputed rather than kept: still
    // written (twice) and read.
    double stash = static_cast<double>(layer_activation_bytes(local_, none) +
                                       recomputed_activation_bytes(local_, none));
    // The weight-gradient matmuls a split backward (zb-h1/h2) defers: a MoE layer's experts and
    // router are never deferred (docs/moe.md), its attention's are.
    double deferred = linear / 3.0;
    if (moe) {
      router = gemm_seconds(n_, C, static_cast<double>(m_.moe_experts), 1.0, peak_);
      linear = moe_linear_seconds(shapes[0], shapes[1], linear_peak) + router;
      deferred = attention_linear_seconds(shapes[0], shapes[1], linear_peak) / 3.0;
      // The router's, the permutation's and the experts' rows: the trainer's own count.
      stash += static_cast<double>(moe_layer_extra_bytes(local_, none));
    }
    const double bw = hw_.memory_bytes_per_s();
    // Materialized attention also streams its scores [N, NH/TP, T] (fp32, as the probabilities
    // are kept) through passes the stash does not count: the softmax reads the scores the
    // QK^T GEMM wrote (forward), the softmax backward reads dP and writes dS (backward); the
    // probabilities' own write and reads are stash bytes above. Selective recomputation reruns
    // the forward's (scores read, probabilities written); full reruns the whole forward.
    const double scores = p_.materialized_attention()
                              ? n_ * static_cast<double>(m_.heads) / t_ * T * 4.0
                              : 0.0;
    LayerModel r;
    const double attention_fwd = attention * fwd_share;
    r.fwd_compute = linear / 3.0 + attention_fwd + (stash + scores) / bw;
    r.bwd_compute = 2.0 * linear / 3.0 + (attention - attention_fwd) + 2.0 * (stash + scores) / bw;
    r.weight = deferred;
    if (fp8) {
      // The quantisation passes at the memory bandwidth: an element costs e (the amax pass's
      // read) + e (the quantise pass's read) + q (its write), e the base precision's element
      // and q the quantised one's: 2 + 2 + 1 = 5 bytes on a GPU (bf16 in, FP8 out), 4 + 4 + 4
      // = 12 on the CPU reference (its copies are fp32). The delayed recipe's scale is known
      // before the pass, so a GPU takes the amax in it: 2 + 1 = 3 bytes (the CPU reference
      // still runs its amax pass). The GEMMs' own reads of the copies are the GEMMs' time.
      const Fp8Traffic q = fp8_traffic(fp8_gemms(shapes, moe));
      const bool fused_amax = p_.fp8_delayed && hw_.device.kind == "gpu";
      const double per_element = (fused_amax ? 1.0 : 2.0) * e_ + hw_.fp8_element_bytes();
      const bool split = splits_backward(l_.schedule);
      double elements = q.forward + q.backward + (split ? q.dy : 0.0);
      r.fwd_compute += per_element * q.forward / bw;
      r.bwd_compute += per_element * (q.backward + (split ? q.dy : 0.0)) / bw;
      if (split) r.weight += per_element * q.weight / bw;
      if (l_.recompute == Recompute::Full) elements += q.forward;  // the rerun forward's
      // A GPU writes the output gradient's codes in two layouts in the one pass where a
      // backward takes both halves (row-major for dX, transposed for dW: model/fp8_linear.hpp);
      // the split backward's halves quantise it once each (counted above).
      const double second_layout =
          hw_.device.kind == "gpu" && !split ? hw_.fp8_element_bytes() * q.gradient : 0.0;
      r.bwd_compute += second_layout / bw;
      r.fp8_gemm = linear - router;
      r.fp8_quantise_bytes = per_element * elements + second_layout;
      r.fp8_quantise = r.fp8_quantise_bytes / bw;
    }
    // Dropout on materialized probabilities (PlanProblem::attention_dropout, another system's;
    // Trident has none): forward reads the probabilities and writes the dropped ones and a
    // one-byte mask, backward reads the gradient and the mask and writes the gradient, (2 e + 1)
    // bytes per element of [N, NH/TP, T] each way; recomputation reruns forward's.
    const double dropout = p_.attention_dropout && p_.materialized_attention()
                               ? n_ * static_cast<double>(m_.heads) / t_ * T * (2.0 * e_ + 1.0)
                               : 0.0;
    r.fwd_compute += dropout / bw;
    r.bwd_compute += dropout / bw;
    if (l_.recompute == Recompute::Selective) r.bwd_compute += dropout / bw;
    if (l_.recompute == Recompute::Full) r.bwd_compute += r.fwd_compute;
    if (l_.recompute == Recompute::Selective) r.bwd_compute += attention_fwd + 2.0 * scores / bw;
    const bool full = l_.recompute == Recompute::Full;
    r.gemm = linear * (full ? 4.0 / 3.0 : 1.0);
    r.attention = attention + (l_.recompute == Recompute::None ? 0.0 : attention_fwd);
    r.memory = r.fwd_compute + r.bwd_compute - r.gemm - r.attention;
    // Two all-reduces (or all-gather + reduce-scatter pairs under SP, the same bytes) of the
    // [N, C] stream in forward, two in backward; full recompute reruns forward's.
    const double stream = n_ * C * e_;
    const double one = l_.sequence_parallel ? tp_seconds(Collective::AllGather, stream) +
                                                  tp_seconds(Collective::ReduceScatter, stream)
                                            : tp_seconds(Collective::AllReduce, stream);
    r.fwd_comm = 2.0 * one;
    r.bwd_comm = 2.0 * one + (l_.recompute == Recompute::Full ? 2.0 * one : 0.0);
    // Under SP the two norm outputs, recomputed in backward rather than stashed, are gathered
    // again for the column-parallel weight gradients.
    if (l_.sequence_parallel) r.bwd_comm += 2.0 * tp_seconds(Collective::AllGather, stream);
    if (moe) {
      // The gate weights' gradient dot(dout, y) is summed over the tensor group (fp32, N x K).
      r.bwd_comm += tp_seconds(Collective::AllReduce, n_ * static_cast<double>(m_.moe_top_k) * 4.0);
      // Expert parallelism: forward exchanges the per-expert row counts, sends the routed
      // rows to their experts' owners and the outputs back (two all-to-alls of the rank's
      // R = moe_routed_rows rows of C elements, (EP-1)/EP of them leaving the rank); backward
      // the output gradients and the input gradients the same way; full recomputation reruns
      // forward's. Every tensor rank of the group exchanges its whole rows (the router's
      // dispatch is replicated over TP).
      const double rows = moe_routed_rows(local_, l_.micro_batch);
      const double a2a = all_to_all_seconds(hw_, ep_link(), l_.ep, rows * C * e_);
      const double counts = all_to_all_seconds(hw_, ep_link(), l_.ep,
                                               8.0 * static_cast<double>(m_.moe_experts));
      r.fwd_ep = 2.0 * a2a + counts;
      r.bwd_ep = 2.0 * a2a + (l_.recompute == Recompute::Full ? r.fwd_ep : 0.0);
    }
    if (l_.cp > 1) ring(attention_fwd, attention - attention_fwd, r);
    if (fp8 && !p_.fp8_delayed) fp8_amax(r, moe);
    return r;
  }

  // An FP8 GEMM of a layer as Fp8Traffic counts it: rows, input and output widths, weights,
  // and whether a split backward defers its weight gradient.
  struct Fp8GemmShape {
    double rows, in, out, weights;
    bool deferred;
  };
  // The four FP8 GEMMs of a layer from the linear layers' shapes {N, Cin, OC}: a MoE layer's
  // MLP is its experts', over the rows routed to this rank's E/EP experts (moe_routed_rows:
  // N K on average whatever EP), and never deferred.
  std::array<Fp8GemmShape, 4> fp8_gemms(const double (&shapes)[4][3], bool moe) const {
    std::array<Fp8GemmShape, 4> g;
    for (size_t i = 0; i < 4; ++i) g[i] = {shapes[i][0], shapes[i][1], shapes[i][2], 1.0, true};
    if (moe) {
      const double rows = moe_routed_rows(local_, l_.micro_batch);
      const double experts = static_cast<double>(m_.moe_experts / l_.ep);
      for (size_t i = 2; i < 4; ++i) g[i] = {rows, shapes[i][1], shapes[i][2], experts, false};
    }
    return g;
  }
  static Fp8Traffic fp8_traffic(const std::array<Fp8GemmShape, 4>& gemms) {
    Fp8Traffic t;
    for (const Fp8GemmShape& g : gemms) {
      const double x = g.rows * g.in, w = g.weights * g.out * g.in, dy = g.rows * g.out;
      t.forward += x + w;
      t.backward += dy + x + w;
      t.gradient += dy;
      if (!g.deferred) continue;
      t.weight += dy + x;
      t.dy += dy;
    }
    return t;
  }

  // An FP8 layer's amax all-reduces (MAX; Fp8Linear): every quantised tensor's over the
  // tensor group, an activation's or gradient's also over the context group. Per GEMM forward
  // x, w (2, 1 of them activations), backward dy, x, w (3, 2), the split backward's second dy
  // (1, 1) where it defers the GEMM (not a MoE layer's experts); four GEMMs; full recomputation
  // reruns the forward's. An expert GEMM's reduction carries one float per block of rows
  // (E/EP experts x EP sources) or expert: still latency-bound, counted as one float.
  // collective_seconds of 4 bytes, on the group's link.
  void fp8_amax(LayerModel& r, bool moe) const {
    const double tensor = tp_seconds(Collective::AllReduce, 4.0);
    const double context = collective_seconds(hw_, cp_link(), Collective::AllReduce, l_.cp, 4.0);
    const bool split = splits_backward(l_.schedule), full = l_.recompute == Recompute::Full;
    const double deferred = split ? (moe ? 2.0 : 4.0) : 0.0;
    const double fwd_t = 4.0 * 2.0, fwd_c = 4.0 * 1.0;
    const double bwd_t = 4.0 * 3.0 + deferred + (full ? fwd_t : 0.0);
    const double bwd_c = 4.0 * 2.0 + deferred + (full ? fwd_c : 0.0);
    r.fwd_comm += fwd_t * tensor;
    r.bwd_comm += bwd_t * tensor;
    r.fwd_cp += fwd_c * context;
    r.bwd_cp += bwd_c * context;
    r.fp8_amax = (fwd_t + bwd_t) * tensor + (fwd_c + bwd_c) * context;
    r.fp8_amax_count = (l_.tp > 1 ? fwd_t + bwd_t : 0.0) + (l_.cp > 1 ? fwd_c + bwd_c : 0.0);
  }

  // The quantised copies' scratch an FP8 rank holds once (the largest input, weight and
  // output gradient of its GEMMs, the experts' at the most rows they may receive):
  // model_stats' count, the trainer's own: the CPU reference's values, or a GPU's one-byte
  // codes with the output gradient's in two layouts (the backward's transposed operands).
  double fp8_scratch_bytes() const {
    ActivationShape q = shape(Recompute::None);
    q.fp8 = true;
    q.fp8_codes = hw_.device.kind == "gpu";
    q.element_bytes = static_cast<int64_t>(hw_.fp8_element_bytes());
    return static_cast<double>(trident::fp8_scratch_bytes(local_, q));
  }

  // The model's layers among chunk c's whose linear GEMMs run in FP8.
  int64_t fp8_layers_in(const Chunk& c) const {
    int64_t n = 0;
    for (int64_t l = c.layer_begin; l < c.layer_begin + c.layers; ++l) n += p_.fp8_covers(l);
    return n;
  }

  // The context ring of one layer (CP > 1) over the seconds of the rank's attention forward and
  // backward. Forward: CP steps, each the attention of the local queries against one K/V block
  // (the causal load balance makes them equal, the diagonal one aside); during each of the
  // first CP - 1 the next block arrives from the previous rank, hidden where the step's
  // attention covers it, the excess exposed.
  // Backward: CP steps; during each of the first CP - 1 the next K/V block and the dK/dV
  // accumulator of the block just done travel together (two blocks), and the last
  // accumulator, which brings each block's dK/dV home, has no step left to hide behind.
  // Recomputation (selective or full) reruns the attention forward, its ring included.
  void ring(double attention_forward, double attention_backward, LayerModel& r) const {
    const double cp = static_cast<double>(l_.cp);
    const double block = collective_seconds(hw_, cp_link(), Collective::SendRecv, 2,
                                            ring_block_bytes());
    const double step_forward = attention_forward / cp, step_backward = attention_backward / cp;
    r.fwd_cp = (cp - 1.0) * std::max(0.0, block - step_forward);
    r.bwd_cp = (cp - 1.0) * std::max(0.0, 2.0 * block - step_backward) + block;
    r.cp_ring = (cp - 1.0) * block + (2.0 * cp - 1.0) * block;
    if (l_.recompute != Recompute::None) {
      r.bwd_cp += r.fwd_cp;
      r.cp_ring += (cp - 1.0) * block;
    }
  }

  // One K/V block of the ring: the k and v of the rank's tokens (micro_batch x T/CP) and of its
  // KVH/TP key/value heads, in activation elements.
  double ring_block_bytes() const {
    return n_ * 2.0 * static_cast<double>(m_.kv_head_count()) / t_ *
           static_cast<double>(m_.head_size()) * e_;
  }

  // The context group's link: CP ranks TP apart (grid/grid.hpp), so TP x CP consecutive ranks.
  const LinkSpec& cp_link() const {
    return l_.tp * l_.cp <= hw_.devices_per_node ? hw_.intra_node : hw_.inter_node;
  }

  // The trainer's ActivationShape of the layout under `recompute`; its rows come from
  // local_ (the rank's T/CP tokens of each sequence).
  ActivationShape shape(Recompute recompute) const {
    ActivationShape s = activation_shape(m_, p_.materialized_attention(), l_.micro_batch, l_.tp,
                                         l_.sequence_parallel, recompute, e_);
    s.expert_parallel = l_.ep;
    return s;
  }
  const ModelConfig& local() const { return local_; }

  // A MoE layer's linear layers, one micro-batch, one tensor rank: attention's qkv and
  // projection at their shapes; the experts' two (llama: gate_up, down) over the routed rows,
  // each expert's GEMM of rows R EP / E (balanced: a rank's E/EP experts take the R rows of
  // each of the EP ranks), split over TP like the dense MLP; the router [N, C] x [C, E],
  // replicated on every tensor rank. Training FLOPs 3 x forward.
  // A MoE layer's attention and expert GEMMs at `peak` (the router's apart).
  double moe_linear_seconds(const double (&qkv)[3], const double (&proj)[3], double peak) const {
    const double C = static_cast<double>(m_.width), F = static_cast<double>(m_.ffn_size());
    const double U = m_.is_llama() ? 2.0 * F : F;
    const double E = static_cast<double>(m_.moe_experts);
    const double rows = moe_routed_rows(local_, l_.micro_batch);
    const double per_expert = rows * static_cast<double>(l_.ep) / E;
    const double experts_local = E / static_cast<double>(l_.ep);
    return attention_linear_seconds(qkv, proj, peak) +
           gemm_seconds(per_expert, C, U / t_, experts_local, peak) +
           gemm_seconds(per_expert, F / t_, C, experts_local, peak);
  }

  double attention_linear_seconds(const double (&qkv)[3], const double (&proj)[3],
                                  double peak) const {
    return gemm_seconds(qkv[0], qkv[1], qkv[2], 1.0, peak) +
           gemm_seconds(proj[0], proj[1], proj[2], 1.0, peak);
  }

  // Training seconds (3 x forward) of `count` GEMMs of m x k x n at their shape's efficiency
  // of `peak`.
  double gemm_seconds(double m, double k, double n, double count, double peak) const {
    return 3.0 * 2.0 * m * k * n * count / (peak * hw_.gemm_efficiency(m, k, n, base_));
  }

  // The expert group's link: EP data ranks of a (tp, cp, pp) column, TP x CP x PP apart
  // (grid/grid.hpp).
  const LinkSpec& ep_link() const {
    return l_.tp * l_.cp * l_.pp * l_.ep <= hw_.devices_per_node ? hw_.intra_node
                                                                  : hw_.inter_node;
  }

  // A chunk of layers of each kind: dense or MoE, in the base precision or (the layers
  // train.precision = "fp8" covers) in FP8.
  struct LayerKinds {
    LayerModel dense, moe, fp8, fp8_moe;
  };
  ChunkCost chunk(const Chunk& c, const LayerKinds& kinds) const {
    ChunkCost r;
    double Lm = 0, Lf = 0, Lfm = 0;
    for (int64_t l = c.layer_begin; l < c.layer_begin + c.layers; ++l) {
      const bool moe = m_.is_moe_layer(l), fp8 = p_.fp8_covers(l);
      if (fp8 && moe)
        Lfm += 1;
      else if (fp8)
        Lf += 1;
      else if (moe)
        Lm += 1;
    }
    const double Ld = static_cast<double>(c.layers) - Lm - Lf - Lfm;
    auto add = [&r](double L, const LayerModel& layer) {
      r.forward += L * (layer.fwd_compute + layer.fwd_comm + layer.fwd_ep + layer.fwd_cp);
      r.backward += L * (layer.bwd_compute + layer.bwd_comm + layer.bwd_ep + layer.bwd_cp);
      r.weight += L * layer.weight;
      r.tp_comm += L * (layer.fwd_comm + layer.bwd_comm);
      r.ep_comm += L * (layer.fwd_ep + layer.bwd_ep);
      r.cp_comm += L * (layer.fwd_cp + layer.bwd_cp);
      r.cp_ring += L * layer.cp_ring;
      r.fp8_gemm += L * layer.fp8_gemm;
      r.fp8_quantise_bytes += L * layer.fp8_quantise_bytes;
      r.fp8_quantise += L * layer.fp8_quantise;
      r.fp8_amax_count += L * layer.fp8_amax_count;
      r.fp8_amax += L * layer.fp8_amax;
      r.gemm += L * layer.gemm;
      r.attention += L * layer.attention;
      r.memory += L * layer.memory;
    };
    add(Ld, kinds.dense);
    add(Lm, kinds.moe);
    add(Lf, kinds.fp8);
    add(Lfm, kinds.fp8_moe);
    const double C = static_cast<double>(m_.width);
    const double stream = n_ * C * e_;
    if (c.embedding) {
      // Vocab-parallel lookup: the partial embeddings are summed (reduce-scattered under SP).
      const double comm = tp_seconds(l_.sequence_parallel ? Collective::ReduceScatter
                                                          : Collective::AllReduce, stream);
      r.forward += comm;
      r.tp_comm += comm;
    }
    if (c.head) {
      const double V = static_cast<double>(vp_);
      const double head = parts_.head * n_ / t_ /
                          (peak_ * hw_.gemm_efficiency(n_, C, V / t_, base_));
      // A training forward runs the whole head (Transformer::head_forward), one chunk of rows
      // at a time: the logits GEMM, the softmax, and while the chunk's logits are there their
      // gradient (in place) and the input- and weight-gradient GEMMs; nothing of it is
      // recomputed, and backward only takes the kept input gradient through the final norm.
      // The logits are written, read by the softmax and overwritten by their gradient.
      const double logits = 3.0 * n_ * V / t_ * e_ / hw_.memory_bytes_per_s();
      // The head's input is gathered under SP; the loss sums max, exp-sum and target logit
      // over TP; the input gradient is summed (reduce-scattered) over TP.
      const double comm = (l_.sequence_parallel ? tp_seconds(Collective::AllGather, stream)
                                                : 0.0) +
                          3.0 * tp_seconds(Collective::AllReduce, n_ * 4.0) +
                          tp_seconds(l_.sequence_parallel ? Collective::ReduceScatter
                                                          : Collective::AllReduce, stream);
      r.forward += head + logits + comm;
      r.tp_comm += comm;
      r.head += head + logits;
    }
    return r;
  }

  // Bytes a chunk's stash holds for one micro-batch (LayerActs and the stage's Activations).
  double chunk_stash(const Chunk& c) const {
    const double C = static_cast<double>(m_.width);
    const double Ns = l_.sequence_parallel ? n_ / t_ : n_;
    // The split backward (zb-h1/h2) keeps the linear layers' output gradients (and, under full
    // recomputation, their inputs) from backward_input to backward_weight.
    ActivationShape kept = shape(l_.recompute);
    kept.split_backward = splits_backward(l_.schedule);
    const double layer = static_cast<double>(layer_activation_bytes(local_, kept));
    const double moe = static_cast<double>(moe_layers_in(m_, c));
    double bytes = static_cast<double>(c.layers) * layer + moe * moe_extra_bytes(kept) +
                   Ns * C * e_;  // + the output
    if (c.embedding || c.head) bytes += 2.0 * n_ * 4.0;                   // tokens, targets
    // The final norm's output and statistics, the loss statistics (no logits): the
    // Transformer's activation_bytes.
    const double norm_stats = m_.is_llama() ? 1.0 : 2.0;
    if (c.head) bytes += n_ * C * e_ + 4.0 * (norm_stats * Ns + 4.0 * n_);
    return bytes;
  }

  // A MoE layer's stash beyond a dense layer's (its expert-side rows sized for the most a
  // rank's experts can receive under EP, docs/moe.md), and the MoE block's buffers held once:
  // model_stats' counts, the trainer's own.
  double moe_extra_bytes(const ActivationShape& shape) const {
    return static_cast<double>(moe_layer_extra_bytes(local_, shape));
  }
  double moe_buffer_bytes() const {
    return static_cast<double>(trident::moe_buffer_bytes(local_, shape(Recompute::None)));
  }

  double tp_seconds(Collective c, double bytes) const {
    return collective_seconds(hw_, hw_.intra_node, c, l_.tp, bytes);
  }
  double element_bytes() const { return e_; }
  double head_scratch() const {
    const int64_t local_vocab = vp_ / static_cast<int64_t>(t_);
    return static_cast<double>(
        lm_head_scratch_bytes(static_cast<int64_t>(n_), local_vocab, static_cast<int64_t>(e_), 0,
                              lm_head_chunk_bytes(hw_.device.kind == "gpu")));
  }
  double micro_rows() const { return n_; }
  const TrainingFlopsParts& parts() const { return parts_; }
  double peak() const { return peak_; }

 private:
  const PlanProblem& p_;
  const Layout& l_;
  const ModelConfig& m_;
  ModelConfig local_;  // m_ with the T/CP tokens a context rank holds of each sequence
  const HardwareSpec& hw_;
  std::string base_;  // the precision of everything but FP8 GEMMs (its GEMM grid's)
  double e_;
  int64_t vp_;
  TrainingFlopsParts parts_;
  double dense_linear_;  // a dense layer's linear training FLOPs per token
  double peak_;          // of the base precision: everything but FP8 GEMMs
  double fp8_peak_;      // an FP8 GEMM's (train.precision = "fp8"), else 0
  double n_;  // rows of one micro-batch on the rank: micro_batch * seq_len / CP
  double t_;
};

// The link a group of `span` consecutive-in-stride ranks crosses: intra-node when every member
// shares the node (rank = ((dp * PP + pp) * CP + cp) * TP + tp, grid/grid.hpp).
const LinkSpec& group_link(const HardwareSpec& hw, int64_t extent) {
  return extent <= hw.devices_per_node ? hw.intra_node : hw.inter_node;
}

struct PipelineTimes {
  double makespan = 0, makespan_without_transfers = 0;
};

double simulated_makespan(const Layout& l, int64_t microbatches,
                          const std::vector<std::vector<PipeSimCosts>>& chunk_costs) {
  std::vector<std::vector<PipeOp>> ops;
  for (int s = 0; s < static_cast<int>(l.pp); ++s)
    ops.push_back(pipeline_schedule(l.schedule, s, static_cast<int>(l.pp), microbatches,
                                    static_cast<int>(l.virtual_stages)));
  const PipeSimResult r = simulate_pipeline_per_chunk(ops, microbatches, chunk_costs,
                                                      static_cast<int>(l.virtual_stages));
  if (!r.ok)
    throw Error("internal error: the pipeline simulator rejected " + to_string(l) + ": " +
                r.error);
  return r.makespan;
}

// The activation stashes a stage's executor allocates, per local chunk, in chunk micro-batches:
// it keeps a chunk's stash slots once made and reuses them for that chunk's later micro-batches
// (pipeline/executor.cpp), so it holds each chunk's own peak at once, which under the
// interleaved schedule is more than the schedule's peak in flight (the chunks peak at different
// times). One chunk: schedule_peak_bound. Interleaved: the stage's op list; past the warm-up
// every chunk's count repeats, so min(M, 4 PP) micro-batches (a multiple of PP) give the peaks
// of any longer step (tests/test_plan.cpp compares them).
std::vector<int64_t> stash_slots(const Layout& l, int64_t stage, int64_t microbatches) {
  if (l.virtual_stages == 1)
    return {schedule_peak_bound(l.schedule, static_cast<int>(stage), static_cast<int>(l.pp),
                                microbatches, 1)};
  const int64_t m = std::min(microbatches, 4 * l.pp);
  std::vector<int64_t> now(static_cast<size_t>(l.virtual_stages), 0), peak = now;
  for (const PipeOp& op : pipeline_schedule(l.schedule, static_cast<int>(stage),
                                            static_cast<int>(l.pp), m,
                                            static_cast<int>(l.virtual_stages))) {
    const size_t c = static_cast<size_t>(op.chunk);
    if (op.kind == PipeOpKind::Forward) peak[c] = std::max(peak[c], ++now[c]);
    if (op.kind == PipeOpKind::Backward || op.kind == PipeOpKind::BackwardWeight) --now[c];
  }
  return peak;
}

// ZeRO-1's reduce-scatter staging (grad_sync.cpp): the largest gradient bucket padded to a
// multiple of DP, and its slice, fp32. Buckets are parallel.dp_bucket_mb cut at parameter
// boundaries; the largest is taken as min(dp_bucket_mb, the stage's buffer).
// The ranks sharing a layout's gradients: data x context (CP ranks hold the same weights and
// see different tokens), the group ZeRO-1 shards over.
int64_t gradient_group(const Layout& l) { return l.dp * l.cp; }

double zero1_staging(const PlanProblem& p, const Layout& l, double flat) {
  const int64_t n = gradient_group(l);
  if (l.zero_stage != 1 || n < 2) return 0.0;
  const double bucket = std::min(flat, std::floor(p.dp_bucket_mb * 1024.0 * 1024.0 / 4.0));
  const double slice = std::ceil(bucket / static_cast<double>(n));
  return 4.0 * (slice * static_cast<double>(n) + slice);
}

// A pipeline stage's parameters as the ZeRO stages see them, elements of one rank: all of
// them and the experts' (EP-split), its largest unit, the first unit of each of its chunks
// (the one a chunk's forward starts with and its backward ends with) and its units.
struct StageParams {
  double flat = 0, experts = 0, largest_unit = 0, first_units = 0, units = 0;
};

// The elements of `flat` (of which `experts`) a rank owns under a ZeRO stage >= 1: the dense
// ones over data x context, the experts' over the expert-data group. `whole` rounds each
// share up to whole elements (the trainer's padded slices), else the exact fraction.
double owned_params(const Layout& l, double flat, double experts, bool whole) {
  const double dense = (flat - experts) / static_cast<double>(gradient_group(l));
  const double expert = experts / static_cast<double>(gradient_group(l) / l.ep);
  return whole ? std::ceil(dense) + std::ceil(expert) : dense + expert;
}

// The model state of one pipeline stage by ZeRO stage (bytes a parameter, d the group;
// docs/plan.md "ZeRO stages"), with `copy` bytes of the bf16 compute copy (0 in fp32) and
// `compute` bytes of a compute-copy element:
//   0: 4 master + copy + 4 gradient + 8 moments;   1: 4 + copy + 4 + 8/d;
//   2: 4 + copy + 12/d, + the gradient windows of kZeroGradientWindows units (fp32);
//   3: 16/d, + the gather buffers of kZeroGatherBuffers units (`compute` bytes an element) and
//      the gradient windows; a unit is the stage's largest.
MemoryUse model_state_bytes(const Layout& l, const StageParams& s, double copy, double compute) {
  const double owned = owned_params(l, s.flat, s.experts, true);
  MemoryUse mem;
  mem.weights = s.flat * (4.0 + copy);
  mem.gradients = s.flat * 4.0;
  mem.optimizer = (l.zero_stage >= 1 ? owned : s.flat) * 8.0;
  if (l.zero_stage >= 2)
    mem.gradients = owned * 4.0 + kZeroGradientWindows * s.largest_unit * 4.0;
  if (l.zero_stage == 3) mem.weights = owned * 4.0 + kZeroGatherBuffers * s.largest_unit * compute;
  return mem;
}

// The data group's collectives of a step on the largest stage (`s`), and what of them the
// busiest stage's compute hides (docs/plan.md "Data parallelism", "ZeRO stages").
struct DataTraffic {
  const PlanProblem& p;
  const Layout& l;
  const StageParams& s;
  const ChunkCost& busiest;  // per micro-batch, the stage's chunks summed
  int64_t microbatches;
  double compute_bytes;      // an element of the compute copy (ZeRO-3's gathers)

  const LinkSpec& link() const { return group_link(p.hw, l.devices()); }
  // One collective of `kind` over the stage's parameters, `bytes` an element: the dense ones
  // over DP x CP, the experts' over the expert-data group.
  double over_stage(Collective kind, double bytes) const {
    const int64_t n = gradient_group(l);
    return collective_seconds(p.hw, link(), kind, n, (s.flat - s.experts) * bytes) +
           collective_seconds(p.hw, link(), kind, n / l.ep, s.experts * bytes);
  }
  // The same unit by unit: each unit its own collective, so its latency steps once a unit.
  double per_unit(Collective kind, double bytes) const {
    return over_stage(kind, bytes) +
           (s.units - 1.0) * collective_seconds(p.hw, link(), kind, gradient_group(l), 0.0);
  }

  // Stages 0 and 1: the gradients reduced once a step (all-reduce; stage 1 reduce-scatter),
  // bucket by bucket from the last micro-batch's backward (grad_sync.hpp), hidden behind it
  // all but the bucket holding offset 0; stage 1's all-gather of the updated weights follows
  // the optimizer, exposed.
  void per_step(Prediction& r) const {
    const double grads = s.flat * 4.0;
    const Collective kind = l.zero_stage == 1 ? Collective::ReduceScatter : Collective::AllReduce;
    const double reduce = over_stage(kind, 4.0);
    const double bucket = std::min(1.0, p.dp_bucket_mb * 1024.0 * 1024.0 / grads);
    const double window = p.dp_overlap ? busiest.backward : 0.0;
    r.time.dp_exposed = p.dp_overlap
                            ? std::max(0.0, reduce * (1.0 - bucket) - window) + reduce * bucket
                            : reduce;
    r.dp_gradient_bytes = grads;
    r.dp_reduce_seconds = reduce;
    r.dp_window_seconds = window;
    r.dp_hidden_seconds = p.dp_overlap ? std::min(reduce * (1.0 - bucket), window) : 0.0;
    r.dp_reduced_bytes = grads;
    if (l.zero_stage == 1) {
      r.time.dp_exposed += over_stage(Collective::AllGather, 4.0);
      r.dp_gathered_bytes = grads;
    }
  }

  // Stages 2 and 3, unit by unit in every micro-batch (M of them a step). Each unit's gradient
  // is reduce-scattered when its backward is done, behind the backward of the units below it;
  // the chunks' first units (the embedding, or a chunk's first layer), whose backward comes
  // last, are reduce-scattered behind the next micro-batch's forward, the last micro-batch's
  // exposed. Stage 2 all-gathers the updated fp32 weights after the optimizer, exposed.
  // Stage 3 all-gathers each unit's compute copy before its forward and again before its
  // backward, the next unit prefetched behind the current one's compute: the chunks' first
  // units' forward gathers have nothing before them and are exposed; the rest of the forward's
  // gathers share the forward with the previous micro-batch's last reduce-scatters, the
  // backward's gathers the backward with the reduce-scatters. What a window does not cover
  // is exposed.
  void per_microbatch(Prediction& r) const {
    const double M = static_cast<double>(microbatches);
    const int64_t n = gradient_group(l);
    const double reduce = per_unit(Collective::ReduceScatter, 4.0);
    const double reduce_first =
        collective_seconds(p.hw, link(), Collective::ReduceScatter, n, s.first_units * 4.0);
    const bool gathers = l.zero_stage == 3;
    const double gather = gathers ? per_unit(Collective::AllGather, compute_bytes) : 0.0;
    const double gather_first =
        gathers ? collective_seconds(p.hw, link(), Collective::AllGather, n,
                                     s.first_units * compute_bytes)
                : 0.0;
    const double forward = p.dp_overlap ? busiest.forward : 0.0;
    const double backward = p.dp_overlap ? busiest.backward : 0.0;
    const double ahead = gather - gather_first;  // the forward's prefetched gathers
    const double exposed = M * gather_first + M * std::max(0.0, gather + reduce - reduce_first -
                                                                    backward) +
                           (M - 1.0) * std::max(0.0, ahead + reduce_first - forward) +
                           std::max(0.0, ahead - forward) + reduce_first;
    const double traffic = M * (2.0 * gather + reduce);
    r.time.dp_exposed = exposed;
    r.dp_gradient_bytes = s.flat * 4.0;
    r.dp_reduce_seconds = traffic;
    r.dp_window_seconds = M * (forward + backward);
    // Without a window nothing is hidden (the sum's rounding aside).
    r.dp_hidden_seconds = traffic - exposed > 1e-9 * traffic ? traffic - exposed : 0.0;
    r.dp_reduced_bytes = M * s.flat * 4.0;
    if (gathers) {
      r.dp_gathered_bytes = 2.0 * M * s.flat * compute_bytes;
    } else {
      r.time.dp_exposed += per_unit(Collective::AllGather, 4.0);
      r.dp_gathered_bytes = s.flat * 4.0;
    }
  }
};

}  // namespace

double pipeline_makespan(const Layout& l, int64_t microbatches, const PipeSimCosts& costs) {
  return pipeline_makespan(
      l, microbatches,
      std::vector<std::vector<PipeSimCosts>>(
          static_cast<size_t>(l.pp),
          std::vector<PipeSimCosts>(static_cast<size_t>(l.virtual_stages), costs)));
}

double pipeline_makespan(const Layout& l, int64_t microbatches,
                         const std::vector<std::vector<PipeSimCosts>>& costs) {
  // Past the warm-up every schedule repeats one period per PP micro-batches, so a long step is
  // simulated to 5 PP micro-batches and the period's growth extended linearly (exact once the
  // steady state is reached; tests/test_plan.cpp compares it with the whole simulation).
  const int64_t base = 4 * l.pp;
  if (microbatches <= base + l.pp) return simulated_makespan(l, microbatches, costs);
  const double first = simulated_makespan(l, base, costs);
  const double second = simulated_makespan(l, base + l.pp, costs);
  const double per_micro = (second - first) / static_cast<double>(l.pp);
  return second + per_micro * static_cast<double>(microbatches - base - l.pp);
}

namespace {

// The schedule's simulator with each chunk's own op costs (stage s holds chunks s, s + PP, ...).
PipelineTimes simulate(const Layout& l, int64_t microbatches,
                       const std::vector<ChunkCost>& chunk_cost, double transfer) {
  PipelineTimes r;
  if (l.pp == 1) {
    const ChunkCost& op = chunk_cost.front();
    r.makespan = r.makespan_without_transfers =
        static_cast<double>(microbatches) * (op.forward + op.backward);
    return r;
  }
  std::vector<std::vector<PipeSimCosts>> costs(static_cast<size_t>(l.pp));
  for (int64_t s = 0; s < l.pp; ++s)
    for (int64_t c = 0; c < l.virtual_stages; ++c) {
      const ChunkCost& op = chunk_cost[static_cast<size_t>(c * l.pp + s)];
      PipeSimCosts sim;
      sim.forward = op.forward;
      sim.backward = op.backward;
      sim.weight = std::min(op.weight, op.backward);
      sim.comm = 0.0;
      costs[static_cast<size_t>(s)].push_back(sim);
    }
  r.makespan_without_transfers = pipeline_makespan(l, microbatches, costs);
  for (auto& stage : costs)
    for (PipeSimCosts& sim : stage) sim.comm = transfer;
  r.makespan = pipeline_makespan(l, microbatches, costs);
  return r;
}

}  // namespace

double moe_routed_rows(const ModelConfig& m, int64_t micro_batch) {
  if (m.moe_experts == 0) return 0.0;
  const double assignments = static_cast<double>(m.seq_len * m.moe_top_k);  // per sequence
  double kept = assignments;
  if (m.moe_capacity_factor > 0.0) {
    const double E = static_cast<double>(m.moe_experts);
    kept = std::min(assignments, E * std::ceil(m.moe_capacity_factor * assignments / E));
  }
  return static_cast<double>(micro_batch) * kept;
}

bool PlanProblem::fp8_covers(int64_t layer) const {
  Fp8Settings settings;
  settings.enabled = fp8();
  settings.skip_first = fp8_skip_first;
  settings.skip_last = fp8_skip_last;
  return settings.covers(layer, model.layers);
}

int64_t PlanProblem::fp8_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < model.layers; ++l) n += fp8_covers(l);
  return n;
}

std::string PlanProblem::base_precision() const {
  return fp8() ? hw.fp8_base_precision() : precision;
}

std::string to_string(const Layout& l) {
  std::ostringstream o;
  o << "tensor=" << l.tp;
  if (l.cp > 1) o << ",context=" << l.cp;
  o << ",pipeline=" << l.pp << ",data=" << l.dp
    << ",micro_batch=" << l.micro_batch << ",schedule=" << to_string(l.schedule)
    << ",virtual_stages=" << l.virtual_stages << ",zero=" << l.zero_stage
    << ",sequence_parallel=" << (l.sequence_parallel ? 1 : 0)
    << ",recompute=" << to_string(l.recompute);
  if (l.ep > 1) o << ",expert=" << l.ep;
  if (l.balance != "even") o << ",pipeline_balance=" << l.balance;
  return o.str();
}

double layer_activation_bytes(const ModelConfig& m, bool materialized_attention, int64_t micro_batch,
                              int64_t tp, bool sequence_parallel, Recompute recompute,
                              double element_bytes) {
  return static_cast<double>(layer_activation_bytes(
      m, activation_shape(m, materialized_attention, micro_batch, tp, sequence_parallel,
                          recompute, element_bytes)));
}

std::string layout_problem(const PlanProblem& p, const Layout& l) {
  const ModelConfig& m = p.model;
  auto n = [](int64_t v) { return std::to_string(v); };
  if (l.tp < 1 || l.cp < 1 || l.pp < 1 || l.dp < 1 || l.micro_batch < 1 ||
      l.virtual_stages < 1)
    return "tensor, context, pipeline, data, micro_batch and virtual_stages must be >= 1 (" +
           to_string(l) + ")";
  if (l.devices() != p.devices())
    return "tensor " + n(l.tp) + (l.cp > 1 ? " x context " + n(l.cp) : "") + " x pipeline " +
           n(l.pp) + " x data " + n(l.dp) + " = " + n(l.devices()) + " devices, but " +
           n(p.nodes) + " node(s) x " + n(p.hw.devices_per_node) + " = " + n(p.devices()) +
           " devices";
  // The grid as the trainer checks it (the sequence cut into 2 CP chunks included), then the
  // context dimension's conditions that config.cpp's check_context adds.
  try {
    GridShape shape{static_cast<int>(l.tp), static_cast<int>(l.pp), static_cast<int>(l.dp)};
    shape.cp = static_cast<int>(l.cp);
    validate_layout(shape, static_cast<int>(l.devices()), static_cast<int>(p.hw.devices_per_node),
                    m);
  } catch (const Error& e) {
    return e.what();
  }
  if (l.cp > 1 && l.sequence_parallel && l.tp > 1 &&
      (l.micro_batch * (m.seq_len / l.cp)) % l.tp != 0)
    return "micro_batch x model.seq_len / context = " + n(l.micro_batch) + " x " +
           n(m.seq_len / l.cp) + " is not divisible by tensor (" + n(l.tp) +
           ") under sequence_parallel: each tensor rank holds a slice of a context rank's tokens";
  // The trainer's MoE under CP: dropless (config.cpp).
  if (l.cp > 1 && m.moe_experts > 0 && m.moe_capacity_factor > 0)
    return "context (" + n(l.cp) + ") > 1 with a mixture of experts that drops tokens "
           "(model.moe_capacity_factor > 0): not supported under context parallelism yet";
  if (p.global_batch % (l.micro_batch * l.dp) != 0)
    return "micro_batch " + n(l.micro_batch) + " x data " + n(l.dp) +
           " does not divide the global batch " + n(p.global_batch);
  const int64_t micro = p.global_batch / (l.micro_batch * l.dp);
  if (l.schedule == ScheduleKind::Interleaved) {
    if (l.virtual_stages < 2 || l.pp < 2 || micro % l.pp != 0)
      return "schedule interleaved needs virtual_stages >= 2, pipeline >= 2 and micro-batches "
             "(" + n(micro) + ") a multiple of pipeline (" + n(l.pp) + ")";
    if (m.layers % (l.pp * l.virtual_stages) != 0)
      return "schedule interleaved needs model.layers (" + n(m.layers) +
             ") divisible by pipeline x virtual_stages (" + n(l.pp * l.virtual_stages) + ")";
  } else if (l.virtual_stages != 1) {
    return "virtual_stages = " + n(l.virtual_stages) + " needs schedule interleaved";
  }
  if (l.sequence_parallel && l.tp < 2) return "sequence_parallel needs tensor >= 2";
  if (l.balance != "even" && l.balance != "flops")
    return "pipeline_balance \"" + l.balance + "\" must be even or flops";
  if (l.balance == "flops" && (l.pp < 2 || l.virtual_stages > 1))
    return "pipeline_balance flops needs pipeline >= 2 and one chunk per stage (not interleaved)";
  if (l.ep < 1) return "expert (" + n(l.ep) + ") must be >= 1";
  if (l.ep > 1 && m.moe_experts == 0)
    return "expert (" + n(l.ep) + ") > 1 needs a mixture of experts (model.moe_experts > 0)";
  if (l.ep > 1 && (l.dp % l.ep != 0 || m.moe_experts % l.ep != 0))
    return "expert (" + n(l.ep) + ") must divide data (" + n(l.dp) + ") and model.moe_experts (" +
           n(m.moe_experts) + ")";
  return "";
}

namespace {

// The pipeline's simulated times do not depend on the ZeRO stage (its traffic is added to the
// makespan, not scheduled in it): rank_layouts simulates a layout once for all its stages,
// keyed by the layout at stage 0.
using PipelineCache = std::map<std::string, PipelineTimes>;

// What one checkpoint save writes, whatever the layout: every parameter's fp32 weight and two
// AdamW moments (12 bytes a parameter), in three datasets a tensor.
struct SaveSize {
  double bytes = 0, datasets = 0;
};
SaveSize save_size(const ModelConfig& m) {
  const ParamLayout whole = parameter_layout(m, ModelShard::whole(m));
  return {12.0 * static_cast<double>(parameter_count(m)),
          3.0 * static_cast<double>(whole.params.size())};
}

// What rank_layouts works out once for all its layouts rather than for each: the pipelines'
// simulations and, with checkpoints, a save's size (a layout of the whole model: as long as
// the rest of a prediction).
struct PredictCache {
  PipelineCache pipelines;
  std::optional<SaveSize> save;
};

Prediction predict_with(const PlanProblem& p, const Layout& l, PredictCache* cache);

}  // namespace

Prediction predict(const PlanProblem& p, const Layout& l) { return predict_with(p, l, nullptr); }

namespace {

// Checkpoints (docs/plan.md "Checkpoints"), once the rest of the step is in r.time: one save's
// bytes and write (each dataset with its own cost beyond its bytes), the fullest rank's staging
// copy (r.checkpoint_staging_bytes, set by the stage loop) and what training waits for a save,
// spread over the interval's steps.
void add_checkpoints(const PlanProblem& p, const SaveSize& save, Prediction& r) {
  const HardwareSpec& hw = p.hw;
  const bool cpu = hw.device.kind != "gpu";
  const double interval = static_cast<double>(p.checkpoint_interval);
  r.checkpoint_bytes = save.bytes;
  r.checkpoint_write_seconds = save.bytes / (hw.storage_write_gbs * 1e9) +
                               save.datasets * hw.storage_dataset_ms * 1e-3;
  if (cpu) {
    // A synchronous save writes from the state itself; an asynchronous one copies it first
    // (read and written at the memory bandwidth).
    if (!p.checkpoint_async) r.checkpoint_staging_bytes = 0.0;
    r.checkpoint_staging_seconds =
        2.0 * r.checkpoint_staging_bytes / hw.memory_bytes_per_s();
  } else if (hw.device.host_link_gbs > 0.0) {
    r.checkpoint_staging_seconds = r.checkpoint_staging_bytes / (hw.device.host_link_gbs * 1e9);
  }
  const double steps = interval * r.time.total();  // the steps between two saves
  r.checkpoint_backlog = p.checkpoint_async && r.checkpoint_write_seconds > steps;
  // Training waits for the whole write, except for a GPU's asynchronous save: its writer runs
  // on host cores the step does not use, so only what outlasts the interval is waited for. A
  // CPU's writer runs on the cores the step's threads fill: its work (HDF5's copies into the
  // file system, the checksums) is taken from the step, and what it spares is only the wait
  // for the storage.
  const double write_waited = p.checkpoint_async && !cpu
                                  ? std::max(0.0, r.checkpoint_write_seconds - steps)
                                  : r.checkpoint_write_seconds;
  r.checkpoint_stall_seconds = r.checkpoint_staging_seconds + write_waited;
  r.time.checkpoint = r.checkpoint_stall_seconds / interval;
}

Prediction predict_with(const PlanProblem& p, const Layout& l, PredictCache* cache) {
  if (const std::string why = layout_problem(p, l); !why.empty()) throw Error(why);
  const ModelConfig& m = p.model;
  const HardwareSpec& hw = p.hw;
  const CostModel model(p, l);
  const std::vector<Chunk> chunks = virtual_stages(m, l);
  const ChunkParams params = chunk_params(m, l.tp);
  const LayerModel dense_layer = model.layer(false);
  const LayerModel moe_layer = m.moe_experts > 0 ? model.layer(true) : LayerModel{};
  const LayerModel fp8_layer = p.fp8() ? model.layer(false, true) : LayerModel{};
  const LayerModel fp8_moe_layer =
      p.fp8() && m.moe_experts > 0 ? model.layer(true, true) : LayerModel{};
  const int64_t microbatches = p.global_batch / (l.micro_batch * l.dp);
  const int64_t replicas = gradient_group(l);  // data x context: the gradients' group

  Prediction r;
  r.layout = l;
  r.microbatches = microbatches;

  // Pipeline: each chunk's ops cost its own (the chunks with the embedding or the LM head more
  // than the others); the step is the simulated makespan, and the busiest stage's compute is
  // the compute and TP communication reported.
  std::vector<ChunkCost> chunk_cost;
  for (const Chunk& c : chunks)
    chunk_cost.push_back(model.chunk(c, {dense_layer, moe_layer, fp8_layer, fp8_moe_layer}));
  ChunkCost busiest;  // per micro-batch, summed over the stage's chunks
  for (int64_t s = 0; s < l.pp; ++s) {
    ChunkCost stage;
    for (int64_t c = 0; c < l.virtual_stages; ++c)
      stage += chunk_cost[static_cast<size_t>(c * l.pp + s)];
    if (stage.forward + stage.backward > busiest.forward + busiest.backward) busiest = stage;
  }
  const double C = static_cast<double>(m.width), e = model.element_bytes();
  const double message = (l.sequence_parallel ? model.micro_rows() / static_cast<double>(l.tp)
                                              : model.micro_rows()) * C * e;
  const LinkSpec& pp_link = group_link(hw, l.tp * l.cp * l.pp);
  const double transfer = collective_seconds(hw, pp_link, Collective::SendRecv, 2, message);
  PipelineTimes pipe;
  if (cache) {
    Layout key = l;
    key.zero_stage = 0;
    const auto [at, fresh] = cache->pipelines.try_emplace(to_string(key));
    if (fresh) at->second = simulate(l, microbatches, chunk_cost, transfer);
    pipe = at->second;
  } else {
    pipe = simulate(l, microbatches, chunk_cost, transfer);
  }
  const double busy = static_cast<double>(microbatches) * (busiest.forward + busiest.backward);
  const double busy_comm = static_cast<double>(microbatches) * busiest.tp_comm;
  const double busy_ep = static_cast<double>(microbatches) * busiest.ep_comm;
  const double busy_cp = static_cast<double>(microbatches) * busiest.cp_comm;
  r.time.compute = busy - busy_comm - busy_ep - busy_cp;
  const double M = static_cast<double>(microbatches);
  r.compute_gemm_seconds = M * busiest.gemm;
  r.compute_attention_seconds = M * busiest.attention;
  r.compute_memory_seconds = M * busiest.memory;
  r.compute_head_seconds = M * busiest.head;
  r.time.tp_comm = busy_comm;
  r.time.ep_comm = busy_ep;
  r.time.cp_comm = busy_cp;
  if (l.cp > 1) {
    r.cp_block_bytes = model.ring_block_bytes();
    r.cp_forward_bytes_per_layer = static_cast<double>(l.cp - 1) * r.cp_block_bytes;
    r.cp_ring_seconds = static_cast<double>(microbatches) * busiest.cp_ring;
  }
  if (p.fp8()) {
    r.fp8_layers = p.fp8_layers();
    r.fp8_gemm_seconds = M * busiest.fp8_gemm;
    r.fp8_quantise_bytes = M * busiest.fp8_quantise_bytes;
    r.fp8_quantise_seconds = M * busiest.fp8_quantise;
    r.fp8_amax_reductions = M * busiest.fp8_amax_count;
    r.fp8_amax_seconds = M * busiest.fp8_amax;
  }
  r.time.bubble = std::max(0.0, pipe.makespan_without_transfers - busy);
  r.time.pp_transfer = std::max(0.0, pipe.makespan - pipe.makespan_without_transfers);

  // Per physical stage: parameters and the activation stashes the schedule holds at its peak.
  const double bf16_copy =
      p.base_precision() == "bf16" ? activation_element_bytes("bf16", hw) : 0.0;
  // The CPU oneDNN engine's packed bf16 weights (none at ZeRO-3: its units are gathered).
  const double packed = l.zero_stage < 3 ? packed_weight_bytes(p.base_precision(), hw) : 0.0;
  const double reserved = hw.device.reserved_gib * kGiB;
  // The backward's scratch (the trainer's own count, model_stats.hpp) and the pipeline's
  // message buffers.
  const double scratch =
      static_cast<double>(backward_scratch_bytes(model.local(), model.shape(Recompute::None))) +
      2.0 * message;
  // The ring's blocks in flight (CP > 1): the K/V block arriving beside the one in use, and in
  // backward the dK/dV accumulator received and the one sent.
  const double ring_buffers = l.cp > 1 ? 4.0 * model.ring_block_bytes() : 0.0;
  // FP8's quantised copies, held once by a stage with an FP8 layer (Fp8Linear grows them on
  // its first call: a stage of skipped layers never does).
  const double fp8_scratch = p.fp8() ? model.fp8_scratch_bytes() : 0.0;
  const bool cpu = hw.device.kind != "gpu";
  // A checkpoint's staging copy is host memory: on a CPU the rank's own (async saves keep it).
  const bool staging_in_memory = cpu && p.models_checkpoints() && p.checkpoint_async;
  // The largest stage's parameters (by elements), as the data group's traffic moves them.
  StageParams largest;
  const double e_compute = model.element_bytes();  // the compute copy's element (ZeRO-3)
  for (int64_t s = 0; s < l.pp; ++s) {
    StageParams stage;
    for (int64_t c = 0; c < l.virtual_stages; ++c) {
      const Chunk& chunk = chunks[static_cast<size_t>(c * l.pp + s)];
      stage.flat += params.of(m, chunk, l.ep);
      stage.experts += params.experts_of(m, chunk, l.ep);
      stage.largest_unit = std::max(stage.largest_unit, params.largest_unit(m, chunk, l.ep));
      stage.first_units += params.first_unit(m, chunk, l.ep);
      stage.units += params.units(m, chunk, l.ep);
    }
    if (stage.flat > largest.flat) largest = stage;
    const std::vector<int64_t> slots = stash_slots(l, s, microbatches);
    double stashes = 0.0;
    for (int64_t c = 0; c < l.virtual_stages; ++c)
      stashes += static_cast<double>(slots[static_cast<size_t>(c)]) *
                 model.chunk_stash(chunks[static_cast<size_t>(c * l.pp + s)]);
    MemoryUse mem = model_state_bytes(l, stage, bf16_copy + packed, e_compute);
    if (p.models_checkpoints()) {
      // What a checkpoint's staging copies: the rank's fp32 weights (ZeRO-3: its slice) and
      // its AdamW moments (the trainer's checkpoint_buffers).
      const double staging =
          (l.zero_stage == 3 ? owned_params(l, stage.flat, stage.experts, true) : stage.flat) *
              4.0 +
          mem.optimizer;
      r.checkpoint_staging_bytes = std::max(r.checkpoint_staging_bytes, staging);
      if (staging_in_memory) mem.staging = staging;
    }
    mem.activations = stashes;
    // What the rank recomputes in (one layer's worth, held once).
    const ActivationShape shape = model.shape(l.recompute);
    mem.activations += static_cast<double>(recompute_workspace_bytes(model.local(), shape));
    // + the model's loss accumulator (one fp64, Transformer::loss_sum_).
    mem.buffers = reserved + scratch + ring_buffers + zero1_staging(p, l, stage.flat) + 8.0;
    double stage_fp8 = 0.0;
    for (int64_t c = 0; c < l.virtual_stages && stage_fp8 == 0.0; ++c)
      if (model.fp8_layers_in(chunks[static_cast<size_t>(c * l.pp + s)]) > 0)
        stage_fp8 = fp8_scratch;
    mem.buffers += stage_fp8;
    if (stage.experts > 0.0) mem.buffers += model.moe_buffer_bytes();
    // One chunk of the LM head's logits, held once by the last stage.
    if (s == l.pp - 1) mem.buffers += model.head_scratch();
    if (s == 0 || mem.total() > r.memory.total()) {
      r.memory = mem;
      r.fullest_stage = s;
      r.fp8_scratch_bytes = stage_fp8;
    }
  }
  r.fits = r.memory.total() <= hw.device.memory_gib * kGiB;

  // Data parallelism (docs/plan.md "Data parallelism", "ZeRO stages"). The experts' traffic
  // goes over the DP x CP / EP ranks holding the same experts (the expert-data group, also
  // spanning the whole grid), the rest over DP x CP (`replicas`).
  if (replicas > 1) {
    const DataTraffic traffic{p, l, largest, busiest, microbatches, e_compute};
    if (l.zero_stage < 2)
      traffic.per_step(r);
    else
      traffic.per_microbatch(r);
  }
  const double owned = l.zero_stage >= 1 ? owned_params(l, largest.flat, largest.experts, false)
                                         : largest.flat;
  // The bf16 compute copy. The CPU's FMA engine rounds its copy in a pass of its own (4 bytes
  // read, 4 written). With the oneDNN engine AdamW writes the packed bf16 bits as it goes where
  // the rank updates every weight (stage 0, or one replica), and the copy's values are expanded
  // from them (2 read, 4 written); otherwise the gathered weights are rounded (4 + 4) and
  // packed (4 read, 2 written). At stage 3 each unit is rounded as it is gathered instead. A
  // GPU's AdamW writes its copy as it goes where the rank updates all it holds (stage 0, one
  // replica) or its slice of it (stage 3, whose slices are what is gathered); under stages 1
  // and 2 over several replicas in a pass of its own over the gathered weights.
  const bool updates_every_weight = l.zero_stage == 0 || replicas == 1;
  double copy = 0.0;
  if (bf16_copy == 0.0)
    copy = 0.0;  // fp32: no copy
  else if (l.zero_stage == 3)
    copy = cpu ? 0.0 : owned * bf16_copy;
  else if (!updates_every_weight)  // a pass over the gathered weights (and the CPU's packing)
    copy = largest.flat * (bf16_copy + 4.0 + (packed > 0.0 ? 4.0 + packed : 0.0));
  else if (cpu)
    copy = largest.flat * (packed > 0.0 ? packed + packed + bf16_copy : bf16_copy + 4.0);
  else
    copy = largest.flat * bf16_copy;
  r.time.optimizer = (owned * kOptimizerBytesPerParam + copy) / hw.optimizer_bytes_per_s(owned);

  // Throughput.
  const TrainingFlopsParts& parts = model.parts();
  const double L = static_cast<double>(m.layers);
  // Recomputation's extra forwards (the LM head's logits are never recomputed).
  double extra_per_token = 0.0;
  if (l.recompute == Recompute::Full)
    extra_per_token += L * (parts.layer_linear + parts.layer_attention) / 3.0;
  if (l.recompute == Recompute::Selective) extra_per_token += L * parts.layer_attention / 3.0;
  const double tokens = static_cast<double>(p.global_batch * m.seq_len);
  if (p.models_checkpoints()) {
    if (cache && !cache->save) cache->save = save_size(m);
    add_checkpoints(p, cache ? *cache->save : save_size(m), r);
  }
  r.step_seconds = r.time.total();
  r.model_flops_per_step =
      tokens * training_flops_per_token(m, padded_vocab_size(m, static_cast<int>(l.tp)));
  r.hardware_flops_per_step = r.model_flops_per_step + tokens * extra_per_token;
  const double devices = static_cast<double>(l.devices());
  r.tokens_per_second = tokens / r.step_seconds;
  r.tflops_per_device = r.hardware_flops_per_step / r.step_seconds / devices / 1e12;
  r.mfu = r.model_flops_per_step / r.step_seconds / devices / model.peak();
  return r;
}

}  // namespace

LayoutFilter parse_layout_filter(const std::string& text) {
  LayoutFilter f;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw Error("--layout: \"" + item + "\" is not key=value (e.g. tensor=8,pipeline=2)");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    auto integer = [&](int64_t min) {
      size_t used = 0;
      int64_t v = 0;
      try {
        v = std::stoll(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || value.empty() || v < min)
        throw Error("--layout: " + key + " = \"" + value + "\" must be an integer >= " +
                    std::to_string(min));
      return v;
    };
    if (key == "tensor") f.tp = integer(1);
    else if (key == "pipeline") f.pp = integer(1);
    else if (key == "data") f.dp = integer(1);
    else if (key == "micro_batch") f.micro_batch = integer(1);
    else if (key == "virtual_stages") f.virtual_stages = integer(1);
    else if (key == "expert") f.ep = integer(1);
    else if (key == "context") f.cp = integer(1);
    else if (key == "zero") {
      if (value.size() != 1 || value[0] < '0' || value[0] > '3')
        throw Error("--layout: zero = \"" + value + "\" must be 0, 1, 2 or 3 (the ZeRO stage)");
      f.zero_stage = value[0] - '0';
    } else if (key == "sequence_parallel") {
      f.sequence_parallel = static_cast<int>(integer(0));
      if (f.sequence_parallel > 1)
        throw Error("--layout: sequence_parallel = " + value + " must be 0 or 1");
    } else if (key == "schedule") {
      try {
        parse_schedule_kind(value);
      } catch (const Error&) {
        throw Error("--layout: schedule = \"" + value +
                    "\" must be 1f1b, gpipe, interleaved, zb-h1 or zb-h2");
      }
      f.schedule = value;
    } else if (key == "recompute") {
      try {
        parse_recompute(value);
      } catch (const Error&) {
        throw Error("--layout: recompute = \"" + value + "\" must be none, selective or full");
      }
      f.recompute = value;
    } else if (key == "pipeline_balance") {
      if (value != "even" && value != "flops")
        throw Error("--layout: pipeline_balance = \"" + value + "\" must be even or flops");
      f.balance = value;
    } else {
      throw Error("--layout: unknown key \"" + key +
                  "\" (tensor, context, pipeline, data, micro_batch, schedule, virtual_stages, "
                  "zero, sequence_parallel, recompute, expert, pipeline_balance)");
    }
  }
  return f;
}

namespace {

// The divisors of n (>= 1) up to `limit`, ascending: trial division to sqrt(n), so a bounded n
// (plan_size_problem) costs at most 4096 steps.
std::vector<int64_t> divisors(int64_t n, int64_t limit) {
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    if (d <= limit) low.push_back(d);
    if (d != n / d && n / d <= limit) high.push_back(n / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

// The context-parallel degrees a plan lists for `tp`: f.cp alone when given, else 1 and the
// powers of two dividing devices / TP up to kPlanMaxContext and model.seq_len /
// kPlanMinContextTokens, with 2 CP dividing model.seq_len (layout_problem says why any other is
// refused).
std::vector<int64_t> context_degrees(const PlanProblem& p, const LayoutFilter& f, int64_t tp) {
  const int64_t rest = p.devices() / tp;
  if (f.cp) return rest % f.cp == 0 ? std::vector<int64_t>{f.cp} : std::vector<int64_t>{};
  const int64_t cap = std::min(kPlanMaxContext, p.model.seq_len / kPlanMinContextTokens);
  std::vector<int64_t> out = {1};
  for (int64_t cp = 2; cp <= cap && rest % cp == 0; cp *= 2)
    if (p.model.seq_len % (2 * cp) == 0) out.push_back(cp);
  return out;
}

// The (CP, PP) pairs listed for `tp`: each of context_degrees with every PP dividing the
// devices left, up to model.layers and kPlanMaxPipeline, matching f.pp.
std::vector<std::pair<int64_t, int64_t>> context_and_pipeline(const PlanProblem& p,
                                                              const LayoutFilter& f, int64_t tp) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t cp : context_degrees(p, f, tp))
    for (int64_t pp : divisors(p.devices() / (tp * cp),
                               std::min(p.model.layers, kPlanMaxPipeline)))
      if (!f.pp || pp == f.pp) out.emplace_back(cp, pp);
  return out;
}

}  // namespace

std::string plan_size_problem(const PlanProblem& p, const std::string& batch_source) {
  auto n = [](int64_t v) { return std::to_string(v); };
  // nodes x devices_per_node compared without forming the product (it may overflow).
  if (p.nodes < 1 || p.hw.devices_per_node < 1 ||
      p.nodes > kPlanMaxDevices / p.hw.devices_per_node)
    return n(p.nodes) + " node(s) x " + n(p.hw.devices_per_node) +
           " devices per node are past the " + n(kPlanMaxDevices) + " devices a plan models";
  if (p.global_batch < 1 || p.global_batch > kPlanMaxGlobalBatch)
    return batch_source + " = " + n(p.global_batch) + " is past the " + n(kPlanMaxGlobalBatch) +
           " sequences per step a plan models (1 to " + n(kPlanMaxGlobalBatch) + ")";
  return "";
}

std::vector<Layout> enumerate_layouts(const PlanProblem& p, const LayoutFilter& f) {
  if (const std::string why = plan_size_problem(p, "the global batch"); !why.empty())
    throw Error(why);
  std::vector<Layout> out;
  const int64_t devices = p.devices();
  const ScheduleKind schedules[] = {ScheduleKind::OneFOneB, ScheduleKind::GPipe,
                                    ScheduleKind::ZeroBubbleH1, ScheduleKind::ZeroBubbleH2,
                                    ScheduleKind::Interleaved};
  const Recompute recomputes[] = {Recompute::None, Recompute::Selective, Recompute::Full};
  // Every loop walks divisors, never counts: the work is bounded by the divisors of the
  // devices and of the global batch, not by their values.
  for (int64_t tp : divisors(devices, p.hw.devices_per_node)) {
    if (f.tp && tp != f.tp) continue;
    for (const auto& [cp, pp] : context_and_pipeline(p, f, tp)) {
      const int64_t dp = devices / (tp * cp * pp);
      if ((f.dp && dp != f.dp) || p.global_batch % dp != 0) continue;
      for (int64_t mb : divisors(p.global_batch / dp, p.global_batch / dp)) {
        if (f.micro_batch && mb != f.micro_batch) continue;
        for (ScheduleKind kind : schedules) {
          if (!f.schedule.empty() && kind != parse_schedule_kind(f.schedule)) continue;
          // With one stage every schedule is the same sequence: keep 1F1B's.
          if (pp == 1 && kind != ScheduleKind::OneFOneB && f.schedule.empty()) continue;
          for (int64_t v = 1; v <= 8; ++v) {
            if (f.virtual_stages && v != f.virtual_stages) continue;
            if ((kind == ScheduleKind::Interleaved) != (v > 1)) continue;
            for (int zero = 0; zero <= 3; ++zero) {
              // A stage shards over DP x CP: with one rank there it shards nothing.
              if ((f.zero_stage >= 0 && zero != f.zero_stage) ||
                  (zero > 0 && dp * cp == 1 && f.zero_stage < 0))
                continue;
              for (int sp = 0; sp <= 1; ++sp) {
                if (f.sequence_parallel >= 0 && sp != f.sequence_parallel) continue;
                for (Recompute rc : recomputes) {
                  if (!f.recompute.empty() && rc != parse_recompute(f.recompute)) continue;
                  // EP > 1 only divides both DP and the experts.
                  const int64_t experts = p.model.moe_experts > 0 ? p.model.moe_experts : 1;
                  for (int64_t ep : divisors(std::gcd(dp, experts), dp)) {
                    if (f.ep && ep != f.ep) continue;
                    // layout_problem keeps "flops" only where it differs from "even".
                    for (const char* balance : {"even", "flops"}) {
                      if (!f.balance.empty() && f.balance != balance) continue;
                      Layout l{tp, pp, dp, mb, kind, v, zero, sp == 1, rc, ep, balance, cp};
                      if (layout_problem(p, l).empty()) out.push_back(l);
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

bool pipeline_cap_excludes(const PlanProblem& p, const LayoutFilter& f) {
  if (f.pp || !plan_size_problem(p, "").empty()) return false;
  const int64_t devices = p.devices();
  const std::vector<int64_t> dps = divisors(p.global_batch, p.global_batch);
  for (int64_t tp : divisors(devices, p.hw.devices_per_node)) {
    if (f.tp && tp != f.tp) continue;
    for (int64_t cp : context_degrees(p, f, tp))
      for (int64_t dp : dps) {
        if ((f.dp && dp != f.dp) || (devices / tp / cp) % dp != 0) continue;
        const int64_t pp = devices / tp / cp / dp;
        if (pp > kPlanMaxPipeline && pp <= p.model.layers) return true;
      }
  }
  return false;
}

std::vector<Prediction> rank_layouts(const PlanProblem& p, const std::vector<Layout>& layouts) {
  std::vector<Prediction> out;
  out.reserve(layouts.size());
  PredictCache cache;
  for (const Layout& l : layouts) out.push_back(predict_with(p, l, &cache));
  std::stable_sort(out.begin(), out.end(), [](const Prediction& a, const Prediction& b) {
    if (a.fits != b.fits) return a.fits;
    return a.step_seconds < b.step_seconds;
  });
  return out;
}

std::vector<std::string> layout_overrides(const Layout& l, int64_t global_batch) {
  std::vector<std::string> s = {
      "parallel.tensor=" + std::to_string(l.tp), "parallel.context=" + std::to_string(l.cp),
      "parallel.pipeline=" + std::to_string(l.pp),
      "parallel.data=" + std::to_string(l.dp), "train.micro_batch=" + std::to_string(l.micro_batch),
      "train.global_batch=" + std::to_string(global_batch),
      "parallel.schedule=" + to_string(l.schedule),
      "parallel.virtual_stages=" + std::to_string(l.virtual_stages),
      "parallel.sequence_parallel=" + std::string(l.sequence_parallel ? "true" : "false"),
      "optim.zero_stage=" + std::to_string(l.zero_stage),
      "train.recompute=" + to_string(l.recompute), "parallel.expert=" + std::to_string(l.ep),
      "parallel.pipeline_balance=" + l.balance};
  return s;
}

namespace {

// printf into a std::string (the warnings' one-line texts).
template <typename... Args>
std::string format(const char* pattern, Args... args) {
  const int n = std::snprintf(nullptr, 0, pattern, args...);
  std::string out(static_cast<size_t>(std::max(n, 0)), '\0');
  std::snprintf(out.data(), out.size() + 1, pattern, args...);
  return out;
}

// "DP 8", or "DP 4 x CP 2": the group the gradients are reduced over.
std::string gradient_group_text(const Layout& l) {
  std::string text = "DP " + std::to_string(l.dp);
  if (l.cp > 1) text += " x CP " + std::to_string(l.cp);
  return text;
}

}  // namespace

std::vector<PlanWarning> problem_warnings(const PlanProblem& p) {
  std::vector<PlanWarning> out;
  const int64_t devices = p.devices();
  if (p.global_batch < devices)
    out.push_back(
        {"batch", 'B',
         format("batch: the global batch of %lld sequence%s is fewer than the %lld devices (the "
                "data-parallel ranks of a layout without model parallelism): DP is at most %lld, "
                "so every layout splits each model replica over TP x CP x PP >= %lld devices "
                "whether the model needs it or not; plan fewer nodes or a global batch of at "
                "least %lld",
                static_cast<long long>(p.global_batch), p.global_batch == 1 ? "" : "s",
                static_cast<long long>(devices), static_cast<long long>(p.global_batch),
                static_cast<long long>((devices + p.global_batch - 1) / p.global_batch),
                static_cast<long long>(devices))});
  return out;
}

std::vector<PlanWarning> layout_warnings(const PlanProblem& p, const Prediction& r) {
  std::vector<PlanWarning> out;
  const Layout& l = r.layout;
  if (l.pp > 1 && r.microbatches < kWarnMicrobatchesPerStage * l.pp)
    out.push_back(
        {"microbatches", 'm',
         format("microbatches: %lld micro-batches a step (global batch %lld / (DP %lld x "
                "micro-batch %lld)) for %lld pipeline stages, fewer than %lld per stage: the "
                "schedule hardly leaves its fill and drain; a larger global batch, a smaller "
                "micro-batch or fewer stages give it more",
                static_cast<long long>(r.microbatches), static_cast<long long>(p.global_batch),
                static_cast<long long>(l.dp), static_cast<long long>(l.micro_batch),
                static_cast<long long>(l.pp), static_cast<long long>(kWarnMicrobatchesPerStage))});
  const double capacity = p.hw.device.memory_gib * kGiB;
  const double used = r.memory.total();
  if (r.fits && used > (1.0 - kWarnHeadroom) * capacity)
    out.push_back(
        {"headroom", 'h',
         format("headroom: %.3g GiB of the device's %.3g predicted (stage %lld), %.1f %% left, "
                "under %.0f %%: allocator fragmentation or memory the model does not count "
                "can make it fail to fit",
                used / kGiB, capacity / kGiB, static_cast<long long>(r.fullest_stage),
                100.0 * (capacity - used) / capacity, 100.0 * kWarnHeadroom)});
  if (r.step_seconds > 0.0 && r.time.bubble > kWarnBubble * r.step_seconds)
    out.push_back(
        {"bubble", 'b',
         format("bubble: %.3g s of the %.4g s step (%.1f %%, over %.0f %%) idle in the "
                "pipeline's fill and drain; more micro-batches a step, fewer stages or a "
                "zero-bubble schedule shrink it",
                r.time.bubble, r.step_seconds, 100.0 * r.time.bubble / r.step_seconds,
                100.0 * kWarnBubble)});
  const char* link = l.devices() <= p.hw.devices_per_node ? "within a node" : "across nodes";
  if (r.dp_hidden_seconds > 0.0 && l.zero_stage < 2)
    out.push_back(
        {"overlap", 'o',
         format("overlap: %.3g s of the %.3g s data-parallel gradient reduction (%.3g GB over "
                "%s, %s) counted as hidden behind the last micro-batch's backward (%.3g s): "
                "assumed, not scheduled (nothing models its contention with the backward); "
                "--no-dp-overlap predicts it exposed",
                r.dp_hidden_seconds, r.dp_reduce_seconds, r.dp_gradient_bytes / 1e9,
                gradient_group_text(l).c_str(), link, r.dp_window_seconds)});
  if (r.dp_hidden_seconds > 0.0 && l.zero_stage >= 2)
    out.push_back(
        {"overlap", 'o',
         format("overlap: %.3g s of the %.3g s of ZeRO-%d traffic a step (%.3g GB of gradients "
                "reduce-scattered%s, over %s, %s, unit by unit in each of %lld micro-batch%s) "
                "counted as hidden behind the micro-batches' forward and backward (%.3g s): "
                "assumed, not scheduled (nothing models its contention with the compute); "
                "--no-dp-overlap predicts it exposed",
                r.dp_hidden_seconds, r.dp_reduce_seconds, l.zero_stage, r.dp_reduced_bytes / 1e9,
                l.zero_stage == 3 ? format(" and %.3g GB of weights all-gathered",
                                           r.dp_gathered_bytes / 1e9).c_str()
                                  : "",
                gradient_group_text(l).c_str(), link, static_cast<long long>(r.microbatches),
                r.microbatches == 1 ? "" : "es", r.dp_window_seconds)});
  if (r.step_seconds > 0.0 && r.time.cp_comm > kWarnRingExposed * r.step_seconds)
    out.push_back(
        {"ring", 'r',
         format("ring: %.3g s of the %.4g s step (%.1f %%, over %.0f %%) is the context ring's "
                "K/V and dK/dV transfers (%.3g MB blocks over CP %lld, %s) that the attention "
                "of a ring step does not cover (of %.3g s of transfers); fewer context ranks, a "
                "context group within a node or a longer sequence per rank hide more",
                r.time.cp_comm, r.step_seconds, 100.0 * r.time.cp_comm / r.step_seconds,
                100.0 * kWarnRingExposed, r.cp_block_bytes / 1e6, static_cast<long long>(l.cp),
                l.tp * l.cp <= p.hw.devices_per_node ? "within a node" : "across nodes",
                r.cp_ring_seconds)});
  if (l.cp > 1 && l.tp * l.cp > p.hw.devices_per_node)
    out.push_back(
        {"context_nodes", 'x',
         format("context_nodes: the context group (CP %lld of ranks TP %lld apart: TP x CP = %lld "
                "> %lld devices per node) crosses nodes, so its ring runs on the inter-node link "
                "(%.4g GB/s a device against %.4g within a node)",
                static_cast<long long>(l.cp), static_cast<long long>(l.tp),
                static_cast<long long>(l.tp * l.cp), static_cast<long long>(p.hw.devices_per_node),
                p.hw.inter_node.bandwidth_gbs, p.hw.intra_node.bandwidth_gbs)});
  if (r.step_seconds > 0.0 &&
      (r.time.checkpoint > kWarnCheckpoint * r.step_seconds || r.checkpoint_backlog)) {
    const char* advice =
        r.checkpoint_backlog
            ? "the write outlasts the interval's steps, so each save waits for the one before: "
              "a longer checkpoint.interval or faster storage"
        : p.checkpoint_async || p.hw.device.kind != "gpu"
            ? "a longer checkpoint.interval spreads it over more steps (a CPU's asynchronous "
              "writer shares the step's cores)"
            : "checkpoint.async = true writes while training goes on";
    out.push_back(
        {"checkpoint", 'c',
         format("checkpoint: a save every %lld steps (%s) costs %.3g s of the %.4g s step on "
                "average (%.1f %%%s): %s; %s",
                static_cast<long long>(p.checkpoint_interval),
                p.checkpoint_async ? "asynchronous" : "synchronous", r.time.checkpoint,
                r.step_seconds, 100.0 * r.time.checkpoint / r.step_seconds,
                r.checkpoint_backlog ? ""
                                     : format(", over %.0f %%", 100.0 * kWarnCheckpoint).c_str(),
                checkpoint_save_text(p, r).c_str(), advice)});
  }
  return out;
}

std::string checkpoint_save_text(const PlanProblem& p, const Prediction& r) {
  std::string staging = "no staging copy (written from the state)";
  if (r.checkpoint_staging_bytes > 0.0)
    staging = format("staging %.3g GB a rank in %.3g s%s", r.checkpoint_staging_bytes / 1e9,
                     r.checkpoint_staging_seconds,
                     p.hw.device.kind == "gpu" && p.hw.device.host_link_gbs <= 0.0
                         ? " (not counted: no device.host_link_gbs)"
                         : "");
  return format("%.3g GB written at %.4g GB/s in %.3g s; %s", r.checkpoint_bytes / 1e9,
                p.hw.storage_write_gbs, r.checkpoint_write_seconds, staging.c_str());
}

}  // namespace trident
