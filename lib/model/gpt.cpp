#include "model/gpt.hpp"

#include <cmath>
#include <cstring>

#include "grid/grid.hpp"
#include "kernels/cpu/ops.hpp"
#include "util/error.hpp"
#include "util/rng.hpp"

namespace trident {

namespace {

template <typename F>
constexpr DType dtype_of() {
  return sizeof(F) == 4 ? DType::F32 : DType::F64;
}

template <typename F>
void all_reduce_sum(Communicator& comm, F* x, int64_t n) {
  comm.all_reduce(x, n, dtype_of<F>(), ReduceOp::Sum);
}

template <typename F>
void copy(F* dst, const F* src, int64_t n) {
  std::memcpy(dst, src, sizeof(F) * n);
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

int64_t padded_vocab_size(const ModelConfig& m, int tp_size) {
  return padded_vocab(m.vocab_size, m.vocab_multiple, tp_size);
}

template <typename F>
std::vector<ParamInfo> Gpt<F>::global_parameters(const ModelConfig& config) {
  auto self = make_self_communicator("tensor");
  return Gpt<F>(config, ModelShard::whole(config), *self, false).params_;
}

template <typename F>
std::vector<ParamInfo> Gpt<F>::shard_parameters(const ModelConfig& config,
                                                const ModelShard& shard) {
  auto self = make_self_communicator("tensor");
  return Gpt<F>(config, shard, *self, false).params_;
}

template <typename F>
Gpt<F>::Gpt(const ModelConfig& config, const ModelShard& shard, Communicator& tensor_comm,
            bool allocate)
    : config_(config), shard_(shard), tp_(tensor_comm) {
  const int tp = shard.tp_size, r = shard.tp_rank;
  if (config.heads % tp != 0 || config.width % tp != 0)
    throw Error("model.heads (" + std::to_string(config.heads) + ") and model.width (" +
                std::to_string(config.width) + ") must be divisible by parallel.tensor (" +
                std::to_string(tp) + ")");
  C_ = config.width;
  Cl_ = C_ / tp;
  Fl_ = config.ffn_width() / tp;
  NHl_ = config.heads / tp;
  HS_ = config.head_size();
  const int64_t padded = padded_vocab_size(config, tp);
  local_vocab_ = padded / tp;
  vocab_begin_ = r * local_vocab_;
  const bool tp_lead = r == 0;  // counts replicated tensors in the gradient norm
  sp_ = shard.sequence_parallel && tp > 1;

  // The tied token embedding lives on the first stage (lookup) and the last (LM head); the
  // first stage's copy is the one counted in the gradient norm.
  if (shard.has_embedding || shard.has_head) {
    wte_ = add_param("embedding.token.weight", {config.vocab_size, C_}, 0,
                     vocab_blocks(config.vocab_size, padded, r, tp), Init::Normal, true);
    params_[wte_].local_shape = {local_vocab_, C_};
    params_[wte_].counted_in_norm = shard.has_embedding;
  }
  if (shard.has_embedding) {
    wpe_ = add_param("embedding.position.weight", {config.seq_len, C_}, -1, {}, Init::Normal,
                     false);
    params_[wpe_].counted_in_norm = tp_lead;
  }
  for (int64_t l = shard.layer_begin; l < shard.layer_end; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerParams lp;
    auto replicated = [&](const std::string& name, int64_t n, Init init) {
      int i = add_param(p + name, {n}, -1, {}, init, false);
      params_[i].counted_in_norm = tp_lead;
      return i;
    };
    lp.ln1_w = replicated("ln1.weight", C_, Init::Ones);
    lp.ln1_b = replicated("ln1.bias", C_, Init::Zeros);
    lp.qkv_w = add_param(p + "attn.qkv.weight", {3 * C_, C_}, 0, qkv_blocks(C_, r, tp),
                         Init::Normal, true);
    lp.qkv_b = add_param(p + "attn.qkv.bias", {3 * C_}, 0, qkv_blocks(C_, r, tp), Init::Zeros,
                         false);
    lp.proj_w = add_param(p + "attn.proj.weight", {C_, C_}, 1, contiguous_blocks(C_, r, tp),
                          Init::NormalResidual, true);
    lp.proj_b = replicated("attn.proj.bias", C_, Init::Zeros);
    lp.ln2_w = replicated("ln2.weight", C_, Init::Ones);
    lp.ln2_b = replicated("ln2.bias", C_, Init::Zeros);
    const int64_t ffn = config.ffn_width();
    lp.fc1_w = add_param(p + "mlp.fc1.weight", {ffn, C_}, 0, contiguous_blocks(ffn, r, tp),
                         Init::Normal, true);
    lp.fc1_b = add_param(p + "mlp.fc1.bias", {ffn}, 0, contiguous_blocks(ffn, r, tp), Init::Zeros,
                         false);
    lp.fc2_w = add_param(p + "mlp.fc2.weight", {C_, ffn}, 1, contiguous_blocks(ffn, r, tp),
                         Init::NormalResidual, true);
    lp.fc2_b = replicated("mlp.fc2.bias", C_, Init::Zeros);
    for (int i : {lp.ln1_w, lp.ln1_b, lp.ln2_w, lp.ln2_b}) params_[i].tensor_partial_grad = sp_;
    layer_params_.push_back(lp);
  }
  if (shard.has_head) {
    lnf_w_ = add_param("final_ln.weight", {C_}, -1, {}, Init::Ones, false);
    lnf_b_ = add_param("final_ln.bias", {C_}, -1, {}, Init::Zeros, false);
    params_[lnf_w_].counted_in_norm = params_[lnf_b_].counted_in_norm = tp_lead;
    params_[lnf_w_].tensor_partial_grad = params_[lnf_b_].tensor_partial_grad = sp_;
  }
  int64_t total = 0;
  for (ParamInfo& p : params_) {
    p.offset = total;
    total += round_up(p.numel(), 16);  // every tensor starts on a 64-byte boundary
  }
  if (!allocate) return;
  weights_.assign(total, F(0));
  grads_.assign(total, F(0));
}

template <typename F>
int Gpt<F>::add_param(const std::string& name, std::vector<int64_t> global_shape, int split_dim,
                      std::vector<ShardBlock> blocks, Init init, bool decay) {
  ParamInfo p;
  p.name = name;
  p.local_shape = global_shape;
  if (split_dim >= 0) {
    int64_t local = 0;
    for (const ShardBlock& b : blocks) local += b.length;
    p.local_shape[split_dim] = local;
  }
  p.global_shape = std::move(global_shape);
  p.split_dim = split_dim;
  p.blocks = std::move(blocks);
  p.init = init;
  p.weight_decay = decay;
  params_.push_back(std::move(p));
  return static_cast<int>(params_.size()) - 1;
}

template <typename F>
const ParamInfo& Gpt<F>::param(const std::string& name) const {
  for (const ParamInfo& p : params_)
    if (p.name == name) return p;
  throw Error("no parameter named '" + name + "' on this rank");
}

template <typename F>
void init_parameter(const ParamInfo& p, uint64_t seed, int64_t layers, F* out) {
  const double std_normal = 0.02;
  const double std_residual = 0.02 / std::sqrt(2.0 * static_cast<double>(layers));
  const uint64_t key = stream_key(seed, p.name);
  const int64_t n = p.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const auto gi = p.global_index(i);
    double v = 0.0;
    if (gi) {
      switch (p.init) {
        case Init::Normal: v = std_normal * normal01(key, *gi); break;
        case Init::NormalResidual: v = std_residual * normal01(key, *gi); break;
        case Init::Zeros: v = 0.0; break;
        case Init::Ones: v = 1.0; break;
      }
    }
    out[i] = static_cast<F>(v);
  }
}
template void init_parameter<float>(const ParamInfo&, uint64_t, int64_t, float*);
template void init_parameter<double>(const ParamInfo&, uint64_t, int64_t, double*);

template <typename F>
void Gpt<F>::init_weights(uint64_t seed) {
  for (const ParamInfo& p : params_)
    init_parameter(p, seed, config_.layers, weights_.data() + p.offset);
}

template <typename F>
void Gpt<F>::zero_grads() {
  std::memset(grads_.data(), 0, sizeof(F) * grads_.size());
}

template <typename F>
int64_t Gpt<F>::stream_rows(int64_t B) const {
  const int64_t N = B * config_.seq_len;
  return sp_ ? N / shard_.tp_size : N;
}

template <typename F>
typename Gpt<F>::Activations Gpt<F>::make_activations(int64_t B) const {
  const int64_t T_ = config_.seq_len, N = B * T_, Ns = stream_rows(B);
  if (sp_ && N % shard_.tp_size != 0)
    throw Error("sequence parallelism: train.micro_batch * model.seq_len (" + std::to_string(N) +
                ") must be divisible by parallel.tensor (" + std::to_string(shard_.tp_size) +
                ")");
  Activations a;
  a.B = B;
  a.T = T_;
  a.tokens.resize(N);
  a.targets.resize(N);
  a.layers.resize(shard_.layer_end - shard_.layer_begin);
  for (LayerActs& la : a.layers) {
    la.input.resize(Ns * C_);
    la.ln1.resize(N * C_);
    la.ln1_mean.resize(Ns);
    la.ln1_rstd.resize(Ns);
    la.qkv.resize(N * 3 * Cl_);
    la.att.resize(B * NHl_ * T_ * T_);
    la.atty.resize(N * Cl_);
    la.residual1.resize(Ns * C_);
    la.ln2.resize(N * C_);
    la.ln2_mean.resize(Ns);
    la.ln2_rstd.resize(Ns);
    la.fc1.resize(N * Fl_);
    la.gelu.resize(N * Fl_);
  }
  a.output.resize(Ns * C_);
  if (shard_.has_head) {
    a.lnf.resize(N * C_);
    a.lnf_mean.resize(Ns);
    a.lnf_rstd.resize(Ns);
    a.logits.resize(N * local_vocab_);
    a.row_max.resize(N);
    a.sums.resize(2 * N);
    a.losses.resize(N);
  }
  return a;
}

template <typename F>
int64_t Gpt<F>::activation_bytes(int64_t B) const {
  const int64_t T_ = config_.seq_len, N = B * T_, Ns = stream_rows(B);
  const int64_t per_layer = 2 * Ns * C_ + 2 * N * C_ + 4 * Ns + 3 * N * Cl_ +
                            B * NHl_ * T_ * T_ + N * Cl_ + 2 * N * Fl_;
  int64_t total = static_cast<int64_t>(shard_.layer_end - shard_.layer_begin) * per_layer + Ns * C_;
  if (shard_.has_head) total += N * C_ + 2 * Ns + N * local_vocab_ + 4 * N;
  return total * static_cast<int64_t>(sizeof(F));
}

template <typename F>
void Gpt<F>::reduce_scatter_rows(F* out, F* full, int64_t rows) {
  tp_.reduce_scatter(full, out, rows * C_, dtype_of<F>());
}

template <typename F>
void Gpt<F>::all_gather_rows(F* full, const F* mine, int64_t rows) {
  tp_.all_gather(mine, full, rows * C_, dtype_of<F>());
}

template <typename F>
F Gpt<F>::forward(Activations& a, const int32_t* tokens, const int32_t* targets, const F* input) {
  const int64_t B = a.B, T_ = a.T, N = B * T_, C = C_, Ns = stream_rows(B);
  const int64_t num_layers = static_cast<int64_t>(a.layers.size());
  F* stream = num_layers > 0 ? a.layers[0].input.data() : a.output.data();
  if (sp_) full_.resize(N * C);
  if (shard_.has_embedding) {
    std::memcpy(a.tokens.data(), tokens, sizeof(int32_t) * N);
    // Each row is looked up by the rank owning its id; the sum over the group completes it.
    if (sp_) {
      cpu::token_embedding_forward(full_.data(), tokens, w(wte_), N, C, vocab_begin_,
                                   local_vocab_);
      reduce_scatter_rows(stream, full_.data(), Ns);
      cpu::position_embedding_forward_rows(stream, w(wpe_), shard_row0(B), Ns, T_, C);
    } else {
      cpu::token_embedding_forward(stream, tokens, w(wte_), N, C, vocab_begin_, local_vocab_);
      all_reduce_sum(tp_, stream, N * C);
      cpu::position_embedding_forward(stream, w(wpe_), B, T_, C);
    }
  } else {
    copy(stream, input, Ns * C);
  }
  for (int64_t i = 0; i < num_layers; ++i) {
    F* out = i + 1 < num_layers ? a.layers[i + 1].input.data() : a.output.data();
    layer_forward(shard_.layer_begin + i, a.layers[i], a.layers[i].input.data(), out, B, T_);
  }
  if (!shard_.has_head) return F(0);

  // Final LayerNorm, LM head (tied, vocab-parallel), cross-entropy without gathering logits.
  const int64_t V = config_.vocab_size, Vl = local_vocab_;
  std::memcpy(a.targets.data(), targets, sizeof(int32_t) * N);
  F* lnf_mine = a.lnf.data() + shard_row0(B) * C;
  cpu::layernorm_forward(lnf_mine, a.lnf_mean.data(), a.lnf_rstd.data(), a.output.data(),
                         w(lnf_w_), w(lnf_b_), Ns, C);
  if (sp_) all_gather_rows(a.lnf.data(), lnf_mine, Ns);
  cpu::linear_forward(a.logits.data(), a.lnf.data(), w(wte_), static_cast<const F*>(nullptr), N,
                      C, Vl);
  cpu::cross_entropy_local_max(a.row_max.data(), a.logits.data(), N, Vl, vocab_begin_, V);
  tp_.all_reduce(a.row_max.data(), N, dtype_of<F>(), ReduceOp::Max);
  cpu::cross_entropy_local_sums(a.sums.data(), a.logits.data(), targets, a.row_max.data(), N, Vl,
                                vocab_begin_, V);
  all_reduce_sum(tp_, a.sums.data(), 2 * N);
  cpu::cross_entropy_loss(a.losses.data(), a.row_max.data(), a.sums.data(), N);
  double total = 0.0;
  for (int64_t n = 0; n < N; ++n) total += static_cast<double>(a.losses[n]);
  return static_cast<F>(total / static_cast<double>(N));
}

template <typename F>
void Gpt<F>::layer_forward(int64_t l, LayerActs& la, const F* input, F* output, int64_t B,
                           int64_t T_) {
  const LayerParams& p = layer_params_[l - shard_.layer_begin];
  const int64_t N = B * T_, C = C_, Ns = stream_rows(B), row0 = shard_row0(B);
  const bool tp_lead = shard_.tp_rank == 0;  // adds the row-parallel biases, once
  // A row-parallel matmul's partial products: summed in place, or reduce-scattered to the
  // rank's rows under sequence parallelism.
  F* proj_out = sp_ ? full_.data() : la.residual1.data();
  F* fc2_out = sp_ ? full_.data() : output;
  // Attention: residual1 = input + proj(attention(qkv(ln1(input))))
  cpu::layernorm_forward(la.ln1.data() + row0 * C, la.ln1_mean.data(), la.ln1_rstd.data(), input,
                         w(p.ln1_w), w(p.ln1_b), Ns, C);
  if (sp_) all_gather_rows(la.ln1.data(), la.ln1.data() + row0 * C, Ns);
  cpu::linear_forward(la.qkv.data(), la.ln1.data(), w(p.qkv_w), w(p.qkv_b), N, C, 3 * Cl_);
  cpu::attention_forward(la.atty.data(), la.att.data(), la.qkv.data(), B, T_, NHl_, HS_);
  cpu::linear_forward(proj_out, la.atty.data(), w(p.proj_w), tp_lead ? w(p.proj_b) : nullptr, N,
                      Cl_, C);
  if (sp_)
    reduce_scatter_rows(la.residual1.data(), proj_out, Ns);
  else
    all_reduce_sum(tp_, la.residual1.data(), N * C);  // row-parallel: sum the partial products
  cpu::add_inplace(la.residual1.data(), input, Ns * C);
  // MLP: output = residual1 + fc2(gelu(fc1(ln2(residual1))))
  cpu::layernorm_forward(la.ln2.data() + row0 * C, la.ln2_mean.data(), la.ln2_rstd.data(),
                         la.residual1.data(), w(p.ln2_w), w(p.ln2_b), Ns, C);
  if (sp_) all_gather_rows(la.ln2.data(), la.ln2.data() + row0 * C, Ns);
  cpu::linear_forward(la.fc1.data(), la.ln2.data(), w(p.fc1_w), w(p.fc1_b), N, C, Fl_);
  cpu::gelu_forward(la.gelu.data(), la.fc1.data(), N * Fl_);
  cpu::linear_forward(fc2_out, la.gelu.data(), w(p.fc2_w), tp_lead ? w(p.fc2_b) : nullptr, N,
                      Fl_, C);
  if (sp_)
    reduce_scatter_rows(output, fc2_out, Ns);
  else
    all_reduce_sum(tp_, output, N * C);  // row-parallel: sum the partial products
  cpu::add_inplace(output, la.residual1.data(), Ns * C);
}

template <typename F>
void Gpt<F>::backward(Activations& a, F loss_scale, const F* d_output, F* d_input) {
  const int64_t B = a.B, T_ = a.T, N = B * T_, C = C_, Ns = stream_rows(B);
  const int64_t num_layers = static_cast<int64_t>(a.layers.size());
  // Scratch sized for the largest micro-batch seen; reused by every backward.
  auto ensure = [](Buffer<F>& buf, int64_t n) {
    if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  };
  ensure(d_ln_, N * C);
  ensure(d_tmp_, N * C);
  ensure(d_qkv_, N * 3 * Cl_);
  ensure(d_atty_, N * Cl_);
  ensure(d_fc1_, N * Fl_);
  ensure(d_gelu_, N * Fl_);
  ensure(d_att_, B * NHl_ * T_ * T_);
  ensure(d_stream_, N * C);
  if (sp_) {
    ensure(d_full_, N * C);
    ensure(d_shard_, Ns * C);
  }
  F* d = d_stream_.data();  // gradient of the rank's residual-stream rows, from the top down

  if (shard_.has_head) {
    const int64_t V = config_.vocab_size, Vl = local_vocab_;
    // dloss/dlosses[n] = loss_scale / N (the forward returned the mean over N tokens).
    for (int64_t n = 0; n < N; ++n) a.losses[n] = loss_scale / static_cast<F>(N);
    cpu::cross_entropy_backward(a.logits.data(), a.logits.data(), a.targets.data(),
                                a.row_max.data(), a.sums.data(), a.losses.data(), N, Vl,
                                vocab_begin_, V);
    cpu::linear_backward(d_ln_.data(), g(wte_), static_cast<F*>(nullptr), a.logits.data(),
                         a.lnf.data(), w(wte_), N, C, Vl);
    // The LM head is column-parallel over the vocab: sum the input gradients.
    const F* d_lnf = sum_input_grads(d_ln_.data(), Ns);
    cpu::layernorm_backward(d, g(lnf_w_), g(lnf_b_), d_lnf, a.output.data(), w(lnf_w_),
                            a.lnf_mean.data(), a.lnf_rstd.data(), Ns, C);
    report_final(params_[lnf_w_].offset);
  } else {
    copy(d, d_output, Ns * C);
  }
  for (int64_t i = num_layers - 1; i >= 0; --i) {
    layer_backward(shard_.layer_begin + i, a.layers[i], d, B, T_);
    report_final(params_[layer_params_[i].ln1_w].offset);
  }
  if (shard_.has_embedding) {
    const F* d_all = gathered_stream_grad(d, Ns);
    cpu::position_embedding_backward(g(wpe_), d_all, B, T_, C);
    cpu::token_embedding_backward(g(wte_), d_all, a.tokens.data(), N, C, vocab_begin_,
                                  local_vocab_);
  } else {
    copy(d_input, d, Ns * C);
  }
  // The embeddings (offset 0 onwards) are never reported: under pipeline parallelism the tied
  // embedding's gradient is only final after its sum over the embedding group, so the
  // trainer reduces that last bucket itself.
}

template <typename F>
const F* Gpt<F>::sum_input_grads(F* partial, int64_t rows) {
  if (!sp_) {
    all_reduce_sum(tp_, partial, rows * C_);
    return partial;
  }
  reduce_scatter_rows(d_shard_.data(), partial, rows);
  return d_shard_.data();
}

template <typename F>
const F* Gpt<F>::gathered_stream_grad(const F* d, int64_t rows) {
  if (!sp_) return d;
  all_gather_rows(d_full_.data(), d, rows);
  return d_full_.data();
}

template <typename F>
void Gpt<F>::layer_backward(int64_t l, LayerActs& la, F* d, int64_t B, int64_t T_) {
  // On entry d = dL/d(layer output); on exit d = dL/d(layer input) (the rank's rows).
  const LayerParams& p = layer_params_[l - shard_.layer_begin];
  const int64_t N = B * T_, C = C_, Ns = stream_rows(B);
  // MLP branch. fc2 is row-parallel: its input gradient needs no communication.
  cpu::linear_backward(d_gelu_.data(), g(p.fc2_w), g(p.fc2_b), gathered_stream_grad(d, Ns),
                       la.gelu.data(), w(p.fc2_w), N, Fl_, C);
  cpu::gelu_backward(d_fc1_.data(), la.fc1.data(), d_gelu_.data(), N * Fl_);
  cpu::linear_backward(d_ln_.data(), g(p.fc1_w), g(p.fc1_b), d_fc1_.data(), la.ln2.data(),
                       w(p.fc1_w), N, C, Fl_);
  // fc1 is column-parallel: sum the input gradients.
  cpu::layernorm_backward(d_tmp_.data(), g(p.ln2_w), g(p.ln2_b), sum_input_grads(d_ln_.data(), Ns),
                          la.residual1.data(), w(p.ln2_w), la.ln2_mean.data(), la.ln2_rstd.data(),
                          Ns, C);
  cpu::add_inplace(d, d_tmp_.data(), Ns * C);  // d = dL/d(residual1)
  // Attention branch.
  cpu::linear_backward(d_atty_.data(), g(p.proj_w), g(p.proj_b), gathered_stream_grad(d, Ns),
                       la.atty.data(), w(p.proj_w), N, Cl_, C);
  cpu::attention_backward(d_qkv_.data(), d_att_.data(), d_atty_.data(), la.qkv.data(),
                          la.att.data(), B, T_, NHl_, HS_);
  cpu::linear_backward(d_ln_.data(), g(p.qkv_w), g(p.qkv_b), d_qkv_.data(), la.ln1.data(),
                       w(p.qkv_w), N, C, 3 * Cl_);
  // qkv is column-parallel: sum the input gradients.
  cpu::layernorm_backward(d_tmp_.data(), g(p.ln1_w), g(p.ln1_b), sum_input_grads(d_ln_.data(), Ns),
                          la.input.data(), w(p.ln1_w), la.ln1_mean.data(), la.ln1_rstd.data(),
                          Ns, C);
  cpu::add_inplace(d, d_tmp_.data(), Ns * C);  // d = dL/d(input)
}

template class Gpt<float>;
template class Gpt<double>;

}  // namespace trident
