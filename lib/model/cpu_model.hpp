#pragma once
// The transformer on the CPU kernel set: CpuModel<float> trains, CpuModel<double> is the
// reference of the finite-difference gradient tests; Transformer<CpuBf16Kernels> trains in bf16.
#include "model/cpu_bf16_kernels.hpp"
#include "model/cpu_kernels.hpp"
#include "model/transformer.hpp"

namespace trident {

template <typename F>
class CpuModel : public Transformer<CpuKernels<F>> {
 public:
  // On a host device of its own.
  CpuModel(const ModelConfig& config, const ModelShard& shard, Communicator& tensor_comm)
      : Transformer<CpuKernels<F>>(config, shard, tensor_comm, CpuKernels<F>()) {}
};

extern template class Transformer<CpuKernels<float>>;
extern template class Transformer<CpuKernels<double>>;
extern template class Transformer<CpuBf16Kernels>;

}  // namespace trident
