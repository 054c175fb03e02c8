#pragma once
// The transformer as held by one rank: a range of layers of one pipeline stage with
// Megatron-style tensor parallelism inside (model/tensor_parallel.hpp), for both
// architectures (model/architecture.hpp), written once over a kernel set K:
//   CpuKernels<float>   the CPU trainer          (model/cpu_kernels.hpp)
//   CpuKernels<double>  finite-difference tests
//   CudaKernels<float>, CudaKernels<bf16>        (cuda/cuda_kernels.hpp)
// K supplies the element types (T activations and compute weights, G master weights and
// gradients, S statistics), the device memory and the kernels; the graph below decides what is
// computed, in which order, and where the tensor group communicates.
//
// One block (pre-norm; x is this rank's rows of the residual stream):
//   h   = x + proj(attention(rope(qkv(norm1(x)))))     rope: llama only
//   out = h + down(act(up(norm2(h))))                   act: gelu(fc1) / silu(gate) * up
// qkv and up are column-parallel, proj and down row-parallel: one collective after each
// row-parallel layer in forward and one after each column-parallel input gradient in backward.
//
// The definitions are in transformer_impl.hpp, instantiated where the kernel set is compiled
// (model/cpu_model.cpp, cuda/cuda_model.cpp).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "model/architecture.hpp"
#include "model/context_parallel.hpp"
#include "model/model_stats.hpp"
#include "model/moe.hpp"
#include "model/tensor_parallel.hpp"
#include "model/zero_shards.hpp"
#include "tensor/device.hpp"

namespace trident {

template <class K>
class Transformer {
 public:
  using T = typename K::T;
  using G = typename K::G;
  using S = typename K::S;
  using Saved = typename K::Saved;

  // Activations of one micro-batch, kept from its forward until its backward. [Ns,...] rows are
  // the rank's sequence shard under sequence parallelism (Ns = N/tp), all N rows otherwise.
  // What a layer holds depends on shard().recompute: everything below but norm1, norm2 and
  // act (none); that but `att` (selective: attention's saved state is recomputed in backward);
  // only `input` (full: the layer's forward is rerun in backward into a workspace held once,
  // see backward_stash), plus under a split backward the linear layers' inputs (norm1, atty,
  // norm2, act) kept from backward_input to backward_weight. The norms' outputs and the MLP
  // activation are never kept otherwise: forward computes them into scratch held once per
  // rank (norm_scratch(), act_scratch()) and backward recomputes them there from `input`,
  // `residual1` and `up` with the same kernels, so to the bit (recomputed_norm1 and the
  // others). model_stats.hpp's layer_activation_bytes counts the stash.
  struct LayerActs {
    DeviceArray<T> input;                  // [Ns,C] residual stream entering the layer
    DeviceArray<T> norm1;                  // [N,C] normed input (full + split backward only)
    DeviceArray<S> norm1_mean, norm1_rstd; // [Ns] (mean: LayerNorm only)
    DeviceArray<T> qkv;                    // [N, (NHl + 2 KVHl) HS], q and k rotated (llama)
    DeviceArray<Saved> att;                // what K's attention keeps for backward
    DeviceArray<T> atty;                   // [N, NHl HS] attention output
    DeviceArray<T> residual1;              // [Ns,C] input + attention branch
    DeviceArray<T> norm2;                  // [N,C] (full + split backward only)
    DeviceArray<S> norm2_mean, norm2_rstd; // [Ns]
    DeviceArray<T> up;                     // [N, Ul]: fc1 pre-activation / [gate | up]
    DeviceArray<T> act;                    // [N, Fl]: gelu(fc1) / silu(gate) * up (idem)
    // Split backward only (make_activations(B, true)): the linear layers' output gradients,
    // kept from backward_input to backward_weight (their inputs are kept above anyway).
    DeviceArray<T> d_qkv;                  // [N, QKVl] (after the rope backward)
    DeviceArray<T> d_proj;                 // [N, C] all rows (gathered under SP)
    DeviceArray<T> d_up;                   // [N, Ul]
    DeviceArray<T> d_down;                 // [N, C] all rows (gathered under SP)
    // A MoE layer's router and expert tensors (model/moe.hpp) in place of up / act; kept
    // unless under full recomputation. Its gradients are never deferred (split backward).
    MoeActs<K> moe;
  };
  struct Activations {
    int64_t B = 0;
    int chunk = 0;                         // the shard's model chunk (ModelShard::chunks)
    DeviceArray<int32_t> tokens, targets;  // [N]
    // Packed documents (ModelShard::masks_documents()), from the micro-batch's tokens on every
    // stage: each row's document start (model/documents.hpp) for attention, and with
    // ModelConfig::position_reset its position in its document. Empty otherwise.
    DeviceArray<int32_t> doc_start, doc_positions;  // [N]
    // Under context parallelism: the local rows' document starts as positions in the sequence
    // (the ring's merges; doc_start holds them as local rows). Empty otherwise.
    DeviceArray<int32_t> doc_start_position;         // [N]
    std::vector<LayerActs> layers;         // the chunk's
    DeviceArray<T> output;                 // [Ns,C] residual stream leaving the chunk
    // [N,C] the final norm's output; after a training forward, its first [Ns,C] hold
    // dL/d(final norm's output) for backward instead (head_forward).
    DeviceArray<T> final_norm;
    DeviceArray<S> final_mean, final_rstd; // [Ns]
    // The logits are not kept: the head and the loss run over chunks of rows (head_forward),
    // and a training forward forms the head's gradients chunk by chunk. Kept: the loss
    // statistics, per chunk of R rows starting at row r0: row_max[r0, r0+R),
    // sums[2*r0, 2*r0 + 2R) ([sum-exp | target logit] of the chunk), losses[r0, r0+R).
    DeviceArray<S> row_max, sums, losses;  // [N], [2N], [N]
    S head_grad_scale = S(0);  // the last chunk's forward: its loss_scale (0: no gradients)
    bool split_backward = false;           // made for backward_input + backward_weight
  };

  Transformer(const ModelConfig& config, const ModelShard& shard, Communicator& tensor_comm,
              K kernels);

  const ModelConfig& config() const { return config_; }
  const ModelShard& shard() const { return shard_; }
  // train.fp8_recipe = "delayed": the scaling state of the shard's FP8 GEMMs; else nullptr.
  Fp8DelayedRecipe* fp8_delayed() { return fp8_delayed_.get(); }
  const ParamLayout& layout() const { return layout_; }
  const std::vector<ParamInfo>& params() const { return layout_.params; }
  const ParamInfo& param(std::string_view name) const;
  K& kernels() { return k_; }

  // Flat master weights and gradients (params() offsets), in K's device memory, stored as
  // weight_store() and grad_store() say: the whole buffer, or under ZeRO-2/3 (set_zero) the
  // rank's slices, packed.
  G* weights() { return weights_sharded() ? zero_->master() : master_.data(); }
  // The compute copy of weights() in bf16 (kernels_keep_compute_copy), else nullptr (and at ZeRO-3,
  // where each unit's copy is gathered when read).
  T* compute_weights() {
    return !kernels_keep_compute_copy<K> || weights_sharded() ? nullptr : compute_.data();
  }
  G* grads() { return zero_ ? zero_->grads() : grads_.data(); }
  int64_t flat_size() const { return layout_.flat_size; }
  const FlatStore& weight_store() const { return weights_sharded() ? zero_->store() : whole_; }
  const FlatStore& grad_store() const { return zero_ ? zero_->store() : whole_; }
  // ZeRO-2/3 (ModelShard::zero_stage; model/zero_shards.hpp): shard the gradients (stage 2)
  // and the master weights (stage 3) over `data`, the stacked experts over `expert_data`
  // (nullptr: data). Before init_weights; weights()/grads() then hold the rank's slices.
  void set_zero(Communicator& data, Communicator* expert_data);
  // ZeRO-2/3: reduce-scatter the gradients backward left whole (a unit whose backward did not
  // end in this rank's passes: the tied LM head's on the last stage). A no-op otherwise.
  void reduce_gradients() {
    if (zero_) zero_->reduce_all();
  }
  // The model state's bytes on this rank by kind (moments: none; the optimizer holds them).
  ModelStateBytes state_bytes() const;
  // Init from the counter-based RNG keyed by (seed, parameter name, global index).
  void init_weights(uint64_t seed);
  void zero_grads();
  // After anything but the model wrote weights(): a bf16 model refreshes its compute copy.
  void weights_changed();
  // The packed bf16 copy of the compute weights (kernels_pack_bf16_weights), for the optimizer
  // to write as it updates weights() (AdamW::update's bf16_copy); nullptr where there is none
  // (another kernel set, ZeRO-3). After it did, bf16_copy_written() derives the compute copy
  // from it in place of weights_changed().
  uint16_t* packed_weights() {
    return packed_.size() > 0 && !weights_sharded() ? packed_.data() : nullptr;
  }
  void bf16_copy_written();

  // The shard's model chunks (ModelShard::layer_chunks); forward and backward run one chunk,
  // the one its activations were made for.
  int chunk_count() const { return static_cast<int>(chunk_block0_.size()); }
  // `split_backward`: also the buffers backward_input keeps for backward_weight. `chunk`: the
  // model chunk they are for (0 .. chunk_count()-1).
  Activations make_activations(int64_t B, bool split_backward = false, int chunk = 0);
  // Rows of the residual stream this rank holds for B sequences (what crosses stages).
  int64_t stream_rows(int64_t B) const { return tp_.rows(B * Tl_); }
  // Bytes make_activations(B, split_backward, chunk) allocates (model_stats.hpp's
  // layer_activation_bytes per layer, for the shard's recompute mode).
  int64_t activation_bytes(int64_t B, bool split_backward = false, int chunk = 0) const;
  // What a split backward keeps per micro-batch from backward_input to backward_weight beyond
  // the forward's activations: sizeof(T) * N * (2C + QKVl + Ul) per layer, the linear layers'
  // output gradients (the LM head has none: the training forward forms its weight gradient),
  // and under full recomputation their inputs, sizeof(T) * N * (2C + Hl + Fl).
  int64_t deferred_weight_grad_bytes(int64_t B, int chunk = 0) const;
  // Bytes held once (not per micro-batch) for one chunk of the LM head's logits on the stage
  // that runs the head (model_stats.hpp's lm_head_scratch_bytes), 0 elsewhere.
  int64_t head_scratch_bytes(int64_t B) const;
  // Bytes held once (not per micro-batch) to recompute in, for micro-batches of B sequences
  // (model_stats.hpp's recompute_workspace_bytes); 0 without recomputation (the norms'
  // outputs and the MLP activation are recomputed in the backward's scratch).
  int64_t recompute_workspace_bytes(int64_t B) const;
  // The backward's scratch held once (model_stats.hpp's backward_scratch_bytes): allocated by
  // the first forward and backward of B-sequence micro-batches.
  int64_t backward_scratch_bytes(int64_t B) const;
  // The figures model_stats.hpp counts activations from, for this shard and kernel set.
  ActivationShape activation_shape(int64_t B, bool split_backward) const;

  // Forward one micro-batch through the chunk of `a` (below, "first stage" is chunk 0 of the
  // first stage and "last stage" the last chunk of the last; other chunks are in between).
  // First stage: `tokens` [B*T] (host memory; every stage's when the shard masks documents,
  // ModelShard::document_eod); other stages: `input`
  // [stream_rows(B), C] (device memory). Last stage: `targets` [B*T] (host); the mean loss over
  // the B*T tokens is added to a sum in device memory (no host synchronisation).
  // `loss_scale`: for training, the scale the micro-batch's backward will be called with
  // (1/micro-batches): the last chunk then also forms the LM head's gradients (weight gradient
  // accumulated, input gradient kept in `a`), so that its logits are computed once; 0 for a
  // forward without backward (evaluation, tools), which touches no gradient.
  void forward(Activations& a, const int32_t* tokens, const int32_t* targets, const T* input,
               S loss_scale);
  // After a forward of the last chunk with loss_scale 0: its logits [N, Vl] into `out` (K's
  // device memory) from the kept final norm, for tools that read them
  // (bench/trident_logits.cpp). Training never forms them whole (head_forward).
  void logits(const Activations& a, T* out);
  // The sum of the mean losses of the forwards since the last call (0 off the last stage); resets
  // it. The one device-to-host read of the losses.
  double take_loss_sum();
  // The MoE layers' auxiliary losses and expert loads over the forwards since the last call
  // (the shard's layers only); resets them. Empty loads for a dense model.
  MoeStats take_moe_stats() { return moe_.take_stats(); }
  void take_moe_stats(MoeStats& into) { moe_.take_stats(into); }  // into's load list reused
  // Expert parallelism (ModelShard::ep_size > 1): the expert group (grid/grid.hpp), whose size
  // and rank must be the shard's; before the first activations are made. Throws
  // trident::Error when they differ.
  void set_expert_group(Communicator* group);
  // Context parallelism (ModelShard::cp_size > 1): the context group (grid/grid.hpp), whose
  // size and rank must be the shard's; before the first forward. The rank then holds
  // seq_len / CP rows of each sequence (model/context_parallel.hpp's chunk layout): forward
  // takes the whole sequences' tokens and targets and keeps its rows, attention runs the ring.
  // Throws trident::Error when the group is not the shard's.
  void set_context_group(Communicator* group);
  // Backward of the micro-batch whose forward filled `a`. Last stage: the loss is scaled by
  // `loss_scale` (1/micro-batches), the one the forward was given (else trident::Error);
  // other stages: `d_output` [stream_rows(B), C] arrives from the
  // next stage. Non-first stages write the gradient of their input into `d_input`. Parameter
  // gradients accumulate.
  void backward(Activations& a, S loss_scale, const T* d_output, T* d_input);
  // The same backward in two parts (the zero-bubble schedules; `a` from make_activations(B,
  // true)). backward_input: everything but the linear layers' weight and bias gradients (the
  // input gradient, the norms' and embeddings' gradients; the LM head's weight gradient was
  // formed in forward, in micro-batch order, as for backward()); keeps the linear layers'
  // output gradients in `a`. backward_weight: those
  // weight and bias gradients, from what `a` kept. Each gradient receives the same
  // contributions from the same kernels as in backward(), so when a step runs the
  // backward_weights in micro-batch order the gradients are those of backward() to the bit.
  // The grads-final hook is called from backward_weight only (the linear layers' gradients are
  // final only there), with the same watermarks in the same order as backward().
  void backward_input(Activations& a, S loss_scale, const T* d_output, T* d_input);
  void backward_weight(Activations& a);

  // ---------------------------------------------------------------- decoding (generation)
  // The same blocks, kernels and tensor-group collectives as forward(), one new token per
  // sequence at a time against a key/value cache: B sequences (rows), row b holding the token at
  // position positions[b] < seq_len of its sequence, whose earlier positions were decoded into
  // the cache before (positions may differ between rows). The cache keeps each layer's rotated
  // keys and values of this rank's kv heads. No sequence parallelism here (B rows need not divide
  // by the group: the group's own view without it). Needs the whole model on the shard (pipeline
  // 1, one chunk). Collective over the tensor group.
  struct KvCache {
    int64_t B = 0;
    std::vector<DeviceArray<T>> k, v;        // per layer [B, KVHl, seq_len, HS]
    std::unique_ptr<TensorParallel<K>> tp;   // the tensor group without sequence parallelism
    DeviceArray<int32_t> tokens, positions;  // [B]
    DeviceArray<T> x, norm, qkv, atty, residual, up, act, logits, gathered;  // one step's rows
    DeviceArray<S> mean, rstd;               // [B] the norms' statistics (not kept)
    std::vector<float> host;                 // [tp, B, Vl] the gathered logits
  };
  KvCache make_kv_cache(int64_t B);
  // logits [B, vocab_size] (host) of the token after each row's: the vocab-parallel head's
  // blocks are all-gathered, so every rank of the group gets the same bits (and samples the same
  // token from them).
  void forward_decode(KvCache& cache, const int32_t* tokens, const int32_t* positions,
                      float* logits);

  // Called during backward with a watermark w each time every parameter gradient at flat offset
  // >= w has received its last contribution of this backward (data parallelism starts reducing
  // those buckets). The token embedding at offset 0 is never reported: under pipeline
  // parallelism a tied embedding is final only after its sum over the embedding group. With
  // several chunks a backward reports only its own chunk's parameters; the later chunks' lie
  // above them in the buffer, so a step that runs each chunk's last backward from the last
  // chunk down (the interleaved schedule does) reports falling watermarks.
  void set_grads_final_hook(std::function<void(int64_t)> hook) { grads_final_ = std::move(hook); }

 private:
  const T* w(int i) const;
  // ZeRO-3: the master weights are the rank's slices, a unit's compute copy gathered when read.
  bool weights_sharded() const { return zero_ && zero_->stage() == 3; }
  // Parameter i's gradient. Under ZeRO-2/3 only where gradients are formed (backward, and the
  // LM head's in a training forward: taking_grads_), else nullptr: asking opens the unit's
  // window, and a forward's LinearParams would open every layer's.
  G* g(int i) {
    if (i < 0) return nullptr;
    const int64_t offset = layout_.params[i].offset;
    if (!zero_) return grads_.data() + offset;
    return taking_grads_ ? zero_->grad(i, offset) : nullptr;
  }
  // Sets taking_grads_ for its lifetime.
  struct TakingGrads {
    bool& flag;
    bool before;
    TakingGrads(bool& f, bool now) : flag(f), before(f) { flag = now; }
    ~TakingGrads() { flag = before; }
  };
  // ZeRO-2/3: the backward of the running micro-batch is done with the layer of block parameter
  // `param`, with the final norm and LM head, with the embeddings: their gradients are reduced.
  void reduce_layer_of(int param);
  void reduce_head();
  void reduce_embeddings();
  // ZeRO-3: a pass over chunk `chunk` starts (forward or backward; model/zero_shards.hpp).
  void begin_pass(int chunk, bool backward);
  void init_sharded_weights(uint64_t seed);
  LinearParams<K> linear(int weight, int bias);
  // Dense linear layer `gemm` of block i: linear() of its weight and bias, in FP8 where
  // train.precision = "fp8" covers the block's layer (Fp8Settings::covers), with the GEMM's
  // delayed scaling state under that recipe.
  LinearParams<K> dense(size_t i, Fp8Gemm gemm);
  int64_t block_layer(size_t i) const;  // the model layer of block i
  void norm_forward(T* out, S* mean, S* rstd, const T* inp, int w, int b, int64_t rows);
  void norm_backward(T* dinp, const T* dout, const T* inp, int w, int b, const S* mean,
                     const S* rstd, int64_t rows);
  // residual += x, then out = norm(residual): fused where the kernel set has it.
  void add_norm_forward(T* out, S* mean, S* rstd, T* residual, const T* x, int w, int b,
                        int64_t rows);
  // d_stream += the norm's input gradient: without the scratch and the add where fused.
  void norm_backward_into_stream(T* d_stream, const T* dout, const T* inp, int w, int b,
                                 const S* mean, const S* rstd, int64_t rows);
  void layer_forward(size_t i, LayerActs& la, const T* input, T* output, int64_t B);
  // defer_weights: backward_input's part only (see there).
  void backward_pass(Activations& a, S loss_scale, const T* d_output, T* d_input,
                     bool defer_weights);
  // The forward tensors layer i's backward reads: `kept` itself, or under full recomputation the
  // workspace the layer's forward is rerun into from kept.input.
  LayerActs& backward_stash(size_t i, LayerActs& kept, int64_t B);
  // Backward of layer i from its forward tensors `la`; a deferred (split) backward keeps the
  // output gradients in `kept`, the micro-batch's own LayerActs.
  void layer_backward(size_t i, LayerActs& la, LayerActs& kept, T* d, int64_t B,
                      bool defer_weights);
  // Attention's backward, recomputing its saved state first under selective recomputation.
  void attention_backward(LayerActs& la, T* d_qkv, int64_t B);
  // Attention, rotary embeddings and their backward over the rank's rows: the kernels' own on
  // one context rank, the ring and the rotation at the rows' positions otherwise.
  void attention_forward(T* out, Saved* saved, const T* qkv, int64_t B);
  void rope_forward(T* qkv, int64_t B);
  // Learned positions: x (the rank's stream rows) += wpe at their positions, and wpe's gradient
  // from d_all (all B * Tl_ rows).
  void position_embedding_forward(T* x, int64_t B);
  void position_embedding_backward(const T* d_all, int64_t B);
  void rope_backward(T* d_qkv, int64_t B);
  // The rank's rows of B whole sequences' ids [B*seq_len] (host): `ids` itself without context
  // parallelism, else gathered into host_ids_.
  const int32_t* local_rows(const int32_t* ids, int64_t B);
  // Device [B*Tl_]: the position in its sequence of each of the rank's rows (context ring only).
  const int32_t* positions(int64_t B);
  // Packed documents: the document starts (and positions) of the micro-batch's host `tokens`
  // into `a` (forward); which the kernels read while `a` runs (forward and backward). Nothing
  // without documents.
  void read_documents(Activations& a, const int32_t* tokens);
  void use_documents(const Activations& a);
  // The buffers of one layer's stash for `mode` (see LayerActs); `moe`: with a MoE layer's.
  LayerActs make_layer_acts(int64_t B, Recompute mode, bool split_backward, bool moe);
  // The MoE MLP of block i (model/moe.hpp): forward into the rank's output rows from norm2,
  // and its backward returning the rank's rows of dL/d(norm2).
  void moe_forward(size_t i, LayerActs& la, T* norm2, T* output, int64_t B);
  const T* moe_backward(size_t i, LayerActs& la, const T* norm2, const T* d, int64_t B);
  // Block i's router and experts, the experts' GEMMs in FP8 where train.precision = "fp8"
  // covers the block's layer (Fp8Linear's experts_*), with their delayed scaling states under
  // that recipe.
  MoeParams<K> moe_params(size_t i);
  // The forward tensors not kept in the stash, recomputed from what is: a norm's output [N,C]
  // (all rows, gathered under sequence parallelism) into `out` from its input rows [Ns,C], its
  // statistics written again (the same values); the MLP activation [N,Fl] into `out` from
  // la.up. The forward's kernels on the forward's inputs: the forward's bits. NormRows::Own
  // leaves the gather to the caller (the rank's rows at first_row(N)): the column-parallel
  // layer that reads it gathers during its input gradient (ColumnParallelLinear::backward).
  enum class NormRows { Gathered, Own };
  T* recomputed_norm(T* out, S* mean, S* rstd, const T* inp, int w, int b, int64_t B,
                     NormRows rows);
  T* recomputed_norm1(LayerActs& la, T* out, size_t i, int64_t B,
                      NormRows rows = NormRows::Gathered);
  T* recomputed_norm2(LayerActs& la, T* out, size_t i, int64_t B,
                      NormRows rows = NormRows::Gathered);
  T* recomputed_act(const LayerActs& la, T* out, int64_t B);
  void act_forward(T* act, const T* up, int64_t N);
  // The MLP's up projection into `up` and its activation into `act` (one call where fuses_gelu).
  void up_and_act(TensorParallel<K>& tp, size_t i, T* up, T* act, T* norm2, int64_t N);
  // A GPT-2 MLP whose up and down GEMMs are `p`'s kind carries its GELU in their epilogues
  // (train.fused_bias_gelu, a kernel set with kernels_fuse_linear_gelu, not in FP8).
  bool fuses_gelu(const LinearParams<K>& p) const;
  // The LM head and the vocab-parallel loss over chunks of head_chunk_rows(N) rows; the chunk's
  // logits [R, Vl] in head_logits_ (held once); with loss_scale > 0 also the head's gradients.
  void head_forward(Activations& a, const int32_t* targets, S loss_scale);
  void head_backward(Activations& a, S loss_scale, T* d);
  int64_t head_chunk_rows(int64_t N) const;
  // head_logits_[R, Vl] = the head's output for rows [r0, r0+R) of the gathered final norm.
  T* head_chunk_logits(const Activations& a, int64_t r0, int64_t R);
  void ensure_head_scratch(int64_t B);
  void layer_weight_backward(size_t i, LayerActs& la, int64_t B);
  void layer_decode(size_t i, KvCache& cache);
  bool lm_head_is_tied() const { return layout_.lm_head == layout_.token_embedding; }
  bool runs_embedding(const Activations& a) const { return shard_.has_embedding && a.chunk == 0; }
  bool runs_head(int chunk) const { return shard_.has_head && chunk == chunk_count() - 1; }
  int64_t chunk_layers(int chunk) const;
  void ensure_scratch(int64_t B);
  void ensure_recompute_workspace(int64_t B);
  void report_final(int param) {
    if (grads_final_) grads_final_(layout_.params[param].offset);
  }

  ModelConfig config_;
  ModelShard shard_;
  ParamLayout layout_;
  K k_;
  TensorParallel<K> tp_;
  bool llama_;
  Recompute recompute_;
  // Rows of each sequence on this rank: seq_len, or seq_len / CP under context parallelism; and
  // the config as the rank's activations see it (seq_len = Tl_), for model_stats.hpp's counts.
  int64_t Tl_;
  ModelConfig rows_config_;
  ContextRing<K> ring_;               // inactive (one rank) unless set_context_group
  std::unique_ptr<Fp8Linear<K>> fp8_;  // train.precision = "fp8", else none
  std::unique_ptr<Fp8DelayedRecipe> fp8_delayed_;  // train.fp8_recipe = "delayed", else none
  DeviceArray<int32_t> positions_;    // positions(B)'s, for the largest B so far
  std::vector<int32_t> host_ids_;     // local_rows's
  // Packed documents: the micro-batch being run (forward / backward set them from its
  // Activations; nullptr without documents or position_reset), and the host copies they are
  // computed in.
  const int32_t* doc_start_ = nullptr;
  const int32_t* doc_positions_ = nullptr;
  const int32_t* doc_start_position_ = nullptr;
  std::vector<int32_t> host_doc_start_, host_doc_positions_, host_local_;
  std::vector<size_t> chunk_block0_;  // per chunk: its first layer's index in layout_.blocks
  // Widths on this rank: model, attention (heads), kv heads, fused qkv, MLP hidden, MLP up.
  int64_t C_, NHl_, KVHl_, HS_, Hl_, QKVl_, Fl_, Ul_;
  ColumnParallelLinear<K> qkv_, up_, head_;
  RowParallelLinear<K> proj_, down_;
  VocabParallelEmbedding<K> embedding_;
  VocabParallelCrossEntropy<K> loss_;
  MoeMlp<K> moe_;  // the MoE layers' block (model.moe_experts > 0)
  bool recomputing_ = false;  // a forward rerun for full recomputation: not counted in stats
  S loss_scale_ = S(1);  // the running backward's, for the MoE auxiliary losses
  DeviceArray<G> master_, grads_;
  FlatStore whole_;                        // the whole flat buffer: [0, flat_size)
  std::unique_ptr<ZeroShards<K>> zero_;    // ZeRO-2/3, or none
  bool taking_grads_ = false;              // in a pass that forms gradients (g())
  DeviceArray<T> compute_;  // compute copy of master_ in bf16 (kernels_keep_compute_copy)
  // compute_'s bf16 bits for a kernel set that reads its weights so (kernels_pack_bf16_weights)
  DeviceArray<uint16_t> packed_;
  DeviceArray<double> loss_sum_;  // [1]: the micro-batches' mean losses, summed
  DeviceArray<T> head_logits_;    // one chunk of logits [head_chunk_rows, Vl] (head_forward)
  DeviceArray<S> head_dloss_;     // [head_chunk_rows]: loss_scale / N, dL/d(row loss)
  int64_t head_chunk_bytes_ = 0;  // the device's default chunk (model_stats.hpp)
  std::function<void(int64_t)> grads_final_;
  // Backward scratch shared by all micro-batches (one backward runs at a time).
  int64_t scratch_rows_ = 0;
  DeviceArray<T> d_stream_, d_norm_, d_tmp_, d_qkv_, d_atty_, d_up_, d_act_;
  // Recomputation workspace, held once (recompute_workspace_bytes). Selective: attention's saved
  // state (written by every forward, recomputed before each backward) and the recomputed
  // attention output. Full: one layer's whole stash and its discarded output.
  int64_t workspace_rows_ = 0;
  DeviceArray<Saved> recompute_att_;
  DeviceArray<T> recompute_atty_, recompute_output_;
  LayerActs recompute_layer_;
  // Where the norms' outputs [N,C] and the MLP activation [N,Fl] of the layer being computed
  // live (LayerActs: never stashed). Two buffers of the backward's scratch, free whenever one
  // of them is needed: d_tmp_ holds a norm's input gradient only from that norm's backward
  // (after the linear layer reading its output is done) to the residual add that follows, and
  // d_up_ the MLP's up gradient only after the down layer's backward (the activation's last
  // reader); neither carries anything from one forward or backward to the next.
  T* norm_scratch() { return d_tmp_.data(); }
  T* act_scratch() { return d_up_.data(); }
};

}  // namespace trident
