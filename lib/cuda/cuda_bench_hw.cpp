// `trident bench-hw --device cuda`, the GPU side (cuda/cuda_bench_hw.hpp). Every timing is the
// best of its repetitions, each taken between an MPI barrier and a stream synchronisation and
// the slowest rank's (MPI MAX): others only ever slow a timing down.
#include "cuda/cuda_bench_hw.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>

#include "cuda/nccl_comm.hpp"
#include "kernels/cuda/ops.hpp"
#include "util/error.hpp"

namespace trident {

namespace {

using cuda::bf16;

// A device buffer freed on scope exit.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Seconds of one call of `work` (enqueued on `stream`): best of `reps` after one warm-up.
double best_seconds(MPI_Comm comm, cudaStream_t stream, int reps,
                    const std::function<void()>& work) {
  work();
  CUDA_CHECK(cudaStreamSynchronize(stream));
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(comm);
    const auto t0 = std::chrono::steady_clock::now();
    work();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm);
    best = std::min(best, t);
  }
  return best;
}

// The square GEMMs of the curve, A and B of type TAB, C of type TC (bf16: bf16 out; fp32: true
// fp32, TF32 off, as the trainer's fp32 path runs). Calls per timing: ~20 ms of work at the
// guessed rate.
template <typename TAB, typename TC>
std::vector<GpuGemmPoint> gemm_curve(MPI_Comm comm, cudaStream_t stream, cuda::CublasContext& ctx,
                                     double guess_tflops) {
  std::vector<GpuGemmPoint> points;
  for (int n : {256, 512, 1024, 2048, 4096, 8192}) {
    const size_t elems = static_cast<size_t>(n) * n;
    DeviceBuffer a(elems * sizeof(TAB)), b(elems * sizeof(TAB)), c(elems * sizeof(TC));
    // 0x3c bytes: 0.0117 in bf16 and 0.0115 in fp32, finite and normal.
    CUDA_CHECK(cudaMemsetAsync(a.p, 0x3c, elems * sizeof(TAB), stream));
    CUDA_CHECK(cudaMemsetAsync(b.p, 0x3c, elems * sizeof(TAB), stream));
    const double flops = 2.0 * n * static_cast<double>(n) * n;
    // At most 2000 calls: the small sizes are bound by the launch, not the flops.
    const int inner =
        std::clamp(static_cast<int>(0.02 * guess_tflops * 1e12 / flops), 1, 2000);
    const double t = best_seconds(comm, stream, 5, [&] {
      for (int i = 0; i < inner; ++i)
        cuda::gemm<TAB, TC>(ctx, false, false, n, n, n, 1.0f, a.as<TAB>(), n, b.as<TAB>(), n,
                            0.0f, c.as<TC>(), n, stream);
    });
    points.push_back({n, flops * inner / t / 1e9});
  }
  return points;
}

// NCCL timings over message sizes 64 B ... 256 MiB (x4), as the CPU bench-hw's MPI ones.
void measure_links(MPI_Comm comm, cudaStream_t stream, GpuBenchResult& out) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const std::unique_ptr<Communicator> nccl =
      make_nccl_communicator(comm, "bench-hw", stream, NcclUse::Both);
  const size_t max_bytes = size_t{256} << 20;
  DeviceBuffer send(max_bytes), recv(max_bytes);
  CUDA_CHECK(cudaMemsetAsync(send.p, 0, max_bytes, stream));
  for (double bytes = 64; bytes <= static_cast<double>(max_bytes); bytes *= 4) {
    const int64_t count = static_cast<int64_t>(bytes) / 4 / size * size;  // floats
    const int reps = bytes < 1e6 ? 20 : 5;
    out.message_bytes.push_back(static_cast<double>(count) * 4.0);
    out.all_reduce.push_back(best_seconds(comm, stream, reps, [&] {
      nccl->all_reduce(send.p, count, DType::F32, ReduceOp::Sum);
    }));
    out.all_gather.push_back(best_seconds(comm, stream, reps, [&] {
      nccl->all_gather(send.as<float>() + rank * (count / size), recv.p, count / size,
                       DType::F32);
    }));
    out.reduce_scatter.push_back(best_seconds(comm, stream, reps, [&] {
      nccl->reduce_scatter(send.p, recv.p, count / size, DType::F32);
    }));
    out.send_recv.push_back(best_seconds(comm, stream, reps, [&] {
      if (rank >= 2) return;  // ranks 0 and 1 exchange, both directions at once
      auto s = nccl->isend(send.p, count, DType::F32, 1 - rank, 0);
      auto r = nccl->irecv(recv.p, count, DType::F32, 1 - rank, 0);
      s->wait();
      r->wait();
    }));
  }
}

}  // namespace

void measure_gpu(MPI_Comm comm, GpuBenchResult& out) {
  if (!cuda::device_available())
    throw Error("bench-hw --device cuda: no CUDA device is visible to this process "
                "(nvidia-smi, CUDA_VISIBLE_DEVICES)");
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0, local_size = 1, devices = 0, size = 1;
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  MPI_Comm_size(comm, &size);
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  CUDA_CHECK(cudaSetDevice(local % devices));
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::unique_ptr<cudaStream_t, void (*)(cudaStream_t*)> stream_guard(
      &stream, [](cudaStream_t* s) { cudaStreamDestroy(*s); });
  cuda::CublasContext ctx;
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  out.device = cuda::device_summary();
  out.memory_bytes = static_cast<double>(total_bytes);
  out.reserved_bytes = static_cast<double>(total_bytes - free_bytes);

  out.bf16 = gemm_curve<bf16, bf16>(comm, stream, ctx, 500.0);
  out.fp32 = gemm_curve<float, float>(comm, stream, ctx, 50.0);

  // The trainer's bf16 GELU, forward (4 bytes an element) and backward (6), over 256 Mi
  // elements: the rate the plan prices activation bytes at, as on the CPU.
  const int64_t n = int64_t{256} << 20;
  DeviceBuffer x(n * sizeof(bf16)), y(n * sizeof(bf16)), dy(n * sizeof(bf16));
  CUDA_CHECK(cudaMemsetAsync(x.p, 0x3c, n * sizeof(bf16), stream));
  CUDA_CHECK(cudaMemsetAsync(dy.p, 0x3c, n * sizeof(bf16), stream));
  const double forward = best_seconds(comm, stream, 5, [&] {
    cuda::gelu_forward<bf16>(y.as<bf16>(), x.as<bf16>(), n, stream);
  });
  const double backward = best_seconds(comm, stream, 5, [&] {
    cuda::gelu_backward<bf16>(y.as<bf16>(), x.as<bf16>(), dy.as<bf16>(), n, stream);
  });
  out.bandwidth = 10.0 * static_cast<double>(n) / (forward + backward);

  int own = local_size <= devices ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &own, 1, MPI_INT, MPI_MIN, comm);
  if (size < 2)
    out.links_note = "links: NOT measured (1 rank); run under mpiexec -n 2 or more, a GPU each";
  else if (own == 0)
    out.links_note = "links: NOT measured: " + std::to_string(local_size) +
                     " ranks of a node share " + std::to_string(devices) +
                     " GPU(s), and NCCL needs a GPU per rank";
  else
    measure_links(comm, stream, out);
  if (out.links_note.empty())
    out.links_note = "links: NCCL over " + std::to_string(size) + " ranks, a GPU each";
}

}  // namespace trident
