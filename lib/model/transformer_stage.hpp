#pragma once
// Transformer<K> behind the StageModel interface, for any kernel set whose master weights and
// gradients are fp32 (the CPU trainer, both GPU precisions). Included where the kernel set is
// instantiated (model/cpu_model.cpp, cuda/cuda_model.cpp).
#include <memory>
#include <type_traits>

#include "model/stage_model.hpp"
#include "model/transformer_impl.hpp"

namespace trident {

template <class K>
class TransformerStage final : public StageModel {
  static_assert(std::is_same_v<typename K::G, float>, "StageModel weights are fp32");
  using T = typename K::T;

 public:
  TransformerStage(const ModelConfig& config, const ModelShard& shard, Communicator& tensor_comm,
                   K kernels)
      : model_(config, shard, tensor_comm, std::move(kernels)) {}

  const ModelConfig& config() const override { return model_.config(); }
  const ModelShard& shard() const override { return model_.shard(); }
  const std::vector<ParamInfo>& params() const override { return model_.params(); }
  Device& device() override { return model_.kernels().device(); }
  float* weights() override { return model_.weights(); }
  float* grads() override { return model_.grads(); }
  int64_t flat_size() const override { return model_.flat_size(); }
  const FlatStore& weight_store() const override { return model_.weight_store(); }
  const FlatStore& grad_store() const override { return model_.grad_store(); }
  void set_zero(Communicator& data, Communicator* expert_data) override {
    model_.set_zero(data, expert_data);
  }
  void reduce_gradients() override { model_.reduce_gradients(); }
  ModelStateBytes state_bytes() const override { return model_.state_bytes(); }
  void init_weights(uint64_t seed) override { model_.init_weights(seed); }
  void zero_grads() override { model_.zero_grads(); }
  void weights_changed() override { model_.weights_changed(); }
  uint16_t* bf16_weights() override {
    if constexpr (K::act_dtype == DType::BF16) {
      static_assert(sizeof(typename K::T) == sizeof(uint16_t));
      return reinterpret_cast<uint16_t*>(model_.compute_weights());
    } else if constexpr (kernels_pack_bf16_weights<K>) {
      return model_.packed_weights();
    } else {
      return nullptr;
    }
  }
  void bf16_copy_written() override { model_.bf16_copy_written(); }

  DType stream_dtype() const override { return K::act_dtype; }
  int64_t stream_elements(int64_t B) const override {
    return model_.stream_rows(B) * model_.config().width;
  }
  int chunk_count() const override { return model_.chunk_count(); }
  Fp8DelayedRecipe* fp8_delayed() override { return model_.fp8_delayed(); }
  std::unique_ptr<Activations> make_activations(int64_t B, bool split_backward,
                                                int chunk) override {
    auto a = std::make_unique<Acts>();
    a->acts = model_.make_activations(B, split_backward, chunk);
    return a;
  }
  int64_t activation_bytes(int64_t B, bool split_backward, int chunk) const override {
    return model_.activation_bytes(B, split_backward, chunk);
  }
  void forward(Activations& a, const int32_t* tokens, const int32_t* targets, const void* input,
               float loss_scale) override {
    model_.forward(acts(a), tokens, targets, static_cast<const T*>(input), loss_scale);
  }
  double take_loss_sum() override { return model_.take_loss_sum(); }
  using StageModel::take_moe_stats;
  void take_moe_stats(MoeStats& into) override { model_.take_moe_stats(into); }
  void set_expert_group(Communicator* group) override { model_.set_expert_group(group); }
  void set_context_group(Communicator* group) override { model_.set_context_group(group); }
  void backward(Activations& a, float loss_scale, const void* d_output, void* d_input) override {
    model_.backward(acts(a), loss_scale, static_cast<const T*>(d_output),
                    static_cast<T*>(d_input));
  }
  void backward_input(Activations& a, float loss_scale, const void* d_output,
                      void* d_input) override {
    model_.backward_input(acts(a), loss_scale, static_cast<const T*>(d_output),
                          static_cast<T*>(d_input));
  }
  void backward_weight(Activations& a) override { model_.backward_weight(acts(a)); }
  const void* output(const Activations& a) const override {
    return static_cast<const Acts&>(a).acts.output.data();
  }
  std::unique_ptr<DecodeCache> make_decode_cache(int64_t B) override {
    auto c = std::make_unique<Cache>();
    c->cache = model_.make_kv_cache(B);
    return c;
  }
  void forward_decode(DecodeCache& c, const int32_t* tokens, const int32_t* positions,
                      float* logits) override {
    model_.forward_decode(static_cast<Cache&>(c).cache, tokens, positions, logits);
  }
  void set_grads_final_hook(std::function<void(int64_t)> hook) override {
    model_.set_grads_final_hook(std::move(hook));
  }

 private:
  struct Cache : DecodeCache {
    typename Transformer<K>::KvCache cache;
  };
  struct Acts : Activations {
    typename Transformer<K>::Activations acts;
  };
  static typename Transformer<K>::Activations& acts(Activations& a) {
    return static_cast<Acts&>(a).acts;
  }

  Transformer<K> model_;
};

}  // namespace trident
