// GPT forward and backward on the GPU; the CPU Gpt (model/gpt.cpp) is the reference this
// follows op by op: the same communication points, the same bias ownership, the same order of
// gradient completion for the data-parallel hook.
#include "cuda/cuda_model.hpp"

#include <algorithm>
#include <map>
#include <type_traits>
#include <string>
#include <vector>

#include "kernels/cuda/ops.hpp"
#include "model/gpt.hpp"
#include "util/error.hpp"

namespace trident {

namespace {

using cuda::bf16;

template <typename T>
constexpr DType comm_type() {
  return std::is_same_v<T, float> ? DType::F32 : DType::BF16;
}

template <typename T>
class CudaGpt final : public StageModel {
 public:
  CudaGpt(const ModelConfig& config, const ModelShard& shard, Communicator& tensor_comm,
          CudaDevice& device);

  const ModelConfig& config() const override { return config_; }
  const ModelShard& shard() const override { return shard_; }
  const std::vector<ParamInfo>& params() const override { return params_; }
  Device& device() override { return dev_; }
  float* weights() override { return master_.data(); }
  float* grads() override { return grads_.data(); }
  int64_t flat_size() const override { return master_.size(); }
  void init_weights(uint64_t seed) override;
  void zero_grads() override { dev_.fill_zero(grads_.data(), grads_.bytes()); }
  void weights_changed() override;

  DType stream_dtype() const override { return comm_type<T>(); }
  int64_t stream_elements(int64_t B) const override { return B * config_.seq_len * C_; }
  std::unique_ptr<Activations> make_activations(int64_t B) override;
  int64_t activation_bytes(int64_t B) const override;
  float forward(Activations& a, const int32_t* tokens, const int32_t* targets,
                const void* input) override;
  void backward(Activations& a, float loss_scale, const void* d_output, void* d_input) override;
  const void* output(const Activations& a) const override {
    return static_cast<const Acts&>(a).output.data();
  }
  void set_grads_final_hook(std::function<void(int64_t)> hook) override {
    grads_final_ = std::move(hook);
  }

 private:
  struct LayerActs {
    DeviceArray<T> input, ln1, qkv, atty, residual1, ln2, fc1, gelu;
    DeviceArray<float> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd, lse;
  };
  struct Acts : Activations {
    int64_t B = 0, seq = 0;
    DeviceArray<int32_t> tokens, targets;
    std::vector<LayerActs> layers;
    DeviceArray<T> output, lnf, logits;
    DeviceArray<float> lnf_mean, lnf_rstd, row_max, sums, losses;
  };
  struct LayerParams {
    int64_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };

  int64_t offset(const std::string& name) const;
  const T* w(int64_t off) const { return compute_weights() + off; }
  float* g(int64_t off) { return grads_.data() + off; }
  const T* compute_weights() const;
  cudaStream_t stream() const { return dev_.stream(); }
  void all_reduce_sum(T* x, int64_t n) { tp_.all_reduce(x, n, comm_type<T>(), ReduceOp::Sum); }
  void layer_forward(int64_t i, LayerActs& la, const T* input, T* output, int64_t B, int64_t T_);
  void layer_backward(int64_t i, LayerActs& la, T* d, int64_t B, int64_t T_);
  void ensure_scratch(int64_t B);
  // Host ids to the device without waiting for the stream: a copy from pageable memory returns
  // once the source has been read into the driver's staging memory, so the caller may reuse it.
  void copy_ids(int32_t* dst, const int32_t* host, int64_t n) {
    CUDA_CHECK(cudaMemcpyAsync(dst, host, static_cast<size_t>(n) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream()));
  }
  void report_final(int64_t watermark) {
    if (grads_final_) grads_final_(watermark);
  }

  ModelConfig config_;
  ModelShard shard_;
  Communicator& tp_;
  CudaDevice& dev_;
  int64_t C_, Cl_, Fl_, NHl_, HS_, vocab_begin_, local_vocab_;
  std::vector<ParamInfo> params_;
  std::vector<LayerParams> layers_;
  int64_t wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;
  DeviceArray<float> master_, grads_;
  DeviceArray<bf16> compute_;  // bf16 copy of master_ (bf16 only)
  std::function<void(int64_t)> grads_final_;
  // Backward scratch shared by all micro-batches (one backward runs at a time).
  int64_t scratch_rows_ = 0;
  DeviceArray<T> d_stream_, d_ln_, d_tmp_, d_qkv_, d_atty_, d_fc1_;
  DeviceArray<float> d_loss_;
  DeviceArray<unsigned char> workspace_;
  std::vector<float> host_losses_;
};

template <typename T>
CudaGpt<T>::CudaGpt(const ModelConfig& config, const ModelShard& shard, Communicator& tensor_comm,
                    CudaDevice& device)
    : config_(config), shard_(shard), tp_(tensor_comm), dev_(device) {
  if (shard.sequence_parallel)
    throw Error("parallel.sequence_parallel = true runs on the CPU backend only so far; the "
                "CUDA model shards no activations along the sequence");
  params_ = Gpt<float>::shard_parameters(config, shard);  // validates the split
  C_ = config.width;
  Cl_ = C_ / shard.tp_size;
  Fl_ = config.ffn_width() / shard.tp_size;
  NHl_ = config.heads / shard.tp_size;
  HS_ = config.head_size();
  if (HS_ != 32 && HS_ != 64 && HS_ != 128)
    throw Error("model.width / model.heads = " + std::to_string(HS_) +
                ": the CUDA attention kernels support head sizes 32, 64 and 128");
  local_vocab_ = padded_vocab_size(config, shard.tp_size) / shard.tp_size;
  vocab_begin_ = shard.tp_rank * local_vocab_;
  if (shard.has_embedding || shard.has_head) wte_ = offset("embedding.token.weight");
  if (shard.has_embedding) wpe_ = offset("embedding.position.weight");
  for (int64_t l = shard.layer_begin; l < shard.layer_end; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    layers_.push_back({offset(p + "ln1.weight"), offset(p + "ln1.bias"),
                       offset(p + "attn.qkv.weight"), offset(p + "attn.qkv.bias"),
                       offset(p + "attn.proj.weight"), offset(p + "attn.proj.bias"),
                       offset(p + "ln2.weight"), offset(p + "ln2.bias"),
                       offset(p + "mlp.fc1.weight"), offset(p + "mlp.fc1.bias"),
                       offset(p + "mlp.fc2.weight"), offset(p + "mlp.fc2.bias")});
  }
  if (shard.has_head) {
    lnf_w_ = offset("final_ln.weight");
    lnf_b_ = offset("final_ln.bias");
  }
  int64_t total = 0;
  for (const ParamInfo& p : params_) total = std::max(total, p.offset + p.numel());
  total = (total + 15) / 16 * 16;
  master_ = DeviceArray<float>(device, total);
  grads_ = DeviceArray<float>(device, total);
  if constexpr (std::is_same_v<T, bf16>) compute_ = DeviceArray<bf16>(device, total);
  d_loss_ = DeviceArray<float>(device, 0);
}

template <typename T>
int64_t CudaGpt<T>::offset(const std::string& name) const {
  for (const ParamInfo& p : params_)
    if (p.name == name) return p.offset;
  throw Error("CUDA model: no parameter named '" + name + "' on this rank");
}

template <typename T>
const T* CudaGpt<T>::compute_weights() const {
  if constexpr (std::is_same_v<T, bf16>)
    return compute_.data();
  else
    return master_.data();
}

template <typename T>
void CudaGpt<T>::init_weights(uint64_t seed) {
  // Generated on the host one tensor at a time (this rank's shard only), then copied.
  std::vector<float> host;
  for (const ParamInfo& p : params_) {
    host.resize(static_cast<size_t>(p.numel()));
    init_parameter(p, seed, config_.layers, host.data());
    dev_.from_host(master_.data() + p.offset, host.data(), p.numel() * 4);
  }
  weights_changed();
}

template <typename T>
void CudaGpt<T>::weights_changed() {
  if constexpr (std::is_same_v<T, bf16>)
    cuda::convert(compute_.data(), master_.data(), master_.size(), stream());
}

template <typename T>
std::unique_ptr<StageModel::Activations> CudaGpt<T>::make_activations(int64_t B) {
  const int64_t T_ = config_.seq_len, N = B * T_;
  auto a = std::make_unique<Acts>();
  a->B = B;
  a->seq = T_;
  a->tokens = DeviceArray<int32_t>(dev_, N);
  a->targets = DeviceArray<int32_t>(dev_, N);
  for (int64_t l = shard_.layer_begin; l < shard_.layer_end; ++l) {
    LayerActs la;
    la.input = DeviceArray<T>(dev_, N * C_);
    la.ln1 = DeviceArray<T>(dev_, N * C_);
    la.ln1_mean = DeviceArray<float>(dev_, N);
    la.ln1_rstd = DeviceArray<float>(dev_, N);
    la.qkv = DeviceArray<T>(dev_, N * 3 * Cl_);
    la.atty = DeviceArray<T>(dev_, N * Cl_);
    la.lse = DeviceArray<float>(dev_, B * NHl_ * T_);
    la.residual1 = DeviceArray<T>(dev_, N * C_);
    la.ln2 = DeviceArray<T>(dev_, N * C_);
    la.ln2_mean = DeviceArray<float>(dev_, N);
    la.ln2_rstd = DeviceArray<float>(dev_, N);
    la.fc1 = DeviceArray<T>(dev_, N * Fl_);
    la.gelu = DeviceArray<T>(dev_, N * Fl_);
    a->layers.push_back(std::move(la));
  }
  a->output = DeviceArray<T>(dev_, N * C_);
  if (shard_.has_head) {
    a->lnf = DeviceArray<T>(dev_, N * C_);
    a->lnf_mean = DeviceArray<float>(dev_, N);
    a->lnf_rstd = DeviceArray<float>(dev_, N);
    a->logits = DeviceArray<T>(dev_, N * local_vocab_);
    a->row_max = DeviceArray<float>(dev_, N);
    a->sums = DeviceArray<float>(dev_, 2 * N);
    a->losses = DeviceArray<float>(dev_, N);
  }
  return a;
}

template <typename T>
int64_t CudaGpt<T>::activation_bytes(int64_t B) const {
  const int64_t T_ = config_.seq_len, N = B * T_, e = sizeof(T), f = sizeof(float);
  const int64_t per_layer = e * (5 * N * C_ + 4 * N * Cl_ + 2 * N * Fl_) +
                            f * (4 * N + B * NHl_ * T_);
  int64_t total = (shard_.layer_end - shard_.layer_begin) * per_layer + e * N * C_ + 8 * N;
  if (shard_.has_head) total += e * (N * C_ + N * local_vocab_) + f * 6 * N;
  return total;
}

template <typename T>
void CudaGpt<T>::ensure_scratch(int64_t B) {
  const int64_t T_ = config_.seq_len, N = B * T_;
  if (N <= scratch_rows_) return;
  scratch_rows_ = N;
  d_stream_ = DeviceArray<T>(dev_, N * C_);
  d_ln_ = DeviceArray<T>(dev_, N * C_);
  d_tmp_ = DeviceArray<T>(dev_, N * C_);
  d_qkv_ = DeviceArray<T>(dev_, N * 3 * Cl_);
  d_atty_ = DeviceArray<T>(dev_, N * Cl_);
  d_fc1_ = DeviceArray<T>(dev_, N * Fl_);
  d_loss_ = DeviceArray<float>(dev_, N);
  const int64_t widest = std::max({3 * Cl_, Fl_, C_, local_vocab_});
  size_t ws = std::max({cuda::layernorm_backward_workspace_bytes(N, C_),
                        cuda::bias_grad_workspace_bytes(N, widest),
                        cuda::attention_backward_workspace_bytes(B, T_, NHl_),
                        cuda::token_embedding_backward_workspace_bytes(N, local_vocab_)});
  workspace_ = DeviceArray<unsigned char>(dev_, static_cast<int64_t>(ws));
}

template <typename T>
float CudaGpt<T>::forward(Activations& base, const int32_t* tokens, const int32_t* targets,
                          const void* input) {
  Acts& a = static_cast<Acts&>(base);
  const int64_t B = a.B, T_ = a.seq, N = B * T_, C = C_;
  const cudaStream_t s = stream();
  const int64_t num_layers = static_cast<int64_t>(a.layers.size());
  T* x = num_layers > 0 ? a.layers[0].input.data() : a.output.data();
  if (shard_.has_embedding) {
    copy_ids(a.tokens.data(), tokens, N);
    cuda::token_embedding_forward(x, a.tokens.data(), w(wte_), N, C, vocab_begin_, local_vocab_,
                                  s);
    all_reduce_sum(x, N * C);  // each row was looked up by the rank owning its id
    cuda::position_embedding_forward(x, w(wpe_), B, T_, C, s);
  } else {
    dev_.copy(x, input, N * C * static_cast<int64_t>(sizeof(T)));
  }
  for (int64_t i = 0; i < num_layers; ++i) {
    T* out = i + 1 < num_layers ? a.layers[i + 1].input.data() : a.output.data();
    layer_forward(i, a.layers[i], a.layers[i].input.data(), out, B, T_);
  }
  if (!shard_.has_head) return 0.0f;

  // Final LayerNorm, LM head (tied, vocab-parallel), cross-entropy without gathering logits.
  const int64_t V = config_.vocab_size, Vl = local_vocab_;
  copy_ids(a.targets.data(), targets, N);
  cuda::layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), a.output.data(),
                          w(lnf_w_), w(lnf_b_), N, C, s);
  cuda::linear_forward<T>(dev_.blas(), a.logits.data(), a.lnf.data(), w(wte_), nullptr, N, C, Vl,
                          s);
  if (shard_.tp_size == 1) {
    cuda::cross_entropy_forward_fused(a.losses.data(), a.row_max.data(), a.sums.data(),
                                      a.logits.data(), a.targets.data(), N, Vl, V, s);
  } else {
    cuda::cross_entropy_local_max(a.row_max.data(), a.logits.data(), N, Vl, vocab_begin_, V, s);
    tp_.all_reduce(a.row_max.data(), N, DType::F32, ReduceOp::Max);
    cuda::cross_entropy_local_sums(a.sums.data(), a.logits.data(), a.targets.data(),
                                   a.row_max.data(), N, Vl, vocab_begin_, V, s);
    tp_.all_reduce(a.sums.data(), 2 * N, DType::F32, ReduceOp::Sum);
    cuda::cross_entropy_loss(a.losses.data(), a.row_max.data(), a.sums.data(), N, s);
  }
  host_losses_.resize(static_cast<size_t>(N));
  dev_.to_host(host_losses_.data(), a.losses.data(), N * 4);
  double total = 0.0;
  for (float l : host_losses_) total += static_cast<double>(l);
  return static_cast<float>(total / static_cast<double>(N));
}

template <typename T>
void CudaGpt<T>::layer_forward(int64_t i, LayerActs& la, const T* input, T* output, int64_t B,
                               int64_t T_) {
  const LayerParams& p = layers_[i];
  const int64_t N = B * T_, C = C_;
  const cudaStream_t s = stream();
  cuda::CublasContext& blas = dev_.blas();
  const bool tp_lead = shard_.tp_rank == 0;  // adds the row-parallel biases, once
  // Attention: residual1 = input + proj(attention(qkv(ln1(input))))
  cuda::layernorm_forward(la.ln1.data(), la.ln1_mean.data(), la.ln1_rstd.data(), input,
                          w(p.ln1_w), w(p.ln1_b), N, C, s);
  cuda::linear_forward(blas, la.qkv.data(), la.ln1.data(), w(p.qkv_w), w(p.qkv_b), N, C, 3 * Cl_,
                       s);
  cuda::attention_forward(la.atty.data(), la.lse.data(), la.qkv.data(), B, T_, NHl_, HS_, s);
  cuda::linear_forward(blas, la.residual1.data(), la.atty.data(), w(p.proj_w),
                       tp_lead ? w(p.proj_b) : nullptr, N, Cl_, C, s);
  all_reduce_sum(la.residual1.data(), N * C);  // row-parallel: sum the partial products
  cuda::add_inplace(la.residual1.data(), input, N * C, s);
  // MLP: output = residual1 + fc2(gelu(fc1(ln2(residual1))))
  cuda::layernorm_forward(la.ln2.data(), la.ln2_mean.data(), la.ln2_rstd.data(),
                          la.residual1.data(), w(p.ln2_w), w(p.ln2_b), N, C, s);
  cuda::linear_forward(blas, la.fc1.data(), la.ln2.data(), w(p.fc1_w), w(p.fc1_b), N, C, Fl_, s);
  cuda::gelu_forward(la.gelu.data(), la.fc1.data(), N * Fl_, s);
  cuda::linear_forward(blas, output, la.gelu.data(), w(p.fc2_w), tp_lead ? w(p.fc2_b) : nullptr,
                       N, Fl_, C, s);
  all_reduce_sum(output, N * C);  // row-parallel: sum the partial products
  cuda::add_inplace(output, la.residual1.data(), N * C, s);
}

template <typename T>
void CudaGpt<T>::backward(Activations& base, float loss_scale, const void* d_output,
                          void* d_input) {
  Acts& a = static_cast<Acts&>(base);
  const int64_t B = a.B, T_ = a.seq, N = B * T_, C = C_;
  const cudaStream_t s = stream();
  const int64_t num_layers = static_cast<int64_t>(a.layers.size());
  ensure_scratch(B);
  T* d = d_stream_.data();  // gradient of the residual stream, walked from the top down
  void* ws = workspace_.data();
  const int64_t stream_bytes = N * C * static_cast<int64_t>(sizeof(T));

  if (shard_.has_head) {
    const int64_t V = config_.vocab_size, Vl = local_vocab_;
    // dloss/dlosses[n] = loss_scale / N (the forward returned the mean over N tokens).
    cuda::fill(d_loss_.data(), N, loss_scale / static_cast<float>(N), s);
    cuda::cross_entropy_backward(a.logits.data(), a.logits.data(), a.targets.data(),
                                 a.row_max.data(), a.sums.data(), d_loss_.data(), N, Vl,
                                 vocab_begin_, V, s);
    cuda::linear_backward<T>(dev_.blas(), d_ln_.data(), g(wte_), nullptr, a.logits.data(),
                             a.lnf.data(), w(wte_), N, C, Vl, s, ws);
    all_reduce_sum(d_ln_.data(), N * C);  // LM head is column-parallel over the vocab
    cuda::layernorm_backward(d, g(lnf_w_), g(lnf_b_), d_ln_.data(), a.output.data(), w(lnf_w_),
                             a.lnf_mean.data(), a.lnf_rstd.data(), N, C, s, ws);
    report_final(lnf_w_);
  } else {
    dev_.copy(d, d_output, stream_bytes);
  }
  for (int64_t i = num_layers - 1; i >= 0; --i) {
    layer_backward(i, a.layers[i], d, B, T_);
    report_final(layers_[i].ln1_w);
  }
  if (shard_.has_embedding) {
    cuda::position_embedding_backward(g(wpe_), d, B, T_, C, s);
    cuda::token_embedding_backward(g(wte_), d, a.tokens.data(), N, C, vocab_begin_, local_vocab_,
                                   s, ws);
  } else {
    dev_.copy(d_input, d, stream_bytes);
  }
}

template <typename T>
void CudaGpt<T>::layer_backward(int64_t i, LayerActs& la, T* d, int64_t B, int64_t T_) {
  // On entry d = dL/d(layer output); on exit d = dL/d(layer input).
  const LayerParams& p = layers_[i];
  const int64_t N = B * T_, C = C_;
  const cudaStream_t s = stream();
  cuda::CublasContext& blas = dev_.blas();
  void* ws = workspace_.data();
  // MLP branch. fc2 is row-parallel: its input gradient needs no communication. The gradient
  // of gelu's output is written into d_fc1_, then turned in place into that of fc1's output.
  cuda::linear_backward(blas, d_fc1_.data(), g(p.fc2_w), g(p.fc2_b), d, la.gelu.data(),
                        w(p.fc2_w), N, Fl_, C, s, ws);
  cuda::gelu_backward(d_fc1_.data(), la.fc1.data(), d_fc1_.data(), N * Fl_, s);
  cuda::linear_backward(blas, d_ln_.data(), g(p.fc1_w), g(p.fc1_b), d_fc1_.data(), la.ln2.data(),
                        w(p.fc1_w), N, C, Fl_, s, ws);
  all_reduce_sum(d_ln_.data(), N * C);  // fc1 is column-parallel: sum input gradients
  cuda::layernorm_backward(d_tmp_.data(), g(p.ln2_w), g(p.ln2_b), d_ln_.data(),
                           la.residual1.data(), w(p.ln2_w), la.ln2_mean.data(),
                           la.ln2_rstd.data(), N, C, s, ws);
  cuda::add_inplace(d, d_tmp_.data(), N * C, s);  // d = dL/d(residual1)
  // Attention branch.
  cuda::linear_backward(blas, d_atty_.data(), g(p.proj_w), g(p.proj_b), d, la.atty.data(),
                        w(p.proj_w), N, Cl_, C, s, ws);
  cuda::attention_backward(d_qkv_.data(), d_atty_.data(), la.qkv.data(), la.atty.data(),
                           la.lse.data(), B, T_, NHl_, HS_, s, ws);
  cuda::linear_backward(blas, d_ln_.data(), g(p.qkv_w), g(p.qkv_b), d_qkv_.data(), la.ln1.data(),
                        w(p.qkv_w), N, C, 3 * Cl_, s, ws);
  all_reduce_sum(d_ln_.data(), N * C);  // qkv is column-parallel: sum input gradients
  cuda::layernorm_backward(d_tmp_.data(), g(p.ln1_w), g(p.ln1_b), d_ln_.data(), la.input.data(),
                           w(p.ln1_w), la.ln1_mean.data(), la.ln1_rstd.data(), N, C, s, ws);
  cuda::add_inplace(d, d_tmp_.data(), N * C, s);  // d = dL/d(input)
}

}  // namespace

std::unique_ptr<StageModel> make_cuda_stage_model(const ModelConfig& config,
                                                  const ModelShard& shard,
                                                  Communicator& tensor_comm, CudaDevice& device,
                                                  bool bf16) {
  if (bf16) return std::make_unique<CudaGpt<cuda::bf16>>(config, shard, tensor_comm, device);
  return std::make_unique<CudaGpt<float>>(config, shard, tensor_comm, device);
}

}  // namespace trident
