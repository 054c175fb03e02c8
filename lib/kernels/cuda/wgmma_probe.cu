// The probes of wgmma_probe.hpp: one warpgroup per launch, thread 0 issuing the TMA loads.
#include "kernels/cuda/wgmma_probe.hpp"

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/sm90.cuh"

namespace trident::cuda {

namespace {

using namespace detail::sm90;
using detail::pack_bf16;

constexpr int kTileBytes = 128 * 128 * 2;  // the largest probe tile

#if TRIDENT_SM90A
// Thread 0 loads a rows x COLS tile at (row0, col0) into dst and every thread waits for it.
// (A pipeline of no stages: its `loaded` barrier only, at `bar`.)
template <int COLS>
__device__ void load_and_wait(uint32_t dst, const CUtensorMap* map, int rows, int row0, int col0,
                              uint32_t bar) {
  const Pipeline<0, 0> once{bar};
  once.init();
  if (threadIdx.x == 0) {
    mbar_expect_tx(once.loaded(), uint32_t(rows) * COLS * 2);
    tma_load_tile<COLS>(dst, map, rows, col0, row0, 0, once.loaded());
  }
  mbar_wait(once.loaded(), 0);
}
// The warpgroup's accumulators of an m64nN product into out[64][N] (row-major).
template <int N>
__device__ void store_accumulators(float* out, const float (&d)[N / 2]) {
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < N / 8; i++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      out[gmma::acc_row(t, e) * N + gmma::acc_col(t, i, e)] = d[4 * i + e];
}
#endif

template <int COLS>
__global__ void tma_probe_kernel(const __grid_constant__ CUtensorMap map, unsigned char* out,
                                 int rows, int row0, int col0) {
#if TRIDENT_SM90A
  extern __shared__ unsigned char smem[];
  const uint32_t base = aligned_smem_base(smem);
  load_and_wait<COLS>(base, &map, rows, row0, col0, base + kTileBytes);
  const unsigned char* tile = smem + (base - smem_addr(smem));
  for (int i = threadIdx.x; i < rows * COLS * 2; i += blockDim.x) out[i] = tile[i];
#else
  (void)out, (void)rows, (void)row0, (void)col0;
  __trap();
#endif
}

template <int N, int K>
__global__ void ss_probe_kernel(const __grid_constant__ CUtensorMap a_map,
                                const __grid_constant__ CUtensorMap b_map, float* out,
                                int a_row0) {
#if TRIDENT_SM90A
  extern __shared__ unsigned char smem[];
  const uint32_t a_s = aligned_smem_base(smem), b_s = a_s + kTileBytes;
  load_and_wait<K>(a_s, &a_map, 128, 0, 0, b_s + kTileBytes);
  load_and_wait<K>(b_s, &b_map, N, 0, 0, b_s + kTileBytes + 8);
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; i++) d[i] = 0.f;
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < K / 16; ks++)
    wgmma_ss<N>(d, gmma::encode(gmma::k_major_desc(a_s, 128, a_row0, ks)),
                gmma::encode(gmma::k_major_desc(b_s, N, 0, ks)), ks > 0);
  wgmma_commit();
  wgmma_wait_all();
  fence_regs(d);
  store_accumulators<N>(out, d);
#else
  (void)out, (void)a_row0;
  __trap();
#endif
}

template <int N, int K>
__global__ void rs_probe_kernel(const __grid_constant__ CUtensorMap v_map, const float* p,
                                float* out) {
#if TRIDENT_SM90A
  extern __shared__ unsigned char smem[];
  const uint32_t v_s = aligned_smem_base(smem);
  load_and_wait<N>(v_s, &v_map, K, 0, 0, v_s + kTileBytes);
  const int t = threadIdx.x;
  uint32_t a[K / 16][4];
#pragma unroll
  for (int j = 0; j < K / 16; j++)
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const float* row = p + gmma::a_row(t, r) * K + 16 * j;
      a[j][r] = pack_bf16(row[gmma::a_col(t, r, 0)], row[gmma::a_col(t, r, 1)]);
    }
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; i++) d[i] = 0.f;
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < K / 16; j++)
    wgmma_rs<N>(d, a[j], gmma::encode(gmma::mn_major_desc(v_s, K, j)));
  wgmma_commit();
  wgmma_wait_all();
  fence_regs(d);
  fence_regs(a);
  store_accumulators<N>(out, d);
#else
  (void)p, (void)out;
  __trap();
#endif
}

void check_probe(bool ok, const char* what) {
  detail::check_dims(ok, what);
  detail::check_dims(attention_wgmma_available(64),
                     "wgmma probe: needs a GPU of compute capability 9.0");
}

template <typename Kernel, typename... Args>
void launch(Kernel kernel, size_t smem, Args... args) {
  detail::prepare_smem(kernel, smem);
  kernel<<<1, 128, smem>>>(args...);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

void wgmma_probe_tma(unsigned char* smem_out, const bf16* data, int T, int64_t C, int row0,
                     int col0, int rows, int cols) {
  check_probe(rows % 64 == 0 && rows > 0 && rows <= 128 && (cols == 64 || cols == 128),
              "wgmma probe (TMA): rows and cols must be 64 or 128");
  const CUtensorMap map = bf16_tensor_map(data, 1, T, C);
  const size_t smem = kTileBytes + 8 + 1024;
  if (cols == 64)
    launch(tma_probe_kernel<64>, smem, map, smem_out, rows, row0, col0);
  else
    launch(tma_probe_kernel<128>, smem, map, smem_out, rows, row0, col0);
}

void wgmma_probe_ss(float* out, const bf16* a, const bf16* b, int N, int K, int a_row0) {
  check_probe((N == 64 || N == 128) && (K == 64 || K == 128) && (a_row0 == 0 || a_row0 == 64),
              "wgmma probe (ss): N, K in {64, 128}, a_row0 in {0, 64}");
  const CUtensorMap a_map = bf16_tensor_map(a, 1, 128, K), b_map = bf16_tensor_map(b, 1, N, K);
  const size_t smem = 2 * kTileBytes + 16 + 1024;
  if (N == 64 && K == 64) launch(ss_probe_kernel<64, 64>, smem, a_map, b_map, out, a_row0);
  if (N == 64 && K == 128) launch(ss_probe_kernel<64, 128>, smem, a_map, b_map, out, a_row0);
  if (N == 128 && K == 64) launch(ss_probe_kernel<128, 64>, smem, a_map, b_map, out, a_row0);
  if (N == 128 && K == 128) launch(ss_probe_kernel<128, 128>, smem, a_map, b_map, out, a_row0);
}

void wgmma_probe_rs(float* out, const float* p, const bf16* v, int N, int K) {
  check_probe((N == 64 || N == 128) && (K == 64 || K == 128),
              "wgmma probe (rs): N, K in {64, 128}");
  const CUtensorMap v_map = bf16_tensor_map(v, 1, K, N);
  const size_t smem = kTileBytes + 8 + 1024;
  if (N == 64 && K == 64) launch(rs_probe_kernel<64, 64>, smem, v_map, p, out);
  if (N == 64 && K == 128) launch(rs_probe_kernel<64, 128>, smem, v_map, p, out);
  if (N == 128 && K == 64) launch(rs_probe_kernel<128, 64>, smem, v_map, p, out);
  if (N == 128 && K == 128) launch(rs_probe_kernel<128, 128>, smem, v_map, p, out);
}

}  // namespace trident::cuda
