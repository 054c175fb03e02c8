#pragma once
// GPT-2 (pre-LN blocks, final LayerNorm, LM head tied to the token embedding) as held by one
// rank: a range of layers of one pipeline stage, with Megatron-style tensor parallelism inside.
//
// Sequence parallelism (ModelShard::sequence_parallel) replaces each forward all-reduce of [N,C]
// by a reduce-scatter to the rank's rows and the LayerNorm that follows runs on those rows; the
// next column-parallel matmul all-gathers its input. Backward mirrors it. LayerNorm gradients
// are then partial per tensor rank (ParamInfo::tensor_partial_grad; the trainer sums them);
// the embeddings' and row-parallel biases' gradients are computed from all-gathered rows.
//
// Tensor parallelism (tp ranks of the tensor group; tp = 1 is the single-rank model):
//  * qkv and mlp.fc1 are column-parallel (each rank owns some heads / some FFN columns),
//    attn.proj and mlp.fc2 row-parallel: exactly one all-reduce of [N,C] after each of the two
//    row-parallel matmuls in forward, one after each of the two column-parallel input-gradient
//    matmuls in backward. Row-parallel biases are added by tensor rank 0 only, before the sum.
//  * The token embedding is vocab-parallel (each rank owns a block of rows of the padded
//    vocabulary): lookup then one all-reduce of [N,C]; the LM head reuses it, and the
//    cross-entropy reduces row max (N values) and [sum-exp | target logit] (2N values) across
//    the group, never gathering the logits; backward all-reduces the LM head's input gradient.
//  * LayerNorms, the position table and row-parallel biases are replicated; their gradients are
//    computed from replicated activations and stay identical on every tensor rank.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "model/params.hpp"
#include "tensor/buffer.hpp"

namespace trident {

// What part of the model this rank holds.
struct ModelShard {
  int tp_rank = 0;
  int tp_size = 1;
  int64_t layer_begin = 0;  // [layer_begin, layer_end) of model.layers
  int64_t layer_end = 0;
  bool has_embedding = true;  // first pipeline stage
  bool has_head = true;       // last pipeline stage (final LN, LM head, loss)
  // Sequence parallelism (tp_size > 1): outside the tensor-parallel matmuls (LayerNorms,
  // residual adds, the stream between stages) each tensor rank holds rows
  // [tp_rank * N/tp, (tp_rank + 1) * N/tp) of the N = B*T rows; the all-reduce after a
  // row-parallel matmul becomes a reduce-scatter and the input of a column-parallel one is
  // all-gathered (the same bytes, activations 1/tp).
  bool sequence_parallel = false;
  static ModelShard whole(const ModelConfig& m) { return {0, 1, 0, m.layers, true, true}; }
};

int64_t padded_vocab_size(const ModelConfig& m, int tp_size);

// GPT-2 initial values of this rank's part of `p` (Normal: N(0, 0.02); NormalResidual:
// N(0, 0.02/sqrt(2 layers)); Zeros; Ones), drawn from the counter-based RNG keyed by (seed,
// name, global index), so any layout gets the same global tensor. Padding elements are 0.
template <typename F>
void init_parameter(const ParamInfo& p, uint64_t seed, int64_t layers, F* out);

template <typename F>
class Gpt {
 public:
  // Activations of one micro-batch, kept from its forward until its backward.
  // Rows marked [Ns,...] are the rank's sequence shard under sequence parallelism (Ns = N/tp),
  // all N rows otherwise.
  struct LayerActs {
    Buffer<F> input;                 // [Ns,C] residual stream entering the layer
    Buffer<F> ln1, ln1_mean, ln1_rstd;  // [N,C] (all-gathered), [Ns], [Ns]
    Buffer<F> qkv;                   // [N, 3*Cl]
    Buffer<F> att;                   // [B, NHl, T, T]
    Buffer<F> atty;                  // [N, Cl]
    Buffer<F> residual1;             // [Ns,C] input + attention branch
    Buffer<F> ln2, ln2_mean, ln2_rstd;  // [N,C] (all-gathered), [Ns], [Ns]
    Buffer<F> fc1;                   // [N, 4Cl] pre-activation
    Buffer<F> gelu;                  // [N, 4Cl]
  };
  struct Activations {
    int64_t B = 0, T = 0;
    std::vector<int32_t> tokens, targets;  // [N]
    std::vector<LayerActs> layers;
    Buffer<F> output;                // [Ns,C] residual stream leaving the stage
    Buffer<F> lnf, lnf_mean, lnf_rstd;  // [N,C] (all-gathered), [Ns], [Ns]
    Buffer<F> logits;                // [N, Vl] (gradients overwrite it in backward)
    Buffer<F> row_max, sums, losses; // [N], [2N], [N]
    F loss = 0;                      // mean loss of the micro-batch (last stage)
  };

  Gpt(const ModelConfig& config, const ModelShard& shard, Communicator& tensor_comm)
      : Gpt(config, shard, tensor_comm, true) {}

  // Every parameter of the global model (names, global shapes), without allocating any of
  // them: what a checkpoint holds, whatever the layout that writes or reads it.
  static std::vector<ParamInfo> global_parameters(const ModelConfig& config);
  // The parameters `shard` holds with their flat offsets, without allocating them: the layout
  // of the flat weight and gradient buffers on every device.
  static std::vector<ParamInfo> shard_parameters(const ModelConfig& config,
                                                 const ModelShard& shard);

  const ModelConfig& config() const { return config_; }
  const ModelShard& shard() const { return shard_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo& param(const std::string& name) const;
  Buffer<F>& weights() { return weights_; }
  Buffer<F>& grads() { return grads_; }
  const Buffer<F>& weights() const { return weights_; }
  const Buffer<F>& grads() const { return grads_; }
  int64_t vocab_begin() const { return vocab_begin_; }
  int64_t local_vocab() const { return local_vocab_; }

  // GPT-2 init from the counter-based RNG keyed by (seed, parameter name, global index).
  void init_weights(uint64_t seed);
  void zero_grads();

  Activations make_activations(int64_t B) const;
  // Rows of the residual stream this rank holds for a micro-batch of B sequences: B*T, or
  // B*T/tp under sequence parallelism (what crosses pipeline stages).
  int64_t stream_rows(int64_t B) const;
  int64_t activation_bytes(int64_t B) const;

  // Forward one micro-batch. First stage: `tokens` [B,F]; other stages: `input`
  // [stream_rows(B), C].
  // Last stage: `targets` [B,F]; returns the mean loss over B*F tokens (0 elsewhere).
  F forward(Activations& a, const int32_t* tokens, const int32_t* targets, const F* input);
  // Backward of the micro-batch whose forward filled `a`. Last stage: the loss is scaled by
  // `loss_scale` (1/micro-batches); other stages: `d_output` [B,F,C] is the gradient arriving
  // from the next stage. Non-first stages write the gradient of their input into `d_input`.
  // Parameter gradients accumulate.
  void backward(Activations& a, F loss_scale, const F* d_output, F* d_input);

  // Called during backward with a watermark w each time every parameter gradient at flat
  // offset >= w has received its last contribution of this backward (data parallelism starts
  // reducing those buckets). Parameters are registered so that backward finishes them from
  // the end of the buffer. The embeddings at the start are never reported: under pipeline
  // parallelism the tied embedding is final only after its sum over the embedding group.
  void set_grads_final_hook(std::function<void(int64_t)> hook) { grads_final_ = std::move(hook); }

 private:
  Gpt(const ModelConfig& config, const ModelShard& shard, Communicator& tensor_comm,
      bool allocate);
  F* w(int index) { return weights_.data() + params_[index].offset; }
  F* g(int index) { return grads_.data() + params_[index].offset; }
  int add_param(const std::string& name, std::vector<int64_t> global_shape, int split_dim,
                std::vector<ShardBlock> blocks, Init init, bool decay);
  void layer_forward(int64_t l, LayerActs& la, const F* input, F* output, int64_t B, int64_t T);
  void layer_backward(int64_t l, LayerActs& la, F* d_stream, int64_t B, int64_t T);

  struct LayerParams {
    int ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };
  ModelConfig config_;
  ModelShard shard_;
  Communicator& tp_;
  int64_t C_, Cl_, Fl_, NHl_, HS_;   // width, local width, local FFN width, local heads, head size
  int64_t vocab_begin_ = 0, local_vocab_ = 0;
  std::vector<ParamInfo> params_;
  std::vector<LayerParams> layer_params_;
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;
  Buffer<F> weights_, grads_;
  std::function<void(int64_t)> grads_final_;
  void report_final(int64_t watermark) {
    if (grads_final_) grads_final_(watermark);
  }
  // Backward scratch shared by all micro-batches (one backward runs at a time).
  Buffer<F> d_stream_, d_ln_, d_tmp_, d_qkv_, d_atty_, d_fc1_, d_gelu_, d_att_;
  // Sequence parallelism: [N,C] partial sums before their reduce-scatter (forward) and
  // all-gathered stream gradients (backward); [Ns,C] reduce-scattered input gradients.
  Buffer<F> full_, d_full_, d_shard_;
  bool sp_ = false;
  int64_t shard_row0(int64_t B) const { return sp_ ? shard_.tp_rank * stream_rows(B) : 0; }
  // out[Ns,C] = this rank's rows of the sum over the tensor group of full[N,C].
  void reduce_scatter_rows(F* out, F* full, int64_t rows);
  // full[N,C] = all ranks' rows; this rank's are read from `mine` (may be full + row0 * C).
  void all_gather_rows(F* full, const F* mine, int64_t rows);
  // The summed input gradient of a column-parallel matmul from this rank's partial [N,C]: the
  // whole sum in place, or this rank's rows of it (in d_shard_) under sequence parallelism.
  const F* sum_input_grads(F* partial, int64_t rows);
  // The stream gradient of all N rows from this rank's `rows` rows: `d` itself, or the
  // all-gather (in d_full_) under sequence parallelism.
  const F* gathered_stream_grad(const F* d, int64_t rows);
};

}  // namespace trident
