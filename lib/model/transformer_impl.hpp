#pragma once
// Definitions of Transformer<K> (model/transformer.hpp). Included by the files that instantiate
// it for a kernel set: model/cpu_model.cpp and cuda/cuda_model.cpp.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "model/documents.hpp"
#include "model/transformer.hpp"
#include "util/error.hpp"

namespace trident {

template <class K>
Transformer<K>::Transformer(const ModelConfig& config, const ModelShard& shard,
                            Communicator& tensor_comm, K kernels)
    : config_(config),
      shard_(shard),
      layout_(parameter_layout(config, shard)),
      k_(std::move(kernels)),
      tp_(tensor_comm, shard, k_),
      llama_(config.is_llama()),
      recompute_(shard.recompute),
      Tl_(shard.seq_rows(config.seq_len)),
      rows_config_(config) {
  rows_config_.seq_len = Tl_;
  const int tp = shard.tp_size;
  head_chunk_bytes_ = lm_head_chunk_bytes(!k_.device().is_host());
  C_ = config.width;
  HS_ = config.head_size();
  NHl_ = config.heads / tp;
  KVHl_ = config.kv_head_count() / tp;
  Hl_ = NHl_ * HS_;
  QKVl_ = (NHl_ + 2 * KVHl_) * HS_;
  Fl_ = config.ffn_size() / tp;
  Ul_ = llama_ ? 2 * Fl_ : Fl_;
  size_t block0 = 0;
  for (const auto& [begin, end] : shard.layer_chunks()) {
    chunk_block0_.push_back(block0);
    block0 += static_cast<size_t>(end - begin);
  }
  if (llama_ && HS_ % 2 != 0)
    throw Error("model.width / model.heads = " + std::to_string(HS_) +
                ": rotary embeddings need an even head size");
  if (config.moe_experts > 0) {
    if constexpr (kernels_have_moe<K>)
      moe_ = MoeMlp<K>(rows_config_, Fl_, llama_);  // the rank's rows of each sequence
    else
      throw Error("model.moe_experts = " + std::to_string(config.moe_experts) +
                  ": this kernel set has no mixture of experts (the CPU's and the GPU's fp32 "
                  "ones have it)");
  }
  qkv_ = {C_, QKVl_};
  up_ = {C_, Ul_};
  proj_ = {Hl_, C_};
  down_ = {Fl_, C_};
  const int64_t local_vocab = padded_vocab_size(config, tp) / tp;
  const int64_t vocab_begin = shard.tp_rank * local_vocab;
  head_ = {C_, local_vocab};
  embedding_ = {C_, vocab_begin, local_vocab};
  loss_ = {local_vocab, vocab_begin, config.vocab_size};
  Device& dev = k_.device();
  if (shard.fp8.enabled) {
    if constexpr (kernels_have_fp8<K>)
      fp8_ = std::make_unique<Fp8Linear<K>>(shard.fp8, tensor_comm);
    else
      throw Error("train.precision = \"fp8\": this kernel set has no FP8 GEMMs (the CPU's "
                  "reference has them)");
    if (shard.fp8.delayed) {
      fp8_delayed_ = std::make_unique<Fp8DelayedRecipe>(shard.fp8.grad_format,
                                                        shard.fp8.history, shard.fp8.margin);
      for (size_t i = 0; i < layout_.blocks.size(); ++i)
        if (shard.fp8.covers(block_layer(i), config.layers))
          fp8_delayed_->add_layer(block_layer(i),
                                  layout_.blocks[i].moe() ? config.moe_experts : 0);
      fp8_delayed_->keep_amaxes_on(dev);  // the quantise passes take the step's amaxes
    }
  }
  whole_ = FlatStore::whole(layout_.flat_size);
  // ZeRO-2/3 hold slices (set_zero): the whole buffers are never made, not even for a moment.
  if (shard.zero_stage < 3) {
    master_ = DeviceArray<G>(dev, layout_.flat_size);
    if constexpr (kernels_keep_compute_copy<K>) compute_ = DeviceArray<T>(dev, layout_.flat_size);
    if constexpr (kernels_pack_bf16_weights<K>)
      if (k_.packs_weights()) packed_ = DeviceArray<uint16_t>(dev, layout_.flat_size);
  }
  if (shard.zero_stage < 2) grads_ = DeviceArray<G>(dev, layout_.flat_size);
  loss_sum_ = DeviceArray<double>(dev, 1);
}

template <class K>
double Transformer<K>::take_loss_sum() {
  double sum = 0.0;
  Device& dev = k_.device();
  dev.to_host(&sum, loss_sum_.data(), sizeof(double));
  dev.fill_zero(loss_sum_.data(), sizeof(double));
  return sum;
}

template <class K>
void Transformer<K>::set_context_group(Communicator* group) {
  const int size = group ? group->size() : 1, rank = group ? group->rank() : 0;
  if (size != shard_.cp_size || rank != shard_.cp_rank)
    throw Error("the context group (rank " + std::to_string(rank) + " of " +
                std::to_string(size) + ") is not the model shard's (context rank " +
                std::to_string(shard_.cp_rank) + " of " + std::to_string(shard_.cp_size) + ")");
  if (size == 1) return;
  if (config_.seq_len % (2 * static_cast<int64_t>(size)) != 0)
    throw Error("model.seq_len = " + std::to_string(config_.seq_len) +
                " is not divisible by 2 * parallel.context = " + std::to_string(2 * size));
  ring_ = ContextRing<K>(group, {rank, size, config_.seq_len}, NHl_, KVHl_, HS_);
  if (fp8_) fp8_->set_context_group(group);
  if (config_.moe_experts > 0) moe_.set_context_group(group);
}

template <class K>
const int32_t* Transformer<K>::local_rows(const int32_t* ids, int64_t B) {
  if (!ring_.active()) return ids;
  host_ids_.resize(static_cast<size_t>(B * Tl_));
  ring_.layout().take_local(host_ids_.data(), ids, B);
  return host_ids_.data();
}

template <class K>
const int32_t* Transformer<K>::positions(int64_t B) {
  const int64_t N = B * Tl_;
  if (positions_.size() < N) {
    std::vector<int32_t> host(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n)
      host[static_cast<size_t>(n)] = static_cast<int32_t>(ring_.layout().position(n % Tl_));
    positions_ = DeviceArray<int32_t>(k_.device(), N);
    k_.upload_ids(positions_.data(), host.data(), N);
  }
  return positions_.data();
}

template <class K>
void Transformer<K>::read_documents(Activations& a, const int32_t* tokens) {
  if (!shard_.masks_documents()) return;
  if (!tokens)
    throw Error("Transformer::forward: packed documents (data.document_mask) need the "
                "micro-batch's tokens on every pipeline stage");
  // The whole sequences' starts and positions (the tokens are whole sequences under context
  // parallelism too), then the rank's rows of them.
  const int64_t T = config_.seq_len, B = a.B, N = B * Tl_;
  host_doc_start_.resize(static_cast<size_t>(B * T));
  document_starts(host_doc_start_.data(), tokens, B, T, shard_.document_eod);
  if (config_.position_reset) {
    host_doc_positions_.resize(static_cast<size_t>(B * T));
    document_positions(host_doc_positions_.data(), host_doc_start_.data(), B, T);
    k_.upload_ids(a.doc_positions.data(), local_rows(host_doc_positions_.data(), B), N);
  }
  if (!ring_.active()) return k_.upload_ids(a.doc_start.data(), host_doc_start_.data(), N);
  // The ring: the starts as positions (merges) and as local rows (the diagonal block): the
  // first local row at or after the start, the local rows' positions increasing.
  const ContextLayout& layout = ring_.layout();
  host_local_.resize(static_cast<size_t>(N));
  layout.take_local(host_local_.data(), host_doc_start_.data(), B);
  k_.upload_ids(a.doc_start_position.data(), host_local_.data(), N);
  const std::vector<int32_t> position = layout.positions();
  for (int32_t& start : host_local_)
    start = static_cast<int32_t>(std::lower_bound(position.begin(), position.end(), start) -
                                 position.begin());
  k_.upload_ids(a.doc_start.data(), host_local_.data(), N);
}

template <class K>
void Transformer<K>::use_documents(const Activations& a) {
  doc_start_ = a.doc_start.size() > 0 ? a.doc_start.data() : nullptr;
  doc_positions_ = a.doc_positions.size() > 0 ? a.doc_positions.data() : nullptr;
  doc_start_position_ = a.doc_start_position.size() > 0 ? a.doc_start_position.data() : nullptr;
}

template <class K>
void Transformer<K>::set_expert_group(Communicator* group) {
  const int size = group ? group->size() : 1, rank = group ? group->rank() : 0;
  if (size != shard_.ep_size || rank != shard_.ep_rank)
    throw Error("the expert group (rank " + std::to_string(rank) + " of " +
                std::to_string(size) + ") is not the model shard's (expert rank " +
                std::to_string(shard_.ep_rank) + " of " + std::to_string(shard_.ep_size) + ")");
  if (config_.moe_experts > 0) moe_.set_expert_group(group);
}

template <class K>
const ParamInfo& Transformer<K>::param(std::string_view name) const {
  for (const ParamInfo& p : layout_.params)
    if (p.name == name) return p;
  throw Error("no parameter named '" + std::string(name) + "' on this rank");
}

template <class K>
const typename K::T* Transformer<K>::w(int i) const {
  if (i < 0) return nullptr;
  const int64_t offset = layout_.params[i].offset;
  if (weights_sharded()) return zero_->weight(i, offset);
  if constexpr (kernels_keep_compute_copy<K>)
    return compute_.data() + offset;
  else
    return master_.data() + offset;
}

template <class K>
LinearParams<K> Transformer<K>::linear(int weight, int bias) {
  return {w(weight), w(bias), g(weight), g(bias)};
}

template <class K>
int64_t Transformer<K>::block_layer(size_t i) const {
  const auto chunks = shard_.layer_chunks();
  for (size_t c = chunks.size(); c-- > 0;)
    if (i >= chunk_block0_[c]) return chunks[c].first + static_cast<int64_t>(i - chunk_block0_[c]);
  return 0;
}

template <class K>
LinearParams<K> Transformer<K>::dense(size_t i, Fp8Gemm gemm) {
  const BlockParams& b = layout_.blocks[i];
  const std::pair<int, int> params[] = {
      {b.qkv_w, b.qkv_b}, {b.proj_w, b.proj_b}, {b.up_w, b.up_b}, {b.down_w, b.down_b}};
  const auto [weight, bias] = params[static_cast<int>(gemm)];
  LinearParams<K> p = linear(weight, bias);
  if (!fp8_) return p;  // (block_layer builds a vector: not on every GEMM of a step)
  const int64_t layer = block_layer(i);
  if (shard_.fp8.covers(layer, config_.layers)) {
    p.fp8 = fp8_.get();
    if (fp8_delayed_) p.fp8_delayed = &fp8_delayed_->gemm(layer, gemm);
  }
  return p;
}

template <class K>
void Transformer<K>::set_zero(Communicator& data, Communicator* expert_data) {
  if (shard_.zero_stage < 2)
    throw Error("Transformer::set_zero: the shard's ZeRO stage is " +
                std::to_string(shard_.zero_stage) + " (2 or 3 shard the model)");
  zero_ = std::make_unique<ZeroShards<K>>(layout_.params, layout_.flat_size, shard_.zero_stage,
                                          data, expert_data, k_);
}

template <class K>
ModelStateBytes Transformer<K>::state_bytes() const {
  ModelStateBytes b;
  const int64_t g = sizeof(G);
  b.weights = weight_store().size() * g;
  b.gradients = grad_store().size() * g;
  b.compute = compute_.bytes() + packed_.bytes();
  if (zero_) b.gather = zero_->gather_bytes();
  return b;
}

template <class K>
void Transformer<K>::reduce_layer_of(int param) {
  if (zero_)
    zero_->reduce_layer(zero_->units()[static_cast<size_t>(zero_->unit_of(param))].layer);
}

template <class K>
void Transformer<K>::reduce_head() {
  if (!zero_) return;
  zero_->reduce_unit(zero_->unit_of(layout_.final_norm_w));
  // A tied head shares the token embedding's unit: reduced after the lookup's backward where
  // this rank runs it, here otherwise (the last stage).
  if (!lm_head_is_tied() || !shard_.has_embedding)
    zero_->reduce_unit(zero_->unit_of(layout_.lm_head));
}

template <class K>
void Transformer<K>::reduce_embeddings() {
  if (!zero_) return;
  zero_->reduce_unit(zero_->unit_of(layout_.token_embedding));
  if (layout_.position_embedding >= 0)
    zero_->reduce_unit(zero_->unit_of(layout_.position_embedding));
}

template <class K>
void Transformer<K>::begin_pass(int chunk, bool backward) {
  if (!weights_sharded()) return;
  zero_->begin_pass(backward);
  // The chunk's first layer in the pass's direction starts gathering at once.
  const size_t first = chunk_block0_[static_cast<size_t>(chunk)];
  const size_t layers = static_cast<size_t>(chunk_layers(chunk));
  if (layers == 0) return;
  const int param = layout_.blocks[backward ? first + layers - 1 : first].norm1_w;
  zero_->prefetch_layer(zero_->units()[static_cast<size_t>(zero_->unit_of(param))].layer);
}

template <class K>
void Transformer<K>::init_sharded_weights(uint64_t seed) {
  // One unit at a time through host memory: the rank's slice of each is kept.
  Device& dev = k_.device();
  std::vector<G> host;
  const auto& units = zero_->units();
  for (size_t u = 0; u < units.size(); ++u) {
    const FlatRange range = units[u].range, mine = zero_->slice_of(static_cast<int>(u));
    host.assign(static_cast<size_t>(range.size()), G(0));
    for (int i : units[u].params) {
      const ParamInfo& p = layout_.params[static_cast<size_t>(i)];
      init_parameter(p, seed, config_.layers, host.data() + (p.offset - range.begin));
    }
    dev.from_host(zero_->master() + zero_->packed_index(static_cast<int>(u)),
                  host.data() + (mine.begin - range.begin),
                  mine.size() * static_cast<int64_t>(sizeof(G)));
  }
}

template <class K>
void Transformer<K>::init_weights(uint64_t seed) {
  if (weights_sharded()) {
    init_sharded_weights(seed);
    weights_changed();
    return;
  }
  Device& dev = k_.device();
  std::vector<G> host;
  for (const ParamInfo& p : layout_.params) {
    G* dst = master_.data() + p.offset;
    if (dev.is_host()) {
      init_parameter(p, seed, config_.layers, dst);
      continue;
    }
    // One tensor of this rank's shard at a time through host memory.
    host.resize(static_cast<size_t>(p.numel()));
    init_parameter(p, seed, config_.layers, host.data());
    dev.from_host(dst, host.data(), p.numel() * static_cast<int64_t>(sizeof(G)));
  }
  weights_changed();
}

template <class K>
void Transformer<K>::zero_grads() {
  if (zero_)
    zero_->zero_grads();
  else
    k_.device().fill_zero(grads_.data(), grads_.bytes());
}

template <class K>
void Transformer<K>::weights_changed() {
  if (weights_sharded()) return zero_->weights_changed();
  if constexpr (kernels_keep_compute_copy<K>)
    k_.convert(compute_.data(), master_.data(), master_.size());
  if constexpr (kernels_pack_bf16_weights<K>)
    if (packed_.size() > 0) k_.pack_weights(packed_.data(), compute_.data(), compute_.size());
}

template <class K>
void Transformer<K>::bf16_copy_written() {
  if constexpr (kernels_pack_bf16_weights<K>)
    if (packed_weights() != nullptr)
      k_.unpack_weights(compute_.data(), packed_.data(), compute_.size());
}

template <class K>
int64_t Transformer<K>::chunk_layers(int chunk) const {
  if (chunk < 0 || chunk >= chunk_count())
    throw Error("model chunk " + std::to_string(chunk) + " is out of range: the shard holds " +
                std::to_string(chunk_count()));
  const auto [begin, end] = shard_.layer_chunk(chunk);
  return end - begin;
}

template <class K>
typename Transformer<K>::Activations Transformer<K>::make_activations(int64_t B,
                                                                     bool split_backward,
                                                                     int chunk) {
  const int64_t T_ = Tl_, N = B * T_, Ns = stream_rows(B), C = C_;
  if (tp_.sequence_parallel() && N % shard_.tp_size != 0)
    throw Error("sequence parallelism: train.micro_batch * model.seq_len (" + std::to_string(N) +
                ") must be divisible by parallel.tensor (" + std::to_string(shard_.tp_size) +
                ")");
  Device& dev = k_.device();
  Activations a;
  a.B = B;
  a.chunk = chunk;
  a.split_backward = split_backward;
  a.tokens = DeviceArray<int32_t>(dev, N);
  a.targets = DeviceArray<int32_t>(dev, N);
  if (shard_.masks_documents()) {
    a.doc_start = DeviceArray<int32_t>(dev, N);
    if (config_.position_reset) a.doc_positions = DeviceArray<int32_t>(dev, N);
    if (shard_.cp_size > 1) a.doc_start_position = DeviceArray<int32_t>(dev, N);
  }
  const bool layernorm = !llama_;
  const size_t block0 = chunk_block0_[static_cast<size_t>(chunk)];
  for (int64_t l = 0; l < chunk_layers(chunk); ++l)
    a.layers.push_back(make_layer_acts(B, recompute_, split_backward,
                                       layout_.blocks[block0 + static_cast<size_t>(l)].moe()));
  a.output = DeviceArray<T>(dev, Ns * C);
  if (runs_head(chunk)) {
    a.final_norm = DeviceArray<T>(dev, N * C);
    if (layernorm) a.final_mean = DeviceArray<S>(dev, Ns);
    a.final_rstd = DeviceArray<S>(dev, Ns);
    a.row_max = DeviceArray<S>(dev, N);
    a.sums = DeviceArray<S>(dev, 2 * N);
    a.losses = DeviceArray<S>(dev, N);
  }
  return a;
}

template <class K>
typename Transformer<K>::LayerActs Transformer<K>::make_layer_acts(int64_t B, Recompute mode,
                                                                   bool split_backward,
                                                                   bool moe) {
  const int64_t N = B * Tl_, Ns = stream_rows(B), C = C_;
  Device& dev = k_.device();
  const bool layernorm = !llama_;
  const bool forward_tensors = mode != Recompute::Full;
  LayerActs la;
  la.input = DeviceArray<T>(dev, Ns * C);
  // The attention output: read by the projection's and attention's backward, and by
  // backward_weight (copied there from the recomputed layer under full recomputation).
  if (forward_tensors || split_backward) la.atty = DeviceArray<T>(dev, N * Hl_);
  if (!forward_tensors && split_backward) {
    // backward_weight's other inputs, which nothing kept can recompute them from: written by
    // layer_backward's recomputation from the rerun layer.
    la.norm1 = DeviceArray<T>(dev, N * C);
    la.norm2 = DeviceArray<T>(dev, N * C);
    la.act = DeviceArray<T>(dev, N * Fl_);
  }
  if (forward_tensors) {
    if (layernorm) la.norm1_mean = DeviceArray<S>(dev, Ns);
    la.norm1_rstd = DeviceArray<S>(dev, Ns);
    la.qkv = DeviceArray<T>(dev, N * QKVl_);
    la.residual1 = DeviceArray<T>(dev, Ns * C);
    if (layernorm) la.norm2_mean = DeviceArray<S>(dev, Ns);
    la.norm2_rstd = DeviceArray<S>(dev, Ns);
    la.up = DeviceArray<T>(dev, N * Ul_);
  }
  if (mode == Recompute::None)
    la.att = DeviceArray<Saved>(dev, K::attention_saved_size(B, Tl_, NHl_));
  if constexpr (kernels_have_moe<K>)
    if (forward_tensors && moe) la.moe = moe_.make_acts(dev, B);
  if (split_backward) {
    la.d_qkv = DeviceArray<T>(dev, N * QKVl_);
    la.d_proj = DeviceArray<T>(dev, N * C);
    la.d_up = DeviceArray<T>(dev, N * Ul_);
    la.d_down = DeviceArray<T>(dev, N * C);
  }
  return la;
}

template <class K>
ActivationShape Transformer<K>::activation_shape(int64_t B, bool split_backward) const {
  const int64_t T_ = Tl_;
  ActivationShape s;
  s.micro_batch = B;
  s.tp = shard_.tp_size;
  s.sequence_parallel = tp_.sequence_parallel();
  s.recompute = recompute_;
  s.split_backward = split_backward;
  s.element_bytes = sizeof(T);
  s.stat_bytes = sizeof(S);
  s.attention_saved_per_row = K::attention_saved_size(1, T_, 1) / T_;
  s.attention_saved_bytes = sizeof(Saved);
  s.fp8 = shard_.fp8.enabled;
  s.fp8_codes = kernels_fp8_transposed_backward<K>;
  s.expert_parallel = shard_.ep_size;
  return s;
}

template <class K>
int64_t Transformer<K>::deferred_weight_grad_bytes(int64_t B, int chunk) const {
  const int64_t per_layer = layer_activation_bytes(rows_config_, activation_shape(B, true)) -
                            layer_activation_bytes(rows_config_, activation_shape(B, false));
  return chunk_layers(chunk) * per_layer;
}

template <class K>
int64_t Transformer<K>::backward_scratch_bytes(int64_t B) const {
  return trident::backward_scratch_bytes(rows_config_, activation_shape(B, false));
}

template <class K>
int64_t Transformer<K>::recompute_workspace_bytes(int64_t B) const {
  return trident::recompute_workspace_bytes(rows_config_, activation_shape(B, false));
}

template <class K>
int64_t Transformer<K>::activation_bytes(int64_t B, bool split_backward, int chunk) const {
  const int64_t N = B * Tl_, Ns = stream_rows(B), C = C_;
  const int64_t t = sizeof(T), s = sizeof(S), stats = llama_ ? 1 : 2;
  const ActivationShape shape = activation_shape(B, split_backward);
  int64_t moe_layers = 0;
  const size_t block0 = chunk_block0_[static_cast<size_t>(chunk)];
  for (int64_t l = 0; l < chunk_layers(chunk); ++l)
    if (layout_.blocks[block0 + static_cast<size_t>(l)].moe()) ++moe_layers;
  int64_t total = chunk_layers(chunk) * layer_activation_bytes(rows_config_, shape) +
                  moe_layers * moe_layer_extra_bytes(rows_config_, shape) + t * Ns * C + 8 * N;
  if (shard_.masks_documents()) total += document_bytes(N, config_.position_reset, shard_.cp_size);
  if (runs_head(chunk)) total += t * N * C + s * (stats * Ns + 4 * N);
  return total;
}

template <class K>
int64_t Transformer<K>::head_scratch_bytes(int64_t B) const {
  if (!shard_.has_head) return 0;
  return lm_head_scratch_bytes(B * Tl_, head_.out_local, sizeof(T),
                               shard_.lm_head_chunk_rows, head_chunk_bytes_);
}

template <class K>
int64_t Transformer<K>::head_chunk_rows(int64_t N) const {
  return lm_head_chunk_rows(N, head_.out_local, sizeof(T), shard_.lm_head_chunk_rows,
                            head_chunk_bytes_);
}

template <class K>
void Transformer<K>::ensure_head_scratch(int64_t B) {
  const int64_t rows = head_chunk_rows(B * Tl_);
  const int64_t n = rows * head_.out_local;
  if (head_logits_.size() < n) head_logits_ = DeviceArray<T>(k_.device(), n);
  if (head_dloss_.size() < rows) head_dloss_ = DeviceArray<S>(k_.device(), rows);
}

template <class K>
typename K::T* Transformer<K>::head_chunk_logits(const Activations& a, int64_t r0, int64_t R) {
  if constexpr (kernels_round_logits_in_loss<K>)
    k_.head_logits_forward(head_logits_.data(), a.final_norm.data() + r0 * C_,
                           w(layout_.lm_head), R, C_, head_.out_local);
  else
    k_.linear_forward(head_logits_.data(), a.final_norm.data() + r0 * C_, w(layout_.lm_head),
                      nullptr, R, C_, head_.out_local);
  return head_logits_.data();
}

template <class K>
void Transformer<K>::norm_forward(T* out, S* mean, S* rstd, const T* inp, int wi, int bi,
                                  int64_t rows) {
  if (llama_)
    k_.rmsnorm_forward(out, rstd, inp, w(wi), rows, C_, config_.norm_eps);
  else
    k_.layernorm_forward(out, mean, rstd, inp, w(wi), w(bi), rows, C_);
}

template <class K>
void Transformer<K>::norm_backward(T* dinp, const T* dout, const T* inp, int wi, int bi,
                                   const S* mean, const S* rstd, int64_t rows) {
  if (llama_)
    k_.rmsnorm_backward(dinp, g(wi), dout, inp, w(wi), rstd, rows, C_);
  else
    k_.layernorm_backward(dinp, g(wi), g(bi), dout, inp, w(wi), mean, rstd, rows, C_);
}

template <class K>
void Transformer<K>::forward(Activations& a, const int32_t* tokens, const int32_t* targets,
                             const T* input, S loss_scale) {
  const int64_t B = a.B, T_ = Tl_, N = B * T_, Ns = stream_rows(B);
  ensure_scratch(B);  // the norms' outputs and the MLP activation are computed there
  ensure_recompute_workspace(B);
  begin_pass(a.chunk, false);
  read_documents(a, tokens);
  use_documents(a);
  T* x = a.layers.empty() ? a.output.data() : a.layers[0].input.data();
  if (runs_embedding(a)) {
    k_.upload_ids(a.tokens.data(), local_rows(tokens, B), N);
    embedding_.forward(tp_, k_, w(layout_.token_embedding), x, a.tokens.data(), N);
    if (layout_.position_embedding >= 0) position_embedding_forward(x, B);
  } else {
    k_.copy(x, input, Ns * C_);
  }
  const size_t block0 = chunk_block0_[static_cast<size_t>(a.chunk)];
  for (size_t i = 0; i < a.layers.size(); ++i) {
    T* out = i + 1 < a.layers.size() ? a.layers[i + 1].input.data() : a.output.data();
    // Full recomputation keeps the input only: the rest goes to the workspace and is dropped.
    LayerActs& la = recompute_ == Recompute::Full ? recompute_layer_ : a.layers[i];
    layer_forward(block0 + i, la, a.layers[i].input.data(), out, B);
  }
  if (!runs_head(a.chunk)) return;
  {
    const TakingGrads head_grads(taking_grads_, loss_scale != S(0));  // the head's, formed here
    head_forward(a, targets, loss_scale);
  }
  k_.accumulate_mean(loss_sum_.data(), a.losses.data(), N);
}

template <class K>
void Transformer<K>::add_norm_forward(T* out, S* mean, S* rstd, T* residual, const T* x, int wi,
                                      int bi, int64_t rows) {
  if constexpr (K::has_fused_residual_norm) {
    if (llama_)
      k_.add_rmsnorm_forward(out, rstd, residual, x, w(wi), rows, C_, config_.norm_eps);
    else
      k_.add_layernorm_forward(out, mean, rstd, residual, x, w(wi), w(bi), rows, C_);
  } else {
    k_.add_inplace(residual, x, rows * C_);
    norm_forward(out, mean, rstd, residual, wi, bi, rows);
  }
}

template <class K>
void Transformer<K>::norm_backward_into_stream(T* d_stream, const T* dout, const T* inp, int wi,
                                               int bi, const S* mean, const S* rstd,
                                               int64_t rows) {
  if constexpr (K::has_fused_residual_norm) {
    if (llama_)
      k_.rmsnorm_backward_add(d_stream, g(wi), dout, inp, w(wi), rstd, rows, C_);
    else
      k_.layernorm_backward_add(d_stream, g(wi), g(bi), dout, inp, w(wi), mean, rstd, rows, C_);
  } else {
    norm_backward(d_tmp_.data(), dout, inp, wi, bi, mean, rstd, rows);
    k_.add_inplace(d_stream, d_tmp_.data(), rows * C_);
  }
}

template <class K>
void Transformer<K>::layer_forward(size_t i, LayerActs& la, const T* input, T* output,
                                   int64_t B) {
  const BlockParams& p = layout_.blocks[i];
  const int64_t T_ = Tl_, N = B * T_, Ns = stream_rows(B), C = C_;
  const int64_t row0 = tp_.first_row(N);
  // Attention: residual1 = input + proj(attention(rope(qkv(norm1(input))))). The norms' outputs
  // and the MLP activation go to the rank's scratch (LayerActs: recomputed in backward).
  T* norm1 = norm_scratch();
  norm_forward(norm1 + row0 * C, la.norm1_mean.data(), la.norm1_rstd.data(), input, p.norm1_w,
               p.norm1_b, Ns);
  qkv_.forward(tp_, k_, dense(i, Fp8Gemm::Qkv), la.qkv.data(), norm1, N);
  if (llama_) rope_forward(la.qkv.data(), B);
  // Selective recomputation: attention's saved state lives in the workspace until the next
  // forward; the layer's backward recomputes it.
  Saved* saved = recompute_ == Recompute::Selective ? recompute_att_.data() : la.att.data();
  attention_forward(la.atty.data(), saved, la.qkv.data(), B);
  proj_.forward(tp_, k_, dense(i, Fp8Gemm::Proj), la.residual1.data(),
                la.atty.data(), N);
  // MLP: output = residual1 + down(act(up(norm2(residual1)))); the residual add and norm2 in
  // one pass.
  T* norm2 = norm_scratch();  // norm1 is no longer read
  add_norm_forward(norm2 + row0 * C, la.norm2_mean.data(), la.norm2_rstd.data(),
                   la.residual1.data(), input, p.norm2_w, p.norm2_b, Ns);
  if (p.moe()) {
    moe_forward(i, la, norm2, output, B);
  } else {
    T* act = act_scratch();
    up_and_act(tp_, i, la.up.data(), act, norm2, N);
    down_.forward(tp_, k_, dense(i, Fp8Gemm::Down), output, act, N);
  }
  k_.add_inplace(output, la.residual1.data(), Ns * C);
}

template <class K>
MoeParams<K> Transformer<K>::moe_params(size_t i) {
  const BlockParams& p = layout_.blocks[i];
  MoeParams<K> mp{w(p.router_w), g(p.router_w), linear(p.up_w, p.up_b),
                  linear(p.down_w, p.down_b)};
  const int64_t layer = block_layer(i);
  if (!fp8_ || !shard_.fp8.covers(layer, config_.layers)) return mp;
  mp.up.fp8 = mp.down.fp8 = fp8_.get();
  if (fp8_delayed_) {  // the states of this rank's experts, from its first
    const int64_t first = static_cast<int64_t>(shard_.ep_rank) * moe_.local_experts();
    mp.up.fp8_delayed = fp8_delayed_->experts(layer, Fp8Gemm::Up) + first;
    mp.down.fp8_delayed = fp8_delayed_->experts(layer, Fp8Gemm::Down) + first;
  }
  return mp;
}

template <class K>
void Transformer<K>::moe_forward(size_t i, LayerActs& la, T* norm2, T* output, int64_t B) {
  if constexpr (kernels_have_moe<K>) {
    const int64_t N = B * Tl_;
    tp_.gather_input(norm2, N, C_);  // the router and the experts read every row
    moe_.forward(tp_, k_, moe_params(i), la.moe, output, norm2, B, !recomputing_);
  }
}

template <class K>
const typename K::T* Transformer<K>::moe_backward(size_t i, LayerActs& la, const T* norm2,
                                                  const T* d, int64_t B) {
  if constexpr (kernels_have_moe<K>)
    return moe_.backward(tp_, k_, moe_params(i), la.moe, d, norm2, B, loss_scale_);
  return nullptr;
}

template <class K>
bool Transformer<K>::fuses_gelu(const LinearParams<K>& p) const {
  return kernels_fuse_linear_gelu<K> && shard_.fused_bias_gelu && !llama_ && p.fp8 == nullptr;
}

template <class K>
void Transformer<K>::up_and_act(TensorParallel<K>& tp, size_t i, T* up, T* act, T* norm2,
                                int64_t N) {
  const LinearParams<K> p = dense(i, Fp8Gemm::Up);
  if constexpr (kernels_fuse_linear_gelu<K>)
    if (fuses_gelu(p)) return up_.forward_gelu(tp, k_, p, up, act, norm2, N);
  up_.forward(tp, k_, p, up, norm2, N);
  act_forward(act, up, N);
}

template <class K>
void Transformer<K>::act_forward(T* act, const T* up, int64_t N) {
  if (llama_)
    k_.swiglu_forward(act, up, N, Fl_);
  else
    k_.gelu_forward(act, up, N * Fl_);
}

template <class K>
typename K::T* Transformer<K>::recomputed_norm(T* out, S* mean, S* rstd, const T* inp, int wi,
                                                int bi, int64_t B, NormRows rows) {
  const int64_t N = B * Tl_;
  norm_forward(out + tp_.first_row(N) * C_, mean, rstd, inp, wi, bi, stream_rows(B));
  if (rows == NormRows::Gathered) tp_.gather_input(out, N, C_);  // as in forward
  return out;
}

template <class K>
typename K::T* Transformer<K>::recomputed_norm1(LayerActs& la, T* out, size_t i, int64_t B,
                                                 NormRows rows) {
  const BlockParams& p = layout_.blocks[i];
  return recomputed_norm(out, la.norm1_mean.data(), la.norm1_rstd.data(), la.input.data(),
                         p.norm1_w, p.norm1_b, B, rows);
}

template <class K>
typename K::T* Transformer<K>::recomputed_norm2(LayerActs& la, T* out, size_t i, int64_t B,
                                                 NormRows rows) {
  const BlockParams& p = layout_.blocks[i];
  return recomputed_norm(out, la.norm2_mean.data(), la.norm2_rstd.data(), la.residual1.data(),
                         p.norm2_w, p.norm2_b, B, rows);
}

template <class K>
typename K::T* Transformer<K>::recomputed_act(const LayerActs& la, T* out, int64_t B) {
  act_forward(out, la.up.data(), B * Tl_);
  return out;
}

template <class K>
void Transformer<K>::head_forward(Activations& a, const int32_t* targets, S loss_scale) {
  // Final norm, LM head (vocab-parallel), cross-entropy without gathering the logits.
  const int64_t N = a.B * Tl_, Ns = stream_rows(a.B);
  k_.upload_ids(a.targets.data(), local_rows(targets, a.B), N);
  norm_forward(a.final_norm.data() + tp_.first_row(N) * C_, a.final_mean.data(),
               a.final_rstd.data(), a.output.data(), layout_.final_norm_w, layout_.final_norm_b,
               Ns);
  // The head and the loss one chunk of rows at a time: the chunk's logits are complete (their
  // max and sums reduced over the tensor group) before the next chunk overwrites them, so the
  // logits [N, Vl] never exist whole. A training forward (loss_scale > 0, the scale backward
  // will be called with) also forms the head's gradients while the chunk's logits are there,
  // so that they are computed once: dL/dlogits in place (dloss = loss_scale / N per row, as
  // the mean over N tokens gives), the chunk's rows of dL/d(final norm) and its contribution
  // to the head's weight gradient. The weight gradient is thus formed here also for a split
  // backward, in micro-batch order (forwards run in micro-batch order); a tied head's comes
  // before the same micro-batch's embedding backward, as it did in backward. The input
  // gradient's partial sums are reduced over the tensor group once, after the last chunk's,
  // while that chunk's weight gradient is computed (TensorParallel::reduce_input_grad_during);
  // the result takes the final norm's place in `a` (nothing reads the norm's output again).
  tp_.gather_input(a.final_norm.data(), N, C_);
  ensure_head_scratch(a.B);
  a.head_grad_scale = loss_scale;
  const bool training = loss_scale != S(0);
  const int64_t rows = head_chunk_rows(N);
  S* dloss = head_dloss_.data();
  if (training) k_.fill(dloss, rows, loss_scale / static_cast<S>(N));
  const T* d_final = nullptr;
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t R = std::min(rows, N - r0);
    T* logits = head_chunk_logits(a, r0, R);
    S* const losses = a.losses.data() + r0;
    S* const row_max = a.row_max.data() + r0;
    S* const sums = a.sums.data() + 2 * r0;
    if (!training) {
      loss_.forward(tp_, k_, losses, row_max, sums, logits, a.targets.data() + r0, R);
      continue;
    }
    loss_.forward_backward(tp_, k_, losses, row_max, sums, logits, a.targets.data() + r0, dloss,
                           R);
    const T* x = a.final_norm.data() + r0 * C_;
    k_.linear_backward(d_norm_.data() + r0 * C_, nullptr, nullptr, logits, x,
                       w(layout_.lm_head), R, C_, head_.out_local);
    auto weight_grad = [&] {
      k_.linear_backward(nullptr, g(layout_.lm_head), nullptr, logits, x, w(layout_.lm_head), R,
                         C_, head_.out_local);
    };
    if (r0 + R < N)
      weight_grad();
    else
      d_final = tp_.reduce_input_grad_during(d_norm_.data(), N, C_, weight_grad);
  }
  if (training) k_.copy(a.final_norm.data(), d_final, Ns * C_);
}

template <class K>
void Transformer<K>::logits(const Activations& a, T* out) {
  if (!runs_head(a.chunk)) throw Error("Transformer::logits: the LM head is not on this chunk");
  if (a.head_grad_scale != S(0))
    throw Error("Transformer::logits: after a training forward (loss_scale > 0) the final norm's "
                "output has made way for its gradient; run the forward with loss_scale 0");
  k_.linear_forward(out, a.final_norm.data(), w(layout_.lm_head), nullptr,
                    a.B * Tl_, C_, head_.out_local);
}

template <class K>
void Transformer<K>::ensure_scratch(int64_t B) {
  const int64_t N = B * Tl_;
  if (N <= scratch_rows_) return;
  scratch_rows_ = N;
  Device& dev = k_.device();
  d_stream_ = DeviceArray<T>(dev, N * C_);
  d_norm_ = DeviceArray<T>(dev, N * C_);
  d_tmp_ = DeviceArray<T>(dev, N * C_);
  d_qkv_ = DeviceArray<T>(dev, N * QKVl_);
  d_atty_ = DeviceArray<T>(dev, N * Hl_);
  d_up_ = DeviceArray<T>(dev, N * Ul_);
  d_act_ = DeviceArray<T>(dev, N * Fl_);
}

template <class K>
void Transformer<K>::ensure_recompute_workspace(int64_t B) {
  const int64_t N = B * Tl_;
  if (recompute_ == Recompute::None || N <= workspace_rows_) return;
  workspace_rows_ = N;
  Device& dev = k_.device();
  if (recompute_ == Recompute::Selective) {
    recompute_att_ = DeviceArray<Saved>(dev, K::attention_saved_size(B, Tl_, NHl_));
    recompute_atty_ = DeviceArray<T>(dev, N * Hl_);
  } else {
    recompute_layer_ = make_layer_acts(B, Recompute::None, false, config_.moe_experts > 0);
    recompute_output_ = DeviceArray<T>(dev, stream_rows(B) * C_);
  }
}

template <class K>
typename Transformer<K>::LayerActs& Transformer<K>::backward_stash(size_t i, LayerActs& kept,
                                                                   int64_t B) {
  if (recompute_ != Recompute::Full) return kept;
  // The layer's forward again, from its kept input and with its tensor-parallel collectives
  // (every rank of the group reruns the same layer at the same point, as Megatron-LM does):
  // the same kernels on the same inputs, so the same bits as the first time.
  LayerActs& la = recompute_layer_;
  k_.copy(la.input.data(), kept.input.data(), stream_rows(B) * C_);
  recomputing_ = true;
  layer_forward(i, la, la.input.data(), recompute_output_.data(), B);
  recomputing_ = false;
  return la;
}

template <class K>
void Transformer<K>::backward(Activations& a, S loss_scale, const T* d_output, T* d_input) {
  backward_pass(a, loss_scale, d_output, d_input, false);
}

template <class K>
void Transformer<K>::backward_input(Activations& a, S loss_scale, const T* d_output,
                                    T* d_input) {
  if (!a.split_backward)
    throw Error("Transformer::backward_input: activations not made for a split backward");
  // The watermarks are reported by backward_weight: a linear layer's gradient is not final here.
  auto hook = std::move(grads_final_);
  grads_final_ = nullptr;
  backward_pass(a, loss_scale, d_output, d_input, true);
  grads_final_ = std::move(hook);
}

template <class K>
void Transformer<K>::backward_pass(Activations& a, S loss_scale, const T* d_output, T* d_input,
                                   bool defer_weights) {
  const int64_t B = a.B, T_ = Tl_, N = B * T_, Ns = stream_rows(B);
  ensure_scratch(B);
  ensure_recompute_workspace(B);
  begin_pass(a.chunk, true);
  use_documents(a);
  const TakingGrads grads(taking_grads_, true);
  loss_scale_ = loss_scale;
  T* d = d_stream_.data();  // gradient of the rank's residual-stream rows, from the top down
  if (runs_head(a.chunk))
    head_backward(a, loss_scale, d);
  else
    k_.copy(d, d_output, Ns * C_);
  const size_t block0 = chunk_block0_[static_cast<size_t>(a.chunk)];
  for (size_t i = a.layers.size(); i-- > 0;) {
    LayerActs& kept = a.layers[i];
    LayerActs& la = backward_stash(block0 + i, kept, B);
    layer_backward(block0 + i, la, kept, d, B, defer_weights);
    if (defer_weights && &la != &kept) {
      // backward_weight reads the linear layers' inputs from the micro-batch's own stash (the
      // norms' outputs and the activation were recomputed straight into it by layer_backward).
      k_.copy(kept.atty.data(), la.atty.data(), B * T_ * Hl_);
    }
    report_final(layout_.blocks[block0 + i].norm1_w);
    if (!defer_weights) reduce_layer_of(layout_.blocks[block0 + i].norm1_w);
  }
  if (runs_embedding(a)) {
    const T* d_all = tp_.gather_output_grad(d, N, C_);
    if (layout_.position_embedding >= 0) position_embedding_backward(d_all, B);
    embedding_.backward(k_, g(layout_.token_embedding), d_all, a.tokens.data(), N);
    reduce_embeddings();
  } else {
    k_.copy(d_input, d, Ns * C_);
  }
}

template <class K>
void Transformer<K>::head_backward(Activations& a, S loss_scale, T* d) {
  // The head's gradients were formed by the training forward (head_forward), for this scale.
  if (a.head_grad_scale != loss_scale)
    throw Error("Transformer::backward: the micro-batch's forward formed the LM head's gradient "
                "for loss_scale " + std::to_string(static_cast<double>(a.head_grad_scale)) +
                " (0: an evaluation forward), not " +
                std::to_string(static_cast<double>(loss_scale)));
  if (!lm_head_is_tied()) report_final(layout_.lm_head);
  norm_backward(d, a.final_norm.data(), a.output.data(), layout_.final_norm_w,
                layout_.final_norm_b, a.final_mean.data(), a.final_rstd.data(),
                stream_rows(a.B));
  report_final(layout_.final_norm_w);
  reduce_head();
}

template <class K>
void Transformer<K>::layer_backward(size_t i, LayerActs& la, LayerActs& kept, T* d, int64_t B,
                                    bool defer_weights) {
  // On entry d = dL/d(layer output); on exit d = dL/d(layer input) (the rank's rows). Deferring
  // the weights, the column-parallel layers' output gradients are written straight into `kept`
  // and the row-parallel ones copied there.
  const BlockParams& p = layout_.blocks[i];
  const int64_t N = B * Tl_, Ns = stream_rows(B);
  T* d_up = defer_weights ? kept.d_up.data() : d_up_.data();
  T* d_qkv = defer_weights ? kept.d_qkv.data() : d_qkv_.data();
  // MLP branch (a MoE layer's weight gradients are never deferred).
  // The norms' outputs and the MLP activation are recomputed where a weight gradient reads
  // them: here, or in backward_weight when deferred (then into `kept` when it keeps copies for
  // it, under full recomputation; the input gradients do not read them).
  const bool keeps_copies = defer_weights && kept.act.size() > 0;
  const T* d_norm2 = nullptr;
  if (p.moe()) {
    d_norm2 = moe_backward(i, la, recomputed_norm2(la, norm_scratch(), i, B), d, B);
  } else {
    const LinearParams<K> down = dense(i, Fp8Gemm::Down);
    if (defer_weights && keeps_copies) recomputed_act(la, kept.act.data(), B);
    if (fuses_gelu(down)) {
      // The GELU's gradient in the input-gradient GEMM: d_up directly, no d_act. The recomputed
      // act goes to d_act_'s buffer, not act_scratch() (d_up's own here).
      if constexpr (kernels_fuse_linear_gelu<K>) {
        if (defer_weights)
          down_.input_backward_dgelu(tp_, k_, down, d_up, d, kept.d_down.data(), la.up.data(), N);
        else
          down_.backward_dgelu(tp_, k_, down, d_up, d, recomputed_act(la, d_act_.data(), B),
                               la.up.data(), N);
      }
    } else {
      if (defer_weights)
        down_.input_backward(tp_, k_, down, d_act_.data(), d, nullptr, kept.d_down.data(), N);
      else
        down_.backward(tp_, k_, down, d_act_.data(), d, recomputed_act(la, act_scratch(), B),
                       N);
      if (llama_)
        k_.swiglu_backward(d_up, d_act_.data(), la.up.data(), N, Fl_);
      else
        k_.gelu_backward(d_up, la.up.data(), d_act_.data(), N * Fl_);
    }
    if (defer_weights) {
      if (keeps_copies) recomputed_norm2(la, kept.norm2.data(), i, B);
      d_norm2 = up_.input_backward(tp_, k_, dense(i, Fp8Gemm::Up), d_norm_.data(), d_up,
                                   nullptr, N);
    } else {
      d_norm2 = up_.backward(tp_, k_, dense(i, Fp8Gemm::Up), d_norm_.data(), d_up,
                             recomputed_norm2(la, norm_scratch(), i, B, NormRows::Own), N);
    }
  }
  norm_backward_into_stream(d, d_norm2, la.residual1.data(), p.norm2_w, p.norm2_b,
                            la.norm2_mean.data(), la.norm2_rstd.data(), Ns);  // dL/d(residual1)
  // Attention branch.
  if (defer_weights)
    proj_.input_backward(tp_, k_, dense(i, Fp8Gemm::Proj), d_atty_.data(), d,
                         la.atty.data(), kept.d_proj.data(), N);
  else
    proj_.backward(tp_, k_, dense(i, Fp8Gemm::Proj), d_atty_.data(), d,
                   la.atty.data(), N);
  attention_backward(la, d_qkv, B);
  if (llama_) rope_backward(d_qkv, B);
  if (keeps_copies) recomputed_norm1(la, kept.norm1.data(), i, B);
  const T* d_norm1 =
      defer_weights
          ? qkv_.input_backward(tp_, k_, dense(i, Fp8Gemm::Qkv), d_norm_.data(), d_qkv,
                                nullptr, N)
          : qkv_.backward(tp_, k_, dense(i, Fp8Gemm::Qkv), d_norm_.data(), d_qkv,
                          recomputed_norm1(la, norm_scratch(), i, B, NormRows::Own), N);
  norm_backward_into_stream(d, d_norm1, la.input.data(), p.norm1_w, p.norm1_b,
                            la.norm1_mean.data(), la.norm1_rstd.data(), Ns);  // dL/d(input)
}

template <class K>
void Transformer<K>::attention_backward(LayerActs& la, T* d_qkv, int64_t B) {
  const T* out = la.atty.data();
  const Saved* saved = la.att.data();
  if (recompute_ == Recompute::Selective) {
    // Scores, softmax and weighted sum again from the kept (rotated) q, k, v: the forward's
    // kernel on the forward's inputs, so the forward's saved state to the bit. The output is
    // recomputed beside the kept one, which backward_weight may still read.
    attention_forward(recompute_atty_.data(), recompute_att_.data(), la.qkv.data(), B);
    out = recompute_atty_.data();
    saved = recompute_att_.data();
  }
  if (ring_.active())
    ring_.backward(k_, d_qkv, d_atty_.data(), la.qkv.data(), out, saved, B,
                   {doc_start_, doc_start_position_});
  else
    k_.attention_backward(d_qkv, d_atty_.data(), la.qkv.data(), out, saved, B, Tl_, NHl_,
                          KVHl_, HS_, doc_start_);
}

template <class K>
void Transformer<K>::attention_forward(T* out, Saved* saved, const T* qkv, int64_t B) {
  if (ring_.active())
    ring_.forward(k_, out, saved, qkv, B, {doc_start_, doc_start_position_});
  else
    k_.attention_forward(out, saved, qkv, B, Tl_, NHl_, KVHl_, HS_, doc_start_);
}

template <class K>
void Transformer<K>::position_embedding_forward(T* x, int64_t B) {
  const int64_t N = B * Tl_, first = tp_.first_row(N), Ns = stream_rows(B);
  const T* wpe = w(layout_.position_embedding);
  if (doc_positions_)
    return k_.position_embedding_forward_at(x, wpe, doc_positions_ + first, Ns, C_);
  if (!ring_.active()) return k_.position_embedding_forward(x, wpe, first, Ns, Tl_, C_);
  k_.position_embedding_forward_at(x, wpe, positions(B) + first, Ns, C_);
}

template <class K>
void Transformer<K>::position_embedding_backward(const T* d_all, int64_t B) {
  G* dwpe = g(layout_.position_embedding);
  if (doc_positions_)
    return k_.position_embedding_backward_at(dwpe, d_all, doc_positions_, B * Tl_, C_);
  if (!ring_.active()) return k_.position_embedding_backward(dwpe, d_all, B, Tl_, C_);
  k_.position_embedding_backward_at(dwpe, d_all, positions(B), B * Tl_, C_);
}

template <class K>
void Transformer<K>::rope_forward(T* qkv, int64_t B) {
  if (doc_positions_)
    return k_.rope_forward_at(qkv, doc_positions_, B * Tl_, NHl_, KVHl_, HS_, config_.rope_theta);
  if (!ring_.active())
    return k_.rope_forward(qkv, B, Tl_, NHl_, KVHl_, HS_, config_.rope_theta);
  k_.rope_forward_at(qkv, positions(B), B * Tl_, NHl_, KVHl_, HS_, config_.rope_theta);
}

template <class K>
void Transformer<K>::rope_backward(T* d_qkv, int64_t B) {
  if (doc_positions_)
    return k_.rope_backward_at(d_qkv, doc_positions_, B * Tl_, NHl_, KVHl_, HS_,
                               config_.rope_theta);
  if (!ring_.active())
    return k_.rope_backward(d_qkv, B, Tl_, NHl_, KVHl_, HS_, config_.rope_theta);
  k_.rope_backward_at(d_qkv, positions(B), B * Tl_, NHl_, KVHl_, HS_, config_.rope_theta);
}

template <class K>
void Transformer<K>::backward_weight(Activations& a) {
  if (!a.split_backward)
    throw Error("Transformer::backward_weight: activations not made for a split backward");
  // The head, then the layers from the top: backward()'s order, so the watermarks reported
  // (each one after the last gradient above it became final) are the same, in the same order.
  if (runs_head(a.chunk)) {
    // The head's weight gradient was formed in the training forward (head_forward).
    if (!lm_head_is_tied()) report_final(layout_.lm_head);
    report_final(layout_.final_norm_w);  // final since backward_input
  }
  // ZeRO-3: the recomputed norms read their weights, gathered as this pass asks for them.
  const TakingGrads grads(taking_grads_, true);
  const size_t block0 = chunk_block0_[static_cast<size_t>(a.chunk)];
  for (size_t i = a.layers.size(); i-- > 0;) {
    layer_weight_backward(block0 + i, a.layers[i], a.B);
    report_final(layout_.blocks[block0 + i].norm1_w);
    reduce_layer_of(layout_.blocks[block0 + i].norm1_w);
  }
}

template <class K>
void Transformer<K>::layer_weight_backward(size_t i, LayerActs& la, int64_t B) {
  // dW, db += dy^T x of the four linear layers from the output gradients layer_backward kept.
  // The norms' outputs and the MLP activation: the copies layer_backward recomputed into the
  // stash (full recomputation), else recomputed now from the stash into the scratch.
  const BlockParams& p = layout_.blocks[i];
  const int64_t N = B * Tl_;
  ensure_scratch(B);
  const bool kept = la.act.size() > 0;
  if (!p.moe()) {  // a MoE layer's were accumulated by backward_input
    const T* act = kept ? la.act.data() : recomputed_act(la, act_scratch(), B);
    down_.weight_backward(k_, dense(i, Fp8Gemm::Down), la.d_down.data(), act, N);
    const T* norm2 = kept ? la.norm2.data() : recomputed_norm2(la, norm_scratch(), i, B);
    up_.weight_backward(k_, dense(i, Fp8Gemm::Up), la.d_up.data(), norm2, N);
  }
  proj_.weight_backward(k_, dense(i, Fp8Gemm::Proj), la.d_proj.data(), la.atty.data(), N);
  const T* norm1 = kept ? la.norm1.data() : recomputed_norm1(la, norm_scratch(), i, B);
  qkv_.weight_backward(k_, dense(i, Fp8Gemm::Qkv), la.d_qkv.data(), norm1, N);
}

}  // namespace trident

// ---------------------------------------------------------------- decoding (generation)
namespace trident {

template <class K>
typename Transformer<K>::KvCache Transformer<K>::make_kv_cache(int64_t B) {
  if (ring_.active())
    throw Error("decoding needs each sequence whole on the rank: parallel.context must be 1");
  if (!shard_.has_embedding || !shard_.has_head || chunk_count() != 1)
    throw Error("generation needs the whole model on each rank (parallel.pipeline = 1)");
  Device& dev = k_.device();
  const int64_t Vl = head_.out_local, tp = shard_.tp_size;
  KvCache c;
  c.B = B;
  for (size_t l = 0; l < layout_.blocks.size(); ++l) {
    c.k.emplace_back(dev, B * KVHl_ * config_.seq_len * HS_);
    c.v.emplace_back(dev, B * KVHl_ * config_.seq_len * HS_);
  }
  ModelShard plain = shard_;
  plain.sequence_parallel = false;
  c.tp = std::make_unique<TensorParallel<K>>(tp_.comm(), plain, k_);
  c.tokens = DeviceArray<int32_t>(dev, B);
  c.positions = DeviceArray<int32_t>(dev, B);
  c.x = DeviceArray<T>(dev, B * C_);
  c.norm = DeviceArray<T>(dev, B * C_);
  c.qkv = DeviceArray<T>(dev, B * QKVl_);
  c.atty = DeviceArray<T>(dev, B * Hl_);
  c.residual = DeviceArray<T>(dev, B * C_);
  c.up = DeviceArray<T>(dev, B * Ul_);
  c.act = DeviceArray<T>(dev, B * Fl_);
  c.logits = DeviceArray<T>(dev, B * Vl);
  c.gathered = DeviceArray<T>(dev, tp * B * Vl);
  c.mean = DeviceArray<S>(dev, B);
  c.rstd = DeviceArray<S>(dev, B);
  c.host.resize(static_cast<size_t>(tp * B * Vl));
  return c;
}

template <class K>
void Transformer<K>::forward_decode(KvCache& c, const int32_t* tokens, const int32_t* positions,
                                    float* logits) {
  const int64_t B = c.B, Vl = head_.out_local, V = config_.vocab_size;
  for (int64_t b = 0; b < B; ++b)
    if (positions[b] < 0 || positions[b] >= config_.seq_len)
      throw Error("decode: position " + std::to_string(positions[b]) + " is outside the " +
                  "context of model.seq_len = " + std::to_string(config_.seq_len));
  TensorParallel<K>& tp = *c.tp;
  begin_pass(0, false);
  k_.upload_ids(c.tokens.data(), tokens, B);
  k_.upload_ids(c.positions.data(), positions, B);
  embedding_.forward(tp, k_, w(layout_.token_embedding), c.x.data(), c.tokens.data(), B);
  if (layout_.position_embedding >= 0)
    for (int64_t b = 0; b < B; ++b)  // row b: wpe[positions[b]]
      k_.position_embedding_forward(c.x.data() + b * C_, w(layout_.position_embedding),
                                    positions[b], 1, config_.seq_len, C_);
  for (size_t i = 0; i < layout_.blocks.size(); ++i) layer_decode(i, c);
  norm_forward(c.norm.data(), c.mean.data(), c.rstd.data(), c.x.data(), layout_.final_norm_w,
               layout_.final_norm_b, B);
  head_.forward(tp, k_, linear(layout_.lm_head, -1), c.logits.data(), c.norm.data(), B);
  // Rank r holds vocabulary block [r Vl, (r+1) Vl) of every row: gathered as [tp, B, Vl].
  tp.comm().all_gather(c.logits.data(), c.gathered.data(), B * Vl, K::act_dtype);
  k_.to_host_float(c.host.data(), c.gathered.data(), tp.size() * B * Vl);
  for (int64_t r = 0; r < tp.size(); ++r)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < Vl && r * Vl + j < V; ++j)  // padding ids dropped
        logits[b * V + r * Vl + j] = c.host[(r * B + b) * Vl + j];
}

// layer_forward for one token per row, its attention over the cache.
template <class K>
void Transformer<K>::layer_decode(size_t i, KvCache& c) {
  const BlockParams& p = layout_.blocks[i];
  TensorParallel<K>& tp = *c.tp;
  const int64_t B = c.B;
  T* x = c.x.data();
  norm_forward(c.norm.data(), c.mean.data(), c.rstd.data(), x, p.norm1_w, p.norm1_b, B);
  qkv_.forward(tp, k_, dense(i, Fp8Gemm::Qkv), c.qkv.data(), c.norm.data(), B);
  if (llama_)
    k_.rope_forward_at(c.qkv.data(), c.positions.data(), B, NHl_, KVHl_, HS_, config_.rope_theta);
  k_.kv_cache_attention(c.atty.data(), c.k[i].data(), c.v[i].data(), c.qkv.data(),
                        c.positions.data(), B, config_.seq_len, NHl_, KVHl_, HS_);
  proj_.forward(tp, k_, dense(i, Fp8Gemm::Proj), c.residual.data(), c.atty.data(), B);
  add_norm_forward(c.norm.data(), c.mean.data(), c.rstd.data(), c.residual.data(), x,
                   p.norm2_w, p.norm2_b, B);
  up_and_act(tp, i, c.up.data(), c.act.data(), c.norm.data(), B);
  down_.forward(tp, k_, dense(i, Fp8Gemm::Down), x, c.act.data(), B);  // x is free again
  k_.add_inplace(x, c.residual.data(), B * C_);
}

}  // namespace trident
