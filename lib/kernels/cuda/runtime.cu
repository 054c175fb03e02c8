// Error reporting, device queries and dtype conversion.
#include <cstdio>
#include <string>

#include "kernels/cuda/common.cuh"

namespace trident::cuda {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  std::string msg = "CUDA error at ";
  msg += file;
  msg += ":" + std::to_string(line) + ": " + expr + ": " + cudaGetErrorName(err) + ": " +
         cudaGetErrorString(err);
  // The runtime keeps a failed call's error as its last error: cleared here, or the next
  // launch check (cudaGetLastError) would report it again, against an innocent kernel. A
  // sticky error (a fault in a kernel) stays: every later call returns it anyway.
  cudaGetLastError();
  throw Error(msg);
}

bool device_available() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  return count > 0;
}

std::string device_summary() {
  if (!device_available()) return "";
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%s (sm_%d%d, %d SMs, %.0f GiB)", prop.name, prop.major,
                prop.minor, prop.multiProcessorCount,
                static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

namespace {
template <typename Dst, typename Src>
__global__ void convert_kernel(Dst* __restrict__ dst, const Src* __restrict__ src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = detail::from_f32<Dst>(detail::to_f32(src[i]));
}
}  // namespace

template <typename Dst, typename Src>
void convert(Dst* dst, const Src* src, int64_t n, cudaStream_t stream) {
  detail::check_dims(n >= 0, "convert: n < 0");
  if (n == 0) return;
  convert_kernel<Dst, Src><<<detail::grid_for(n, 256), 256, 0, stream>>>(dst, src, n);
  CUDA_CHECK_LAUNCH();
}

template void convert<bf16, float>(bf16*, const float*, int64_t, cudaStream_t);
template void convert<float, bf16>(float*, const bf16*, int64_t, cudaStream_t);
template void convert<float, float>(float*, const float*, int64_t, cudaStream_t);
template void convert<bf16, bf16>(bf16*, const bf16*, int64_t, cudaStream_t);

}  // namespace trident::cuda
