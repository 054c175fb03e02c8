// Gpt<float> behind the StageModel interface: its buffers are host memory, so the device
// pointers of the interface are plain host pointers.
#include "model/stage_model.hpp"
#include "util/error.hpp"

namespace trident {

const ParamInfo& StageModel::param(const std::string& name) const {
  for (const ParamInfo& p : params())
    if (p.name == name) return p;
  throw Error("no parameter named '" + name + "' on this rank");
}

namespace {

class CpuStageModel final : public StageModel {
 public:
  CpuStageModel(const ModelConfig& config, const ModelShard& shard, Communicator& tensor_comm,
                Device& host)
      : model_(config, shard, tensor_comm), host_(host) {
    if (!host.is_host()) throw Error("the CPU model needs the host device");
  }

  const ModelConfig& config() const override { return model_.config(); }
  const ModelShard& shard() const override { return model_.shard(); }
  const std::vector<ParamInfo>& params() const override { return model_.params(); }
  Device& device() override { return host_; }
  float* weights() override { return model_.weights().data(); }
  float* grads() override { return model_.grads().data(); }
  int64_t flat_size() const override { return static_cast<int64_t>(model_.weights().size()); }
  void init_weights(uint64_t seed) override { model_.init_weights(seed); }
  void zero_grads() override { model_.zero_grads(); }

  DType stream_dtype() const override { return DType::F32; }
  int64_t stream_elements(int64_t B) const override {
    return model_.stream_rows(B) * model_.config().width;
  }
  std::unique_ptr<Activations> make_activations(int64_t B) override {
    auto a = std::make_unique<Acts>();
    a->acts = model_.make_activations(B);
    return a;
  }
  int64_t activation_bytes(int64_t B) const override { return model_.activation_bytes(B); }
  float forward(Activations& a, const int32_t* tokens, const int32_t* targets,
                const void* input) override {
    return model_.forward(acts(a), tokens, targets, static_cast<const float*>(input));
  }
  void backward(Activations& a, float loss_scale, const void* d_output, void* d_input) override {
    model_.backward(acts(a), loss_scale, static_cast<const float*>(d_output),
                    static_cast<float*>(d_input));
  }
  const void* output(const Activations& a) const override {
    return static_cast<const Acts&>(a).acts.output.data();
  }
  void set_grads_final_hook(std::function<void(int64_t)> hook) override {
    model_.set_grads_final_hook(std::move(hook));
  }

 private:
  struct Acts : Activations {
    Gpt<float>::Activations acts;
  };
  static Gpt<float>::Activations& acts(Activations& a) { return static_cast<Acts&>(a).acts; }

  Gpt<float> model_;
  Device& host_;
};

}  // namespace

std::unique_ptr<StageModel> make_cpu_stage_model(const ModelConfig& config,
                                                 const ModelShard& shard,
                                                 Communicator& tensor_comm, Device& host) {
  return std::make_unique<CpuStageModel>(config, shard, tensor_comm, host);
}

}  // namespace trident
