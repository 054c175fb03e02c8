// `trident bench-hw --device cuda`, the GPU side (cuda/cuda_bench_hw.hpp). Every timing is the
// best of its repetitions, each taken between an MPI barrier and a stream synchronisation and
// the slowest rank's (MPI MAX): others only ever slow a timing down.
#include "cuda/cuda_bench_hw.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>

#include "comm/mpi_comm.hpp"
#include "cuda/cuda_device.hpp"
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
std::vector<MeasuredGemm> gemm_curve(MPI_Comm comm, cudaStream_t stream, cuda::CublasContext& ctx,
                                     double guess_tflops) {
  std::vector<MeasuredGemm> points;
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
    points.push_back({static_cast<double>(n), flops * inner / t / 1e9});
  }
  return points;
}

// Calls of a timing for ~20 ms of `flops` each at the guessed rate; at most `cap`, as small
// sizes are bound by the launches.
int calls_for(double flops, double guess_tflops, int cap) {
  return std::clamp(static_cast<int>(0.02 * guess_tflops * 1e12 / flops), 1, cap);
}

// A linear layer's training FLOPs: forward, input and weight gradients, 2 M C OC each.
double linear_step_flops(int64_t M, int64_t C, int64_t OC) {
  return 6.0 * static_cast<double>(M) * static_cast<double>(C) * static_cast<double>(OC);
}

// Seconds of one bf16 training step of a linear layer of rows x in x out, as the trainer calls
// it (linear_forward: inp W^T; linear_backward: dinp = dout W and the fp32 weight gradient
// accumulated, dout^T inp; no bias), the best of `reps` timings of the slowest rank.
double linear_step_seconds(MPI_Comm comm, cudaStream_t stream, cuda::CublasContext& ctx,
                           int64_t M, int64_t C, int64_t OC, int reps) {
  DeviceBuffer inp(M * C * sizeof(bf16)), w(OC * C * sizeof(bf16));
  DeviceBuffer out(M * OC * sizeof(bf16)), dinp(M * C * sizeof(bf16));
  DeviceBuffer dw(OC * C * sizeof(float));
  CUDA_CHECK(cudaMemsetAsync(inp.p, 0x3c, M * C * sizeof(bf16), stream));
  CUDA_CHECK(cudaMemsetAsync(w.p, 0x3c, OC * C * sizeof(bf16), stream));
  CUDA_CHECK(cudaMemsetAsync(dw.p, 0, OC * C * sizeof(float), stream));
  const int inner = calls_for(linear_step_flops(M, C, OC), 400.0, 500);
  return best_seconds(comm, stream, reps, [&] {
           for (int i = 0; i < inner; ++i) {
             cuda::linear_forward<bf16>(ctx, out.as<bf16>(), inp.as<bf16>(), w.as<bf16>(),
                                        nullptr, M, C, OC, stream);
             cuda::linear_backward<bf16>(ctx, dinp.as<bf16>(), dw.as<float>(), nullptr,
                                         out.as<bf16>(), inp.as<bf16>(), w.as<bf16>(), M, C, OC,
                                         stream);
           }
         }) /
         inner;
}

// The efficiency curve, as the CPU's (app/cmd_bench_hw.cpp, measure_linear_training): a linear
// layer's training step at each volume s^3, over tokens x in x out = s x s x s, a x a x 4a and
// a x 4a x a (a^3 4 = s^3); FLOPs over time.
std::vector<MeasuredGemm> linear_training_curve(MPI_Comm comm, cudaStream_t stream,
                                                cuda::CublasContext& ctx) {
  std::vector<MeasuredGemm> points;
  for (int s : {256, 512, 1024, 2048, 4096, 8192}) {
    const int a = std::max(8, static_cast<int>(std::lround(s / std::cbrt(4.0) / 8.0)) * 8);
    const int layers[3][3] = {{s, s, s}, {a, a, 4 * a}, {a, 4 * a, a}};  // tokens, in, out
    double flops = 0, seconds = 0;
    for (const auto& l : layers) {
      seconds += linear_step_seconds(comm, stream, ctx, l[0], l[1], l[2], 5);
      flops += linear_step_flops(l[0], l[1], l[2]);
    }
    points.push_back({static_cast<double>(s), flops / seconds / 1e9});
  }
  return points;
}

// The shape grid of the GEMM efficiency, as the CPU's (app/cmd_bench_hw.cpp,
// measure_linear_shapes): the step above at rows x in x out over 256, 1024, 4096 and 16384
// each; [rows, in, out, GFLOP/s].
std::vector<std::array<double, 4>> linear_shape_grid(MPI_Comm comm, cudaStream_t stream,
                                                     cuda::CublasContext& ctx) {
  constexpr int64_t kSizes[] = {256, 1024, 4096, 16384};
  std::vector<std::array<double, 4>> points;
  for (int64_t M : kSizes)
    for (int64_t C : kSizes)
      for (int64_t OC : kSizes)
        points.push_back({static_cast<double>(M), static_cast<double>(C),
                          static_cast<double>(OC),
                          linear_step_flops(M, C, OC) /
                              linear_step_seconds(comm, stream, ctx, M, C, OC, 3) / 1e9});
  return points;
}

// The bf16 fused attention, forward and backward, over (T, head size), as the CPU's: GFLOP/s
// counted as the plan counts attention (the full T x T: 12 T T HS a head for training). Heads
// for ~100 GFLOP of counted work a call (at least 32: the kernels' blocks are per head and
// query block). The forward is also timed alone: its share of the pair's time.
std::vector<MeasuredAttention> attention_curve(MPI_Comm comm, cudaStream_t stream) {
  std::vector<MeasuredAttention> points;
  const int64_t shapes[][2] = {{256, 32},   {512, 64},   {1024, 64},
                               {2048, 128}, {4096, 128}, {8192, 128}};
  for (const auto& shape : shapes) {
    const int64_t T = shape[0], HS = shape[1];
    const double per_head = 12.0 * static_cast<double>(T * T * HS);
    const int64_t heads = std::max<int64_t>(32, static_cast<int64_t>(1e11 / per_head));
    const int64_t NH = 16, B = (heads + NH - 1) / NH;
    const int64_t qkv_elems = B * T * 3 * NH * HS, out_elems = B * T * NH * HS;
    DeviceBuffer qkv(qkv_elems * sizeof(bf16)), dqkv(qkv_elems * sizeof(bf16));
    DeviceBuffer out(out_elems * sizeof(bf16)), dout(out_elems * sizeof(bf16));
    DeviceBuffer lse(B * NH * T * sizeof(float));
    DeviceBuffer workspace(cuda::attention_backward_workspace_bytes(B, T, NH));
    CUDA_CHECK(cudaMemsetAsync(qkv.p, 0x3c, qkv_elems * sizeof(bf16), stream));
    CUDA_CHECK(cudaMemsetAsync(dout.p, 0x3c, out_elems * sizeof(bf16), stream));
    const double work = per_head * static_cast<double>(B * NH);
    const int inner = calls_for(work, 300.0, 200);
    auto forward = [&] {
      cuda::attention_forward<bf16>(out.as<bf16>(), lse.as<float>(), qkv.as<bf16>(), B, T, NH,
                                    NH, HS, stream);
    };
    const double t = best_seconds(comm, stream, 3, [&] {
      for (int i = 0; i < inner; ++i) {
        forward();
        cuda::attention_backward<bf16>(dqkv.as<bf16>(), dout.as<bf16>(), qkv.as<bf16>(),
                                       out.as<bf16>(), lse.as<float>(), B, T, NH, NH, HS, stream,
                                       workspace.p);
      }
    });
    const double t_forward = best_seconds(comm, stream, 3, [&] {
      for (int i = 0; i < inner; ++i) forward();
    });
    points.push_back({T, HS, work * inner / t / 1e9, t_forward / t});
  }
  return points;
}

// The trainer's optimizer pass (tensor/device.hpp: optimizer_pass, through the CudaDevice as a
// training step runs it) over parameter counts: bytes per second as the plan counts them
// (kOptimizerBytesPerParam a parameter).
std::vector<MeasuredOptimizer> optimizer_curve(MPI_Comm comm, CudaDevice& device) {
  std::vector<MeasuredOptimizer> points;
  for (int64_t n : {int64_t{1} << 20, int64_t{1} << 22, int64_t{1} << 24, int64_t{1} << 26,
                    int64_t{1} << 28}) {
    DeviceArray<float> w(device, n), g(device, n), m(device, n), v(device, n);
    AdamWStep step;
    step.lr = 1e-4f;
    step.weight_decay = 0.1f;
    const int inner = static_cast<int>(std::max<int64_t>(1, (int64_t{1} << 28) / n));
    double norms = 0;  // the zeroed gradients' square sums: 0, or the pass is not what it was
    const double t = best_seconds(comm, device.stream(), 3, [&] {
      for (int i = 0; i < inner; ++i)
        norms += optimizer_pass(device, w.data(), g.data(), m.data(), v.data(), n, step);
    });
    if (norms != 0.0) throw Error("bench-hw: the zeroed gradients' square sum is not 0");
    points.push_back({n, kOptimizerBytesPerParam * static_cast<double>(n) * inner / t});
  }
  return points;
}

// NCCL timings over message sizes 64 B ... 256 MiB (x4), as the CPU bench-hw's MPI ones.
void measure_links(MPI_Comm comm, cudaStream_t stream, GpuBenchResult& out) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MpiCommunicator host(comm, "bench-hw-host", /*owns=*/false);
  const std::unique_ptr<Communicator> nccl =
      make_nccl_communicator(host, "bench-hw", stream, NcclUse::Both);
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
  // The trainer's device: its stream and cuBLAS handles carry every timing below.
  CudaDevice device(local % devices);
  const cudaStream_t stream = device.stream();
  cuda::CublasContext& ctx = device.blas();
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  out.device = cuda::device_summary();
  out.memory_bytes = static_cast<double>(total_bytes);
  out.reserved_bytes = static_cast<double>(total_bytes - free_bytes);

  out.bf16 = gemm_curve<bf16, bf16>(comm, stream, ctx, 500.0);
  out.fp32 = gemm_curve<float, float>(comm, stream, ctx, 50.0);
  out.training = linear_training_curve(comm, stream, ctx);
  out.shapes = linear_shape_grid(comm, stream, ctx);
  out.attention = attention_curve(comm, stream);
  out.optimizer = optimizer_curve(comm, device);

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

  // A checkpoint's staging copy: 256 MiB of x into the pinned staging memory, the slowest
  // rank's best of three (ranks of a node share the host's links and memory).
  const int64_t staged = int64_t{256} << 20;
  const std::shared_ptr<void> host = device.allocate_host(staged);
  out.host_link = static_cast<double>(staged) /
                  best_seconds(comm, stream, 3, [&] { device.to_host(host.get(), x.p, staged); });

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
