// Token and position embeddings (vocab-parallel token table, as the CPU kernels).
//
// Token backward without float atomics: the (local row, token index) pairs are stably
// radix-sorted by row (cub::DeviceRadixSort is stable, so each row's tokens stay in increasing
// n), then a block walks the sorted array, and at the head of each row's run sums the run's
// dout rows in that order (fp32) and adds the sum to dwte. The result depends on the ids only:
// bitwise reproducible for any launch configuration.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"

namespace trident::cuda {

namespace {

template <typename T>
__global__ void token_embedding_forward_kernel(T* __restrict__ out, const int32_t* __restrict__ ids,
                                               const T* __restrict__ wte, int64_t N, int64_t C,
                                               int64_t vocab_begin, int64_t rows) {
  // blockIdx.y = token (grid-strided), x covers the columns.
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const int64_t r = static_cast<int64_t>(ids[n]) - vocab_begin;
    const bool in = r >= 0 && r < rows;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C;
         c += int64_t(gridDim.x) * blockDim.x)
      out[n * C + c] = in ? wte[r * C + c] : detail::from_f32<T>(0.f);
  }
}

__global__ void embedding_keys_kernel(uint32_t* __restrict__ keys, int32_t* __restrict__ vals,
                                      const int32_t* __restrict__ ids, int64_t N,
                                      int64_t vocab_begin, int64_t rows) {
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < N;
       n += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = static_cast<int64_t>(ids[n]) - vocab_begin;
    keys[n] = (r >= 0 && r < rows) ? static_cast<uint32_t>(r) : static_cast<uint32_t>(rows);
    vals[n] = static_cast<int32_t>(n);
  }
}

// blockIdx.x strides over sorted positions; blockIdx.y * blockDim.x + threadIdx.x = column.
template <typename T>
__global__ void token_embedding_backward_kernel(float* __restrict__ dwte,
                                                const T* __restrict__ dout,
                                                const uint32_t* __restrict__ keys,
                                                const int32_t* __restrict__ vals, int64_t N,
                                                int64_t C, int64_t rows) {
  const int64_t c = blockIdx.y * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const uint32_t k = keys[i];
    if (k >= static_cast<uint64_t>(rows)) break;  // sentinels (out of range) sort last
    if (i > 0 && keys[i - 1] == k) continue;      // not the head of its run
    if (c >= C) continue;
    float acc = 0.f;
    for (int64_t j = i; j < N && keys[j] == k; j++)
      acc += detail::to_f32(dout[static_cast<int64_t>(vals[j]) * C + c]);
    dwte[static_cast<int64_t>(k) * C + c] += acc;
  }
}

int key_bits(int64_t rows) {  // bits to represent 0..rows (rows is the sentinel)
  int bits = 1;
  while ((int64_t(1) << bits) <= rows) bits++;
  return bits;
}

size_t sort_temp_bytes(int64_t N, int64_t rows) {
  size_t temp = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp, static_cast<const uint32_t*>(nullptr),
                                             static_cast<uint32_t*>(nullptr),
                                             static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), static_cast<int>(N),
                                             0, key_bits(rows)));
  return temp;
}

// out[r, C] += wpe[(first_row + r) % T_] for rows r < rows of the flattened [B,T] grid that
// start at row first_row (the whole grid: first_row = 0, rows = B*T).
template <typename T>
__global__ void position_embedding_forward_kernel(T* __restrict__ out, const T* __restrict__ wpe,
                                                  int64_t first_row, int64_t rows, int64_t T_,
                                                  int64_t C) {
  const int64_t total = rows * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, c = i % C;
    const int64_t t = (first_row + r) % T_;
    out[i] = detail::from_f32<T>(detail::to_f32(out[i]) + detail::to_f32(wpe[t * C + c]));
  }
}

// out[n, C] += wpe[positions[n]] (context parallelism: a rank's rows are two chunks of each
// sequence).
template <typename T>
__global__ void position_embedding_forward_at_kernel(T* __restrict__ out,
                                                     const T* __restrict__ wpe,
                                                     const int32_t* __restrict__ positions,
                                                     int64_t N, int64_t C) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    const int64_t t = positions[n];
    out[i] = detail::from_f32<T>(detail::to_f32(out[i]) + detail::to_f32(wpe[t * C + c]));
  }
}

template <typename T>
__global__ void position_embedding_backward_kernel(float* __restrict__ dwpe,
                                                   const T* __restrict__ dout, int64_t B,
                                                   int64_t T_, int64_t C) {
  const int64_t total = T_ * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (int64_t b = 0; b < B; b++) acc += detail::to_f32(dout[b * total + i]);
    dwpe[i] += acc;
  }
}

}  // namespace

template <typename T>
void token_embedding_forward(T* out, const int32_t* ids, const T* wte, int64_t N, int64_t C,
                             int64_t vocab_begin, int64_t rows, cudaStream_t stream) {
  detail::check_dims(N >= 0 && C >= 0 && rows >= 0, "token_embedding_forward: negative size");
  if (N == 0 || C == 0) return;
  const int threads = 256;
  dim3 grid(static_cast<unsigned>((C + threads - 1) / threads),
            static_cast<unsigned>(std::min<int64_t>(N, 65535)));
  token_embedding_forward_kernel<T><<<grid, threads, 0, stream>>>(out, ids, wte, N, C,
                                                                  vocab_begin, rows);
  CUDA_CHECK_LAUNCH();
}

size_t token_embedding_backward_workspace_bytes(int64_t N, int64_t rows) {
  using detail::align_up;
  return 4 * align_up(static_cast<size_t>(N) * 4) + align_up(sort_temp_bytes(N, rows));
}

template <typename T>
void token_embedding_backward(float* dwte, const T* dout, const int32_t* ids, int64_t N,
                              int64_t C, int64_t vocab_begin, int64_t rows, cudaStream_t stream,
                              void* workspace) {
  using detail::align_up;
  detail::check_dims(N >= 0 && C >= 0 && rows >= 0, "token_embedding_backward: negative size");
  detail::check_dims(N < (int64_t(1) << 31) && rows < (int64_t(1) << 31),
                     "token_embedding_backward: N and rows must fit in 31 bits");
  if (N == 0 || C == 0 || rows == 0) return;
  const size_t arr = align_up(static_cast<size_t>(N) * 4);
  size_t temp = sort_temp_bytes(N, rows);
  detail::Scratch scratch(workspace, 4 * arr + align_up(temp), stream);
  uint32_t* keys_in = scratch.as<uint32_t>(0);
  int32_t* vals_in = scratch.as<int32_t>(arr);
  uint32_t* keys_out = scratch.as<uint32_t>(2 * arr);
  int32_t* vals_out = scratch.as<int32_t>(3 * arr);
  void* temp_ptr = scratch.as<void>(4 * arr);

  embedding_keys_kernel<<<detail::grid_for(N, 256), 256, 0, stream>>>(keys_in, vals_in, ids, N,
                                                                       vocab_begin, rows);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp_ptr, temp, keys_in, keys_out, vals_in, vals_out,
                                             static_cast<int>(N), 0, key_bits(rows), stream));
  CUDA_CHECK_LAUNCH();
  const int threads = 128;
  dim3 grid(static_cast<unsigned>(std::min<int64_t>(N, 2048)),
            static_cast<unsigned>((C + threads - 1) / threads));
  detail::check_dims(grid.y <= 65535, "token_embedding_backward: C too large");
  token_embedding_backward_kernel<T><<<grid, threads, 0, stream>>>(dwte, dout, keys_out, vals_out,
                                                                   N, C, rows);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void position_embedding_forward(T* out, const T* wpe, int64_t B, int64_t T_, int64_t C,
                                cudaStream_t stream) {
  detail::check_dims(B >= 0 && T_ >= 0 && C >= 0, "position_embedding_forward: negative size");
  if (B * T_ * C == 0) return;
  position_embedding_forward_kernel<T>
      <<<detail::grid_for(B * T_ * C, 256), 256, 0, stream>>>(out, wpe, 0, B * T_, T_, C);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void position_embedding_forward_rows(T* out, const T* wpe, int64_t first_row, int64_t rows,
                                     int64_t T_, int64_t C, cudaStream_t stream) {
  detail::check_dims(first_row >= 0 && rows >= 0 && T_ > 0 && C >= 0,
                     "position_embedding_forward_rows: negative size or T <= 0");
  if (rows * C == 0) return;
  position_embedding_forward_kernel<T>
      <<<detail::grid_for(rows * C, 256), 256, 0, stream>>>(out, wpe, first_row, rows, T_, C);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void position_embedding_backward(float* dwpe, const T* dout, int64_t B, int64_t T_, int64_t C,
                                 cudaStream_t stream) {
  detail::check_dims(B >= 0 && T_ >= 0 && C >= 0, "position_embedding_backward: negative size");
  if (B * T_ * C == 0) return;
  position_embedding_backward_kernel<T>
      <<<detail::grid_for(T_ * C, 256), 256, 0, stream>>>(dwpe, dout, B, T_, C);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void position_embedding_forward_at(T* out, const T* wpe, const int32_t* positions, int64_t N,
                                   int64_t C, cudaStream_t stream) {
  detail::check_dims(N >= 0 && C >= 0, "position_embedding_forward_at: negative size");
  if (N * C == 0) return;
  position_embedding_forward_at_kernel<T>
      <<<detail::grid_for(N * C, 256), 256, 0, stream>>>(out, wpe, positions, N, C);
  CUDA_CHECK_LAUNCH();
}

// Positions may repeat (every sequence of the batch has them): the token table's backward with
// the positions as ids, so each position's rows are summed in row order (deterministic).
size_t position_embedding_backward_at_workspace_bytes(int64_t N) {
  return token_embedding_backward_workspace_bytes(N, kMaxPositionRows);
}

template <typename T>
void position_embedding_backward_at(float* dwpe, const T* dout, const int32_t* positions,
                                    int64_t N, int64_t C, cudaStream_t stream, void* workspace) {
  token_embedding_backward(dwpe, dout, positions, N, C, 0, kMaxPositionRows, stream, workspace);
}

#define TRIDENT_INSTANTIATE(T)                                                                  \
  template void token_embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t,     \
                                           int64_t, int64_t, cudaStream_t);                    \
  template void token_embedding_backward<T>(float*, const T*, const int32_t*, int64_t,         \
                                            int64_t, int64_t, int64_t, cudaStream_t, void*);   \
  template void position_embedding_forward<T>(T*, const T*, int64_t, int64_t, int64_t,         \
                                              cudaStream_t);                                   \
  template void position_embedding_forward_rows<T>(T*, const T*, int64_t, int64_t, int64_t,    \
                                                   int64_t, cudaStream_t);                     \
  template void position_embedding_backward<T>(float*, const T*, int64_t, int64_t, int64_t,    \
                                               cudaStream_t);                                  \
  template void position_embedding_forward_at<T>(T*, const T*, const int32_t*, int64_t,        \
                                                 int64_t, cudaStream_t);                       \
  template void position_embedding_backward_at<T>(float*, const T*, const int32_t*, int64_t,   \
                                                  int64_t, cudaStream_t, void*);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(bf16)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cuda
