#pragma once
// What the pipeline executor and the trainer need of one rank's model shard, whichever device
// runs it: the transformer (model/transformer.hpp) on the CPU or the CUDA kernel set (fp32 or bf16
// compute). Parameters are one flat fp32 buffer of master weights and one of gradients, laid
// out by params() (the same layout on every device), in device() memory.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "model/architecture.hpp"
#include "model/fp8_scaling.hpp"
#include "model/moe.hpp"
#include "model/params.hpp"
#include "model/zero_shards.hpp"
#include "tensor/device.hpp"

namespace trident {

class StageModel {
 public:
  // The activations of one micro-batch, kept from its forward until its backward.
  struct Activations {
    virtual ~Activations() = default;
  };

  virtual ~StageModel() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const ModelShard& shard() const = 0;
  virtual const std::vector<ParamInfo>& params() const = 0;
  const ParamInfo& param(std::string_view name) const;  // (a view: no string made per call)
  virtual Device& device() = 0;

  // Flat fp32 master weights and gradients (params() offsets), in device() memory.
  virtual float* weights() = 0;
  virtual float* grads() = 0;
  virtual int64_t flat_size() const = 0;
  // Which elements of the flat buffer weights() and grads() store, and where: the whole buffer
  // at its offsets, or under ZeRO-2/3 the rank's slices packed (model/zero_shards.hpp).
  virtual const FlatStore& weight_store() const = 0;
  virtual const FlatStore& grad_store() const = 0;
  // ZeRO-2/3 (ModelShard::zero_stage 2 or 3): gradients (and at 3 the master weights) sharded
  // over `data` (the data x context group), the stacked experts over `expert_data` (nullptr:
  // data). Before init_weights.
  virtual void set_zero(Communicator& data, Communicator* expert_data) = 0;
  // ZeRO-2/3: reduces what backward left unreduced; after the step's last backward.
  virtual void reduce_gradients() = 0;
  // The model state's bytes on this rank by kind (the optimizer adds its moments).
  virtual ModelStateBytes state_bytes() const = 0;
  // GPT-2 init from the counter-based RNG keyed by (seed, parameter name, global index).
  virtual void init_weights(uint64_t seed) = 0;
  virtual void zero_grads() = 0;
  // To be called after anything but the model wrote weights() (optimizer, checkpoint load,
  // broadcast): a bf16 model refreshes its compute copy. (Not after an AdamW::update that
  // rewrote the copy itself.)
  virtual void weights_changed() {}
  // A bf16 model's compute copy of weights(), element for element (bf16 bits), for the
  // optimizer to rewrite in its own pass; nullptr where the model computes on weights(). (On
  // the CPU, the oneDNN engine's packed bits of its fp32-stored compute weights.)
  virtual uint16_t* bf16_weights() { return nullptr; }
  // To be called after the optimizer rewrote bf16_weights() in place of weights_changed():
  // whatever the model derives from that copy is refreshed from it (the CPU's fp32-stored
  // compute values from the packed bits).
  virtual void bf16_copy_written() {}

  // The type of the residual stream that crosses pipeline stages (F32 or BF16), and its
  // elements per micro-batch of B sequences (fewer under sequence parallelism).
  virtual DType stream_dtype() const = 0;
  virtual int64_t stream_elements(int64_t B) const = 0;
  // The shard's model chunks (ModelShard::layer_chunks: several under the interleaved
  // schedule). Activations are made for one chunk, and forward / backward run that chunk.
  virtual int chunk_count() const = 0;
  // `split_backward`: for backward_input + backward_weight (more memory: the bytes of
  // Transformer::deferred_weight_grad_bytes, counted in activation_bytes).
  virtual std::unique_ptr<Activations> make_activations(int64_t B, bool split_backward,
                                                        int chunk = 0) = 0;
  virtual int64_t activation_bytes(int64_t B, bool split_backward, int chunk = 0) const = 0;
  // Forward one micro-batch through the chunk `a` was made for. `tokens`/`targets` [B*T] are
  // host memory (first stage's chunk 0 / last stage's last chunk); `input` [B,T,C] is device
  // memory (other chunks). The last chunk of the last stage adds the micro-batch's mean loss to
  // a sum kept in device memory. `loss_scale`: training, the one backward will be given (the
  // last chunk forms the LM head's gradients in forward: Transformer::forward); 0: no backward.
  virtual void forward(Activations& a, const int32_t* tokens, const int32_t* targets,
                       const void* input, float loss_scale) = 0;
  // The sum of the micro-batches' mean losses since the last call (0 off the last stage), and
  // resets it: one device-to-host read per step.
  virtual double take_loss_sum() = 0;
  // The MoE layers' auxiliary losses and expert loads since the last call (model/moe.hpp), into
  // `into` (its load list reused: no allocation in a step), and resets them; empty for a dense
  // model.
  virtual void take_moe_stats(MoeStats& into) { into = MoeStats{}; }
  MoeStats take_moe_stats() {
    MoeStats s;
    take_moe_stats(s);
    return s;
  }
  // Expert parallelism: the expert group of this rank (model/moe.hpp), set before the first
  // activations are made; its size and rank must be the shard's ep_size and ep_rank.
  virtual void set_expert_group(Communicator* group) = 0;
  // Context parallelism: the context group of this rank (model/context_parallel.hpp), set
  // before the first forward; its size and rank must be the shard's cp_size and cp_rank.
  virtual void set_context_group(Communicator* group) = 0;
  // Backward of the micro-batch whose forward filled `a` (see Transformer::backward); `d_output` and
  // `d_input` are device memory.
  virtual void backward(Activations& a, float loss_scale, const void* d_output,
                        void* d_input) = 0;
  // backward() in two parts (see Transformer::backward_input / backward_weight): the input
  // gradient and every gradient but the linear layers' weights and biases, then those.
  virtual void backward_input(Activations& a, float loss_scale, const void* d_output,
                              void* d_input) = 0;
  virtual void backward_weight(Activations& a) = 0;
  // The residual stream leaving the chunk after forward(a) (device memory, [B,T,C]).
  virtual const void* output(const Activations& a) const = 0;
  // Generation (Transformer::forward_decode): a key/value cache for B sequences, and one step
  // of one token per sequence at the given positions giving logits [B, vocab_size] (host memory,
  // the same on every rank of the tensor group). Host `tokens`, `positions` [B].
  struct DecodeCache {
    virtual ~DecodeCache() = default;
  };
  virtual std::unique_ptr<DecodeCache> make_decode_cache(int64_t B) = 0;
  virtual void forward_decode(DecodeCache& cache, const int32_t* tokens,
                              const int32_t* positions, float* logits) = 0;
  // See Transformer::set_grads_final_hook.
  // train.fp8_recipe = "delayed": the scaling state of the stage's FP8 GEMMs, which the
  // trainer steps and a checkpoint keeps; nullptr otherwise.
  virtual Fp8DelayedRecipe* fp8_delayed() { return nullptr; }
  virtual void set_grads_final_hook(std::function<void(int64_t)> hook) = 0;
};

// train.precision = "bf16" on the CPU (model/cpu_bf16_kernels.hpp): the linear layers' products
// through oneDNN's bf16 matmul (`onednn`) or fp32 FMAs on the bf16 values.
std::unique_ptr<StageModel> make_cpu_bf16_stage_model(const ModelConfig& config,
                                                      const ModelShard& shard,
                                                      Communicator& tensor_comm, Device& host,
                                                      bool onednn);

// The transformer on the CPU kernel set (fp32) as a StageModel on the host device.
std::unique_ptr<StageModel> make_cpu_stage_model(const ModelConfig& config,
                                                 const ModelShard& shard,
                                                 Communicator& tensor_comm, Device& host);

}  // namespace trident
