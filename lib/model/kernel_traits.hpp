#pragma once
// What the graph asks of a kernel set (model/cpu_kernels.hpp, model/cpu_bf16_kernels.hpp,
// cuda/cuda_kernels.hpp) beyond its member functions: the optional features, each true only
// where the set says so.
#include <concepts>
#include <cstdint>
#include <type_traits>

namespace trident {

// The FP8 reference's quantisation and GEMMs (model/fp8_linear.hpp).
template <class K>
constexpr bool kernels_have_fp8 = requires { requires K::has_fp8; };

// The FP8 backward's GEMMs contract both operands along contiguous rows (the GPU's FP8 tensor
// cores): its operands are quantised straight into that layout, the input and the weight
// transposed, the output gradient in both (K::fp8_quantize_transposed,
// K::fp8_linear_backward_transposed); else row-major, as the forward's (the CPU reference).
template <class K>
constexpr bool kernels_fp8_transposed_backward =
    requires { requires K::fp8_backward_transposed; };

// The current recipe's scales formed in the kernel set's memory (the GPU's): each amax taken
// there (K::abs_max_into), reduced over the groups there, turned into its scale there
// (K::fp8_scales), read by the quantise passes and the GEMMs from there (Fp8Scale::device):
// nothing waits for the stream; else the amax comes to the host (K::abs_max).
template <class K>
constexpr bool kernels_fp8_device_scales = requires { requires K::fp8_scales_on_device; };

// A GPT-2 MLP's up projection and GELU in one call, and the GELU's gradient in its input
// gradient (K::linear_gelu_forward, K::linear_backward_dgelu; train.fused_bias_gelu).
template <class K>
constexpr bool kernels_fuse_linear_gelu = requires { requires K::has_fused_linear_gelu; };

// T holds bf16 values in fp32 storage (the CPU's bf16 precision): a tensor-group sum of them is
// rounded after the reduction (K::round_sum) and the weights have a rounded compute copy.
template <class K>
constexpr bool kernels_store_bf16_values = requires { requires K::bf16_values; };

// The model keeps a compute copy of its master weights (written by K::convert): T is another
// type than G (the GPU's bf16), or holds bf16 values.
template <class K>
constexpr bool kernels_keep_compute_copy =
    !std::is_same_v<typename K::T, typename K::G> || kernels_store_bf16_values<K>;

// The LM head's logits may be left unrounded by the kernel set's head_logits_forward: its loss
// kernels round them as they read them (the CPU's bf16: model/cpu_bf16_kernels.hpp).
template <class K>
constexpr bool kernels_round_logits_in_loss = requires { requires K::loss_rounds_logits; };

// The kernel set reads its weights from a packed bf16 copy the model keeps beside the compute
// copy (K::packs_weights() at run time: the CPU bf16's oneDNN engine; K::pack_weights packs the
// compute copy, K::unpack_weights derives it from a copy the optimizer packed).
template <class K>
constexpr bool kernels_pack_bf16_weights =
    requires(K& k, uint16_t* bits, typename K::T* values) {
      { k.packs_weights() } -> std::convertible_to<bool>;
      k.pack_weights(bits, values, int64_t{0});
      k.unpack_weights(values, bits, int64_t{0});
    };

}  // namespace trident
