// trident bench-hw: measures the machine it runs on and writes a hardware description
// (plan/hardware.hpp, docs/plan.md) for `trident plan`. CPU only: the trainer's own sgemm
// (kernels/cpu/blas.hpp) on cubes (the peak) and on a linear layer's training GEMMs over
// sizes (the efficiency curve), the rate its elementwise kernels
// stream at (memory bandwidth), and MPI send/recv, all-reduce, all-gather and reduce-scatter
// over message sizes between the ranks it is launched with (latency and bandwidth from the
// best timings, see fit()).
#include <mpi.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/ckpt_mpi.hpp"
#include "checkpoint/commit.hpp"
#include "checkpoint/h5_file.hpp"
#include "commands.hpp"
#ifdef TRIDENT_HAVE_CUDA
#include "cuda/cuda_bench_hw.hpp"
#endif
#include "grid/process_grid.hpp"
#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/blas.hpp"
#include "kernels/cpu/ops.hpp"
#include "plan/hardware.hpp"
#include "tensor/device.hpp"
#include "runtime/backend.hpp"
#include "util/error.hpp"

namespace trident {

void add_bench_hw_command(CLI::App& app, BenchHwOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "bench-hw", "Measure this machine (GEMM, memory, MPI links) and write a hardware file");
  cmd->add_option("--out", options.out, "Hardware TOML file to write")->required();
  cmd->add_option("--ranks", options.ranks,
                  "Devices (ranks) per node the file describes; 0: the ranks launched");
  cmd->add_option("--device", options.device,
                  "cpu, or cuda: the GPUs (the GPU module; a GPU per rank for the links)");
  cmd->add_option("--name", options.name, "Name written into the file");
  cmd->add_option("--storage-dir", options.storage_dir,
                  "Also measure the checkpoint write rate into this directory (storage.write_gbs)")
      ->check([](const std::string& dir) {
        return dir.empty() ? std::string("must name a directory") : std::string();
      });
}

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Seconds of one run of `f`, every rank running it at once (the contention training sees); the
// slowest rank's time counts.
template <class F>
double timed_once(F&& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now();
  f();
  double t = now() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

// Best seconds of `reps` timed_once runs of `f` after one warm-up.
template <class F>
double best_time(F&& f, int reps) {
  f();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) best = std::min(best, timed_once(f));
  return best;
}

// The GEMM sweeps run in kGemmRounds rounds of kGemmRepetitions timed repetitions each, the
// best of every size over all rounds kept: a VM's neighbours can slow the machine for seconds,
// and samples of a size spread over the whole measurement miss a slow spell that best-of-five
// back to back would sit inside (the tiny model's plan on the 2-core VM, docs/plan.md).
constexpr int kGemmRounds = 2, kGemmRepetitions = 2;

std::vector<MeasuredGemm> best_of_rounds(const std::vector<std::vector<MeasuredGemm>>& rounds) {
  std::vector<MeasuredGemm> best = rounds.front();
  for (const auto& round : rounds)
    for (size_t i = 0; i < best.size(); ++i)
      best[i].gflops = std::max(best[i].gflops, round[i].gflops);
  return best;
}

std::vector<MeasuredGemm> measure_sgemm(int threads) {
  cpu::set_num_threads(threads);
  std::vector<MeasuredGemm> points;
  for (int n : {32, 64, 128, 256, 384, 512, 768, 1024, 1536}) {
    std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
    const double flops = 2.0 * n * static_cast<double>(n) * n;
    // Enough repetitions for ~50 ms per timing.
    const int inner = std::max(1, static_cast<int>(2e8 / flops));
    const double t = best_time(
        [&] {
          for (int i = 0; i < inner; ++i)
            cpu::gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                             c.data(), n);
        },
        kGemmRepetitions);
    points.push_back({static_cast<double>(n), flops * inner / t / 1e9});
  }
  return points;
}

// The bf16 GEMM's best GFLOP/s on the same cubes' larger half, operands in bf16 bits (the
// packed weights' form), through oneDNN's matmul: train.cpu_bf16_gemm = "auto"'s engine on a
// core where it outruns the fp32 GEMM (bf16_engine_everywhere), so the hardware file's bf16
// peak is what such a run multiplies at.
double measure_bf16_gemm(int threads) {
  cpu::set_num_threads(threads);
  double best = 0.0;
  for (int n : {512, 768, 1024, 1536}) {
    std::vector<uint16_t> a(static_cast<size_t>(n) * n, 0x3f00), b(a.size(), 0x3e80);
    std::vector<float> c(a.size());
    const double flops = 2.0 * n * static_cast<double>(n) * n;
    const int inner = std::max(1, static_cast<int>(4e8 / flops));
    const double t = best_time(
        [&] {
          for (int i = 0; i < inner; ++i)
            cpu::gemm_bf16_rounded(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                                   c.data(), n);
        },
        kGemmRepetitions);
    best = std::max(best, flops * inner / t / 1e9);
  }
  return best;
}

// Whether train.cpu_bf16_gemm = "auto" runs oneDNN's bf16 engine on every rank's core
// (cpu::bf16_gemm_outpaces_fp32), decided once: every rank times the engine together
// (best_time's barriers), so all measure it, or none.
bool bf16_engine_everywhere() {
  int outpaces = cpu::bf16_gemm_outpaces_fp32() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &outpaces, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return outpaces == 1;
}

// The hardware file's line on its bf16 peak: where it comes from.
std::string bf16_peak_text(double bf16_gflops, double fp32_gflops) {
  if (bf16_gflops <= 0.0)
    return "bf16 = fp32: train.precision = \"bf16\" multiplies its bf16 values with fp32 FMAs "
           "here (train.cpu_bf16_gemm = \"auto\" runs \"fma\" on this core).";
  char line[320];
  std::snprintf(line, sizeof line,
                "bf16 = oneDNN's bf16 matmul on the cubes n = 512-1536, best %.1f GFLOP/s "
                "(%.2fx the sgemm), its products' and attention's own curves "
                "gemm_efficiency_shapes_bf16 and attention_efficiency_bf16: "
                "train.cpu_bf16_gemm = \"auto\" runs \"onednn\" here.",
                bf16_gflops, bf16_gflops / fp32_gflops);
  return line;
}

// The efficiency curve's points: the GEMMs of a linear layer's training step as the trainer
// calls them (kernels/cpu/linear.cpp: forward inp W^T, weight gradient dout^T inp, input
// gradient dout W), at each volume s^3 over three layers of tokens x in x out: s x s x s, and
// the MLP's a x a x 4a and a x 4a x a (a^3 4 = s^3). The point is their FLOPs over their time.
// Cubes alone overrate the threads: a step's GEMMs are thin (out 128 wide, 4x longer k) and
// transposed, and two threads split them worse (2 threads at 256 x 128 x 512: 1.45x one thread,
// at 256^3: 1.8x, on the Xeon of docs/plan.md).
std::vector<MeasuredGemm> measure_linear_training(int threads) {
  cpu::set_num_threads(threads);
  std::vector<MeasuredGemm> points;
  for (int s : {32, 64, 128, 256, 384, 512, 768, 1024, 1536}) {
    const int a = std::max(8, static_cast<int>(std::lround(s / std::cbrt(4.0) / 8.0)) * 8);
    const int layers[3][3] = {{s, s, s}, {a, a, 4 * a}, {a, 4 * a, a}};  // tokens, in, out
    double flops = 0, seconds = 0;
    for (const auto& l : layers) {
      const int M = l[0], C = l[1], OC = l[2];
      std::vector<float> inp(static_cast<size_t>(M) * C, 0.5f);
      std::vector<float> w(static_cast<size_t>(OC) * C, 0.25f), dw(w.size());
      std::vector<float> out(static_cast<size_t>(M) * OC), dinp(inp.size());
      const double f = 3.0 * 2.0 * M * static_cast<double>(C) * OC;
      const int inner = std::max(1, static_cast<int>(1e8 / f));  // ~20 ms per timing
      seconds += best_time(
                     [&] {
                       for (int i = 0; i < inner; ++i) {
                         cpu::gemm<float>(false, true, M, OC, C, 1.0f, inp.data(), C, w.data(),
                                          C, 0.0f, out.data(), OC);
                         cpu::gemm<float>(true, false, OC, C, M, 1.0f, out.data(), OC,
                                          inp.data(), C, 1.0f, dw.data(), C);
                         cpu::gemm<float>(false, false, M, C, OC, 1.0f, out.data(), OC, w.data(),
                                          C, 0.0f, dinp.data(), C);
                       }
                     },
                     kGemmRepetitions) /
                 inner;
      flops += f;
    }
    points.push_back({static_cast<double>(s), flops / seconds / 1e9});
  }
  return points;
}

// The shape grid of the GEMM efficiency (DeviceSpec::gemm_efficiency_shapes): a linear layer's
// training step through the trainer's own calls at rows x in x out over a grid of sizes,
// GFLOP/s of the three GEMMs together. The volume curve above ranks shapes by their FLOPs
// alone; a step's products are as thin as 256 rows x 128 wide, which two threads split worse
// than a cube of the same volume (docs/plan.md, "Third wave"). make_step(M, C, OC) returns
// the step: a callable that owns its buffers and runs the forward and both gradients once.
template <class MakeStep>
std::vector<std::array<double, 4>> measure_shape_grid(int threads, MakeStep make_step) {
  cpu::set_num_threads(threads);
  constexpr int kSizes[] = {64, 256, 1024, 4096};
  std::vector<std::array<double, 4>> points;
  for (int M : kSizes)
    for (int C : kSizes)
      for (int OC : kSizes) {
        auto step = make_step(M, C, OC);
        const double f = 3.0 * 2.0 * M * static_cast<double>(C) * OC;
        const int inner = std::max(1, static_cast<int>(2e7 / f));  // >= ~5 ms per timing
        const double seconds = best_time(
                                   [&] {
                                     for (int i = 0; i < inner; ++i) step();
                                   },
                                   kGemmRepetitions) /
                               inner;
        points.push_back({static_cast<double>(M), static_cast<double>(C),
                          static_cast<double>(OC), f / seconds / 1e9});
      }
  return points;
}

// fp32: cpu::linear_forward with its column split, cpu::linear_backward for both gradients; no
// bias (its sums are memory-bound work, which the plan prices apart).
std::vector<std::array<double, 4>> measure_linear_shapes(int threads) {
  return measure_shape_grid(threads, [](int M, int C, int OC) {
    return [inp = std::vector<float>(static_cast<size_t>(M) * C, 0.5f),
            dinp = std::vector<float>(static_cast<size_t>(M) * C),
            w = std::vector<float>(static_cast<size_t>(OC) * C, 0.25f),
            dw = std::vector<float>(static_cast<size_t>(OC) * C),
            out = std::vector<float>(static_cast<size_t>(M) * OC), M, C, OC]() mutable {
      cpu::linear_forward<float>(out.data(), inp.data(), w.data(), nullptr, M, C, OC);
      cpu::linear_backward<float>(dinp.data(), dw.data(), nullptr, out.data(), inp.data(),
                                  w.data(), M, C, OC);
    };
  });
}

// bf16 through the CPU's oneDNN engine as train.precision = "bf16" calls it
// (model/cpu_bf16_kernels.hpp): the forward on the packed weights' bits with the input
// converted at the call (cpu::gemm_bf16_b_rounded), both gradients from one conversion of dY
// (cpu::linear_backward_bf16). Its output roundings are memory-bound passes, priced apart.
std::vector<std::array<double, 4>> measure_linear_shapes_bf16(int threads) {
  return measure_shape_grid(threads, [](int M, int C, int OC) {
    return [inp = std::vector<float>(static_cast<size_t>(M) * C, 0.5f),
            dinp = std::vector<float>(static_cast<size_t>(M) * C),
            w = std::vector<float>(static_cast<size_t>(OC) * C, 0.25f),
            w_bits = std::vector<uint16_t>(static_cast<size_t>(OC) * C, 0x3e80),  // 0.25
            dw = std::vector<float>(static_cast<size_t>(OC) * C),
            out = std::vector<float>(static_cast<size_t>(M) * OC), M, C, OC]() mutable {
      cpu::gemm_bf16_b_rounded(false, true, M, OC, C, 1.0f, inp.data(), C, w_bits.data(), C,
                               0.0f, out.data(), OC);
      cpu::linear_backward_bf16(dinp.data(), dw.data(), out.data(), nullptr, inp.data(),
                                w.data(), w_bits.data(), M, C, OC);
    };
  });
}

// Bytes per second of a streaming copy of 256 MiB (read + write counted), per rank, all ranks
// at once.
double measure_copy_bandwidth() {
  const size_t n = (size_t{256} << 20) / sizeof(float) / 2;
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  const double t = best_time([&] { std::memcpy(b.data(), a.data(), n * sizeof(float)); }, 5);
  return 2.0 * static_cast<double>(n * sizeof(float)) / t;
}

// Bytes per second (read + write counted) at which the trainer's own elementwise kernels stream,
// per rank with the rank's threads, all ranks at once: its GELU forward and backward over 16 Mi
// floats (8 and 12 bytes an element). The plan prices the non-GEMM work by the activation bytes
// it moves (docs/plan.md); a CPU core running such a kernel, with a few dozen operations an
// element, streams at a fraction of what a memcpy moves (about half, on one core of this
// project's machines), and at twice the rate with two threads where a copy gains little. (A
// GPU's, measured by the GPU module the same way, reached 0.71 of an H200's datasheet
// bandwidth: the datasheet files' device.memory_efficiency.)
double measure_kernel_bandwidth(int threads) {
  cpu::set_num_threads(threads);
  const int64_t n = int64_t{16} << 20;
  std::vector<float> x(static_cast<size_t>(n)), y(x.size()), dy(x.size(), 1.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97) / 24.0f - 2.0f;
  const double forward = best_time([&] { cpu::gelu_forward(y.data(), x.data(), n); }, 5);
  const double backward =
      best_time([&] { cpu::gelu_backward(y.data(), x.data(), dy.data(), n); }, 5);
  return 20.0 * static_cast<double>(n) / (forward + backward);
}

// The trainer's optimizer pass (tensor/device.hpp: optimizer_pass) over n parameters, the
// rank's threads, all ranks at once: bytes per second, the bytes counted as the plan counts them
// (kOptimizerBytesPerParam). Over sizes, as a small model's state stays in cache.
std::vector<MeasuredOptimizer> measure_optimizer(int threads) {
  cpu::set_num_threads(threads);
  const std::unique_ptr<Device> device = make_cpu_device();
  std::vector<MeasuredOptimizer> points;
  for (int64_t n : {int64_t{1} << 18, int64_t{1} << 20, int64_t{1} << 22, int64_t{1} << 24,
                    int64_t{1} << 26}) {
    std::vector<float> w(static_cast<size_t>(n), 0.02f), g(w.size()), m(w.size()), v(w.size());
    AdamWStep step;
    step.lr = 1e-4f;
    step.weight_decay = 0.1f;
    const int inner = static_cast<int>(std::max<int64_t>(1, (int64_t{1} << 24) / n));
    double norms = 0;  // kept, so that the square sums are not optimised away
    const double t = best_time(
        [&] {
          for (int i = 0; i < inner; ++i)
            norms += optimizer_pass(*device, w.data(), g.data(), m.data(), v.data(), n, step);
        },
        3);
    if (norms != 0.0) throw Error("bench-hw: the zeroed gradients' square sum is not 0");
    points.push_back({n, kOptimizerBytesPerParam * static_cast<double>(n) * inner / t});
  }
  return points;
}

std::string gbs_text(double bytes_per_s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", bytes_per_s / 1e9);
  return text;
}

// The trainer's fused attention, forward and backward, over (T, head size) pairs with the rank's
// threads, all ranks at once: GFLOP/s counted as the plan counts attention (the full T x T:
// 4*T*T*HS per head forward, three times that for training), so the causal half the kernel
// skips shows as a rate above the GEMMs'. size = cbrt(T*T*HS). Heads and batch are chosen for
// ~2 GFLOP of counted work a timing. bf16_engine: the CPU's bf16 oneDNN engine's attention
// (cpu::attention_forward_bf16 / backward_bf16) instead; the inputs are bf16 values either way.
// The forward and the backward are also timed alone: the forward's share of their time (what
// recomputation reruns).
std::vector<MeasuredAttention> measure_attention(int threads, bool bf16_engine = false) {
  cpu::set_num_threads(threads);
  std::vector<MeasuredAttention> points;
  const int shapes[][2] = {{128, 16}, {256, 32}, {512, 64}, {1024, 64}, {2048, 128}};
  for (const auto& shape : shapes) {
    const int64_t T = shape[0], HS = shape[1];
    const double per_head = 12.0 * static_cast<double>(T * T * HS);
    // At least two (batch, head) tasks a thread: the kernel's parallel loops run over them.
    const int64_t heads =
        std::max<int64_t>(2 * threads, static_cast<int64_t>(2e9 / per_head));
    const int64_t NH = std::min<int64_t>(16, heads), B = (heads + NH - 1) / NH;
    const size_t rows = static_cast<size_t>(B * T);
    std::vector<float> qkv(rows * static_cast<size_t>(3 * NH * HS)), dqkv(qkv.size());
    std::vector<float> out(rows * static_cast<size_t>(NH * HS)), dout(out.size(), 0.0078125f);
    std::vector<float> lse(static_cast<size_t>(B * NH * T));
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i % 61) / 64.0f - 0.5f;
    auto forward = [&] {
      if (bf16_engine)
        cpu::attention_forward_bf16(out.data(), lse.data(), qkv.data(), B, T, NH, NH, HS,
                                    nullptr);
      else
        cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NH, HS);
    };
    auto backward = [&] {
      if (bf16_engine)
        cpu::attention_backward_bf16(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                     lse.data(), B, T, NH, NH, HS, nullptr);
      else
        cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B,
                                T, NH, NH, HS);
    };
    const double t = best_time(
        [&] {
          forward();
          backward();
        },
        3);
    // The share from the forward's and the backward's best times, each timed alone in the same
    // rounds, turn about: a slow spell of a shared machine then slows both, not one of them.
    // (The pair above warmed both up.)
    double best_forward = 1e30, best_backward = 1e30;
    for (int round = 0; round < 3; ++round) {
      best_forward = std::min(best_forward, timed_once(forward));
      best_backward = std::min(best_backward, timed_once(backward));
    }
    points.push_back({T, HS, per_head * static_cast<double>(B * NH) / t / 1e9,
                      best_forward / (best_forward + best_backward)});
  }
  return points;
}

// A link's figures from (bytes, best seconds) points. On a shared machine a timing is only
// ever slowed down by others, so the best points are the link's: the bandwidth is the best
// bytes per second of the large messages (>= 1 MiB), the latency the smallest time left
// over once the bytes at that bandwidth are taken off.
struct LinkFit {
  double seconds_per_byte = 0, latency = 0;
};

LinkFit fit(const std::vector<double>& bytes, const std::vector<double>& seconds) {
  LinkFit f;
  f.seconds_per_byte = 1e30;
  for (size_t i = 0; i < bytes.size(); ++i)
    if (bytes[i] >= 1024.0 * 1024.0)
      f.seconds_per_byte = std::min(f.seconds_per_byte, seconds[i] / bytes[i]);
  f.latency = 1e30;
  for (size_t i = 0; i < bytes.size(); ++i)
    f.latency = std::min(f.latency, seconds[i] - bytes[i] * f.seconds_per_byte);
  f.latency = std::max(0.0, f.latency);
  return f;
}

std::vector<double> message_sizes() {
  std::vector<double> s;
  for (double b = 64; b <= 16.0 * 1024 * 1024; b *= 4) s.push_back(b);
  return s;
}

// Seconds per call of each collective at each size (the slowest rank's best).
LinkFit measure_collective(Collective kind, std::vector<std::string>& table) {
  const int n = world_size(), rank = world_rank();
  std::vector<double> xs, ys;
  for (double bytes : message_sizes()) {
    const size_t count = static_cast<size_t>(bytes) / sizeof(float) / n * n;
    std::vector<float> send(count, 1.0f), recv(count, 0.0f);
    const int reps = bytes < 1e6 ? 30 : 10;
    auto op = [&] {
      switch (kind) {
        case Collective::AllReduce:
          MPI_Allreduce(send.data(), recv.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD);
          break;
        case Collective::AllGather:  // every rank contributes count / n: the result is count
          MPI_Allgather(send.data(), static_cast<int>(count / n), MPI_FLOAT, recv.data(),
                        static_cast<int>(count / n), MPI_FLOAT, MPI_COMM_WORLD);
          break;
        case Collective::ReduceScatter:
          MPI_Reduce_scatter_block(send.data(), recv.data(), static_cast<int>(count / n),
                                   MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          break;
        case Collective::SendRecv:  // ranks 0 and 1 exchange (both directions at once)
          if (rank < 2)
            MPI_Sendrecv(send.data(), static_cast<int>(count), MPI_FLOAT, 1 - rank, 7,
                         recv.data(), static_cast<int>(count), MPI_FLOAT, 1 - rank, 7,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          break;
      }
    };
    const double t = best_time(op, reps);
    xs.push_back(static_cast<double>(count * sizeof(float)));
    ys.push_back(t);
    char line[120];
    std::snprintf(line, sizeof line, "  %-14s %10.0f bytes %10.1f us",
                  kind == Collective::AllReduce       ? "all-reduce"
                  : kind == Collective::AllGather     ? "all-gather"
                  : kind == Collective::ReduceScatter ? "reduce-scatter"
                                                      : "send/recv",
                  xs.back(), t * 1e6);
    table.push_back(line);
  }
  return fit(xs, ys);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// The value of `wanted` ("MemTotal:", "VmRSS:", in KiB) in a /proc file of "Key: value kB" lines,
// in GiB; 0 when the file or the key is missing.
double proc_gib(const char* path, const std::string& wanted) {
  std::ifstream in(path);
  std::string key;
  double kib = 0;
  while (in >> key) {
    if (key == wanted) {
      in >> kib;
      break;
    }
    std::getline(in, key);
  }
  return kib / (1024.0 * 1024.0);
}

double memory_total_gib() { return proc_gib("/proc/meminfo", "MemTotal:"); }
double resident_gib() { return proc_gib("/proc/self/status", "VmRSS:"); }

// The links from measured fits: send/recv's bandwidth and latency, and each collective's
// slope against the ring's (n-1)/n bytes at the send/recv bandwidth, the factor `trident plan`
// multiplies by.
void set_measured_links(HardwareSpec& hw, int ranks, const LinkFit& p2p, const LinkFit& ar,
                        const LinkFit& ag, const LinkFit& rs) {
  hw.intra_node.bandwidth_gbs = 1.0 / p2p.seconds_per_byte / 1e9;
  hw.intra_node.efficiency = 1.0;
  hw.intra_node.latency_us = p2p.latency * 1e6;
  const double share = static_cast<double>(ranks - 1) / ranks;
  hw.collectives.send_recv = 1.0;
  hw.collectives.all_reduce = ar.seconds_per_byte / p2p.seconds_per_byte / share;
  hw.collectives.all_gather = ag.seconds_per_byte / p2p.seconds_per_byte / share;
  hw.collectives.reduce_scatter = rs.seconds_per_byte / p2p.seconds_per_byte / share;
}

// One rank, nothing to measure: half of `bytes_per_s` (a copy reads and writes) and 1 us stand
// in; the file says so.
void set_stand_in_links(HardwareSpec& hw, double bytes_per_s) {
  hw.intra_node.bandwidth_gbs = bytes_per_s / 2.0 / 1e9;
  hw.intra_node.efficiency = 1.0;
  hw.intra_node.latency_us = 1.0;
}

// "" when `path` can be written, checked before minutes of measuring: an existing regular file
// is opened for writing (not truncated), a new one created and removed again.
std::string output_file_problem(const std::string& path) {
  const std::string what = "bench-hw --out " + path;
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) return what + ": not a regular file";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) return what + ": cannot write: " + std::strerror(errno);
  ::close(fd);
  if (!exists) ::unlink(path.c_str());
  return "";
}

// Bytes each rank writes when --storage-dir measures the storage: a few seconds' worth on a
// parallel file system's client, large enough to pass the writes' start-up costs.
constexpr int64_t kStorageBytesPerRank = int64_t{256} << 20;

// --storage-dir: what a checkpoint's write costs there, through the checkpoint's own writer
// (CheckpointWriter: parallel HDF5 over MPI-IO, the checksums, the agreement at close) and a
// sync of the file by rank 0, as a checkpoint's commit does. Two files, each the best of two
// writes of the slowest rank: one float32 dataset of which every rank writes
// kStorageBytesPerRank, for the rate (all ranks' bytes per second); then kStorageDatasets
// datasets of 1 Ki elements a rank, for the cost of a dataset of its own (creation, metadata,
// checksum agreement): a checkpoint writes three for each tensor. The files are removed.
// Collective; a failed write is one agreed error.
struct StorageWrite {
  double bytes_per_s = 0.0;
  double dataset_seconds = 0.0;
};
constexpr int kStorageDatasets = 64;

double timed_checkpoint_write(const std::string& dir, int datasets, int64_t per_rank) {
  const std::string path = dir + "/trident-bench-hw-storage.tmp";
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  std::vector<float> block(static_cast<size_t>(per_rank));
  for (int64_t i = 0; i < per_rank; ++i)
    block[static_cast<size_t>(i)] = static_cast<float>(i % 977 + rank);
  double best = 1e300;
  for (int round = 0; round < 2; ++round) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now();
    std::string problem;
    try {
      WriterOptions options;
      options.overwrite = true;
      CheckpointWriter writer(path, MPI_COMM_WORLD, options);
      for (int d = 0; d < datasets; ++d)
        writer.write_tensor("/bench/block_" + std::to_string(d),
                            {static_cast<int64_t>(ranks) * per_rank},
                            {Run{0, static_cast<int64_t>(rank) * per_rank, per_rank}}, block);
      writer.close();
      if (rank == 0) fsync_path(path, "storage test file");  // as a checkpoint's commit does
    } catch (const Error& e) {
      problem = e.what();  // the writer's errors are thrown on every rank alike
    }
    if (!problem.empty()) problem = "bench-hw --storage-dir " + dir + ": " + problem;
    ckpt::agree_or_throw(MPI_COMM_WORLD, problem);
    double seconds = now() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) ::unlink(path.c_str());
    best = std::min(best, seconds);
  }
  return best;
}

StorageWrite measure_storage_write(const std::string& dir) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  StorageWrite r;
  const int64_t n = kStorageBytesPerRank / static_cast<int64_t>(sizeof(float));
  r.bytes_per_s = static_cast<double>(kStorageBytesPerRank) * ranks /
                  timed_checkpoint_write(dir, 1, n);
  r.dataset_seconds = timed_checkpoint_write(dir, kStorageDatasets, 1024) / kStorageDatasets;
  return r;
}

// Why --storage-dir cannot be written to ("" when it can), checked before anything is measured.
std::string storage_dir_problem(const std::string& dir) {
  if (dir.empty()) return "";
  const std::string what = "bench-hw --storage-dir " + dir;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return what + ": " + std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return what + ": not a directory";
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return what + ": cannot write: " + std::strerror(errno);
  return "";
}

// --storage-dir's result into the file and its comment.
void set_storage(HardwareSpec& hw, std::vector<std::string>& comment,
                 const std::string& dir, const StorageWrite& w, int ranks) {
  if (dir.empty()) return;
  hw.storage_write_gbs = w.bytes_per_s / 1e9;
  hw.storage_dataset_ms = w.dataset_seconds * 1e3;
  comment.push_back("storage: " + std::to_string(ranks) + " rank(s) writing through the "
                    "checkpoint's writer (parallel HDF5, checksums, then a sync) into " + dir +
                    ", best of 2: write_gbs = one dataset of " +
                    std::to_string(kStorageBytesPerRank >> 20) + " MiB a rank; dataset_ms = " +
                    std::to_string(kStorageDatasets) + " datasets of 1 Ki floats a rank, a "
                    "dataset's own cost");
}

// Rank 0: the file, read back first (what it writes, it reads), then printed.
void write_hardware_file(const HardwareSpec& hw, const std::vector<std::string>& comment,
                         const std::string& path) {
  const std::string text = hardware_to_toml(hw, comment);
  parse_hardware(text, path);
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) throw Error("bench-hw: cannot write " + path);
  std::printf("%s", text.c_str());
  std::printf("wrote %s\n", path.c_str());
  std::fflush(stdout);
}

std::string fit_line(const char* what, const LinkFit& f) {
  char line[120];
  std::snprintf(line, sizeof line, "  %-14s %8.1f GB/s  %7.1f us latency", what,
                1.0 / f.seconds_per_byte / 1e9, f.latency * 1e6);
  return line;
}

// A shape grid of the file (device.gemm_efficiency_shapes and _bf16) from measured [rows, in,
// out, GFLOP/s] over the peak.
std::vector<std::array<double, 4>> shape_grid(double peak_gflops,
                                              const std::vector<std::array<double, 4>>& measured) {
  std::vector<std::array<double, 4>> grid;
  for (const auto& s : measured)
    grid.push_back({s[0], s[1], s[2], measured_efficiency(s[3], peak_gflops)});
  return grid;
}

double best_gflops(const std::vector<MeasuredGemm>& points) {
  double best = 0;
  for (const MeasuredGemm& p : points) best = std::max(best, p.gflops);
  return best;
}

// The file's comment lines for the measured curves (set_measured_curves), rates shown in
// `unit` (GFLOP/s on a CPU, TFLOP/s on a GPU), on either device.
void append_curve_lines(std::vector<std::string>& comment,
                        const std::vector<MeasuredGemm>& training,
                        const std::vector<MeasuredAttention>& attention,
                        const std::vector<MeasuredOptimizer>& optimizer, bool tera) {
  const char* unit = tera ? "TFLOP/s" : "GFLOP/s";
  const double scale = tera ? 1e-3 : 1.0;
  char line[100];
  comment.push_back("linear layers' training GEMMs (volume s^3: s x s x s, a x a x 4a, a x 4a x a):");
  for (const MeasuredGemm& p : training) {
    std::snprintf(line, sizeof line, "  s = %5.0f  %8.2f %s", p.size, p.gflops * scale, unit);
    comment.push_back(line);
  }
  comment.push_back(
      "attention (fused, forward + backward; FLOPs as the plan counts them; the forward's share "
      "of the time):");
  for (const MeasuredAttention& p : attention) {
    std::snprintf(line, sizeof line, "  T = %5lld, head size %4lld  %8.2f %s, forward %.2f",
                  static_cast<long long>(p.T), static_cast<long long>(p.head_size),
                  p.gflops * scale, unit, p.forward_share);
    comment.push_back(line);
  }
  comment.push_back("optimizer pass (gradient norm, AdamW, zeroing; 36 bytes a parameter):");
  for (const MeasuredOptimizer& p : optimizer) {
    std::snprintf(line, sizeof line, "  %9lld parameters  %7.1f GB/s",
                  static_cast<long long>(p.parameters), p.bytes_per_s / 1e9);
    comment.push_back(line);
  }
}

#ifdef TRIDENT_HAVE_CUDA
// --device cuda: the GPU module measures (cuda/cuda_bench_hw.hpp); the file is assembled here
// as the CPU's is: peaks = the best cube per precision, the curves (set_measured_curves) =
// the bf16 training GEMMs' and attention's over the bf16 peak, and the optimizer pass's rates.
void run_gpu_bench_hw(const BenchHwOptions& options) {
  auto measure = reinterpret_cast<CudaModuleBenchFn>(
      cuda_module_function("bench-hw --device cuda", kCudaModuleBenchSymbol));
  const StorageWrite storage =
      options.storage_dir.empty() ? StorageWrite{} : measure_storage_write(options.storage_dir);
  GpuBenchResult r;
  measure(MPI_COMM_WORLD, r);
  const int ranks = world_size();
  if (world_rank() != 0) return;
  HardwareSpec hw;
  hw.name = options.name.empty() ? r.device + " (measured by trident bench-hw)" : options.name;
  hw.devices_per_node = options.ranks > 0 ? options.ranks : ranks;
  hw.device.kind = "gpu";
  const double best16 = best_gflops(r.bf16);
  hw.device.peak_tflops_bf16 = best16 / 1e3;
  hw.device.peak_tflops_fp32 = best_gflops(r.fp32) / 1e3;
  set_measured_curves(hw.device, best16, r.training, r.attention, r.optimizer);
  hw.device.gemm_efficiency_shapes = shape_grid(best16, r.shapes);
  hw.device.memory_gib = r.memory_bytes / (1024.0 * 1024.0 * 1024.0);
  hw.device.reserved_gib = r.reserved_bytes / (1024.0 * 1024.0 * 1024.0);
  hw.device.memory_bandwidth_gbs = r.bandwidth / 1e9;
  hw.device.host_link_gbs = r.host_link / 1e9;
  std::vector<std::string> fits;
  if (!r.message_bytes.empty()) {
    const LinkFit p2p = fit(r.message_bytes, r.send_recv);
    const LinkFit ar = fit(r.message_bytes, r.all_reduce);
    const LinkFit ag = fit(r.message_bytes, r.all_gather);
    const LinkFit rs = fit(r.message_bytes, r.reduce_scatter);
    set_measured_links(hw, ranks, p2p, ar, ag, rs);
    fits = {fit_line("send/recv", p2p), fit_line("all-reduce", ar), fit_line("all-gather", ag),
            fit_line("reduce-scatter", rs)};
  } else {
    // As the CPU's one rank; a plan over more than one GPU needs the links measured (or a
    // datasheet file).
    set_stand_in_links(hw, r.bandwidth);
    r.links_note += "; intra_node is half the device bandwidth and 1 us";
  }
  hw.inter_node = hw.intra_node;
  std::vector<std::string> comment = {
      "Written by `trident bench-hw --device cuda` (docs/plan.md) on " + r.device + ", " +
          std::to_string(ranks) + " rank(s).",
      "Peaks = the best trainer GEMM (cuBLASLt, fp32 accumulation; fp32 without TF32) on cubes",
      "per GPU, the slowest rank's; efficiency at size s = a linear layer's three bf16 training",
      "GEMMs (s^3 and the MLP's thin shapes of that volume) over the bf16 best; attention: the",
      "bf16 fused kernel's forward + backward over the bf16 best.",
      "Memory: the GPU's (cudaMemGetInfo); reserved = what the context and cuBLAS took;",
      "bandwidth: the trainer's bf16 GELU forward + backward over 256 Mi elements (bytes read +",
      "written).",
      "host_link_gbs: the trainer's device-to-host copy of 256 MiB into pinned memory (a",
      "checkpoint's staging copy), the slowest rank's best of three.",
      r.links_note,
      "GEMM (n x n x n): bf16, fp32 TFLOP/s"};
  for (size_t i = 0; i < r.bf16.size(); ++i) {
    char line[80];
    std::snprintf(line, sizeof line, "  n = %5.0f  %8.1f  %8.1f", r.bf16[i].size,
                  r.bf16[i].gflops / 1e3, i < r.fp32.size() ? r.fp32[i].gflops / 1e3 : 0.0);
    comment.push_back(line);
  }
  append_curve_lines(comment, r.training, r.attention, r.optimizer, true);
  if (!fits.empty()) comment.push_back("NCCL fits (best points; inter_node copies intra_node):");
  comment.insert(comment.end(), fits.begin(), fits.end());
  set_storage(hw, comment, options.storage_dir, storage, ranks);
  write_hardware_file(hw, comment, options.out);
}
#endif

}  // namespace

void run_bench_hw(const BenchHwOptions& options) {
  if (options.device != "cpu" && options.device != "cuda" && options.device != "gpu")
    throw Error("bench-hw --device \"" + options.device + "\" must be cpu or cuda");
  if (options.ranks < 0) throw Error("bench-hw --ranks must be >= 0");
  ckpt::agree_or_throw(MPI_COMM_WORLD, world_rank() == 0 ? output_file_problem(options.out) : "");
  ckpt::agree_or_throw(MPI_COMM_WORLD, storage_dir_problem(options.storage_dir));
  if (options.device != "cpu") {
#ifdef TRIDENT_HAVE_CUDA
    run_gpu_bench_hw(options);
    return;
#else
    throw Error("bench-hw --device " + options.device + ": this trident was built without CUDA "
                "(nvcc was not found when it was configured; see docs/gpu.md)");
#endif
  }
  const int ranks = world_size(), rank = world_rank();
  // The ranks of this node as one data-parallel grid: each gets the threads train.threads = 0
  // gives it (OMP_NUM_THREADS, else its share of the machine's cores, grid/core_share.hpp).
  const ProcessGrid grid(MPI_COMM_WORLD, GridShape{1, 1, ranks}, 0, ModelConfig{});
  const CoreShare& share = grid.core_share();
  const RankThreads chosen = rank_threads(0, share);
  const int threads = chosen.threads;
  // First: a storage it cannot write to fails in seconds, not after the minute of the rest.
  const StorageWrite storage =
      options.storage_dir.empty() ? StorageWrite{} : measure_storage_write(options.storage_dir);
  std::vector<std::string> notes;
  std::vector<std::vector<MeasuredGemm>> cube_rounds, training_rounds;
  std::vector<std::array<double, 4>> shapes;  // [rows, in, out, GFLOP/s], the best round's
  // oneDNN's bf16 matmul and its engine's grid, where auto runs it: in the same rounds.
  const bool bf16_engine = bf16_engine_everywhere();
  double bf16_best = 0.0;  // 0: the FMA engine's, fp32's rate
  std::vector<std::array<double, 4>> bf16_shapes;
  // Each grid point's best rate over the rounds.
  auto keep_best = [](std::vector<std::array<double, 4>>& best,
                      const std::vector<std::array<double, 4>>& round) {
    if (best.empty()) best = round;
    for (size_t i = 0; i < best.size(); ++i) best[i][3] = std::max(best[i][3], round[i][3]);
  };
  for (int round = 0; round < kGemmRounds; ++round) {
    cube_rounds.push_back(measure_sgemm(threads));
    training_rounds.push_back(measure_linear_training(threads));
    keep_best(shapes, measure_linear_shapes(threads));
    if (bf16_engine) {
      bf16_best = std::max(bf16_best, measure_bf16_gemm(threads));
      keep_best(bf16_shapes, measure_linear_shapes_bf16(threads));
    }
  }
  const std::vector<MeasuredGemm> gemm = best_of_rounds(cube_rounds);
  const std::vector<MeasuredGemm> training = best_of_rounds(training_rounds);
  const double copy_bandwidth = measure_copy_bandwidth();
  const double kernel_bandwidth = measure_kernel_bandwidth(threads);
  const std::vector<MeasuredAttention> attention = measure_attention(threads);
  const std::vector<MeasuredOptimizer> optimizer = measure_optimizer(threads);

  HardwareSpec hw;
  hw.name = options.name.empty() ? cpu_model() + " (measured by trident bench-hw)" : options.name;
  hw.devices_per_node = options.ranks > 0 ? options.ranks : ranks;
  hw.device.kind = "cpu";
  const double best = best_gflops(gemm);
  // The peak is the best sgemm measured (a rank's cores at full load), not ISA width x clock:
  // the clock under an all-core AVX load is not knowable from /proc, the measured best is.
  hw.device.peak_tflops_fp32 = best / 1e3;
  // bf16: what train.cpu_bf16_gemm = "auto" multiplies at here: oneDNN's bf16 matmul where it
  // outruns the sgemm (AMX, or dot products ahead of the FMAs), else fp32 FMAs on bf16 values.
  hw.device.peak_tflops_bf16 = std::max(best, bf16_best) / 1e3;
  set_measured_curves(hw.device, best, training, attention, optimizer);
  hw.device.gemm_efficiency_shapes = shape_grid(best, shapes);
  // Where auto's bf16 engine is oneDNN's, its products' own grid (best of the rounds) and its
  // attention's curve over its peak, with its forward's shares.
  if (bf16_engine) {
    const double bf16_peak = hw.device.peak_tflops_bf16 * 1e3;
    hw.device.gemm_efficiency_shapes_bf16 = shape_grid(bf16_peak, bf16_shapes);
    const std::vector<MeasuredAttention> attention_bf16 =
        measure_attention(threads, /*bf16_engine=*/true);
    hw.device.attention_efficiency_bf16 = attention_curve(bf16_peak, attention_bf16);
    hw.device.attention_forward_share_bf16 = attention_share_curve(attention_bf16);
  }
  hw.device.memory_gib = memory_total_gib() / static_cast<double>(hw.devices_per_node);
  hw.device.reserved_gib = resident_gib();
  hw.device.memory_bandwidth_gbs = kernel_bandwidth / 1e9;

  std::vector<std::string> table;
  if (ranks >= 2) {
    const LinkFit p2p = measure_collective(Collective::SendRecv, table);
    const LinkFit ar = measure_collective(Collective::AllReduce, table);
    const LinkFit ag = measure_collective(Collective::AllGather, table);
    const LinkFit rs = measure_collective(Collective::ReduceScatter, table);
    set_measured_links(hw, ranks, p2p, ar, ag, rs);
    notes.push_back("links: MPI over " + std::to_string(ranks) +
                    " ranks of this node; inter_node copies intra_node (one node: not measured)");
  } else {
    // One rank: no peer to measure. Ranks of one node talk through shared memory, so a memcpy
    // stands in for the link; say so in the file.
    set_stand_in_links(hw, copy_bandwidth);
    notes.push_back("links: NOT measured (1 rank): intra_node is half the memory copy bandwidth "
                    "and 1 us; run under mpiexec -n 2 or more to measure them");
  }
  hw.inter_node = hw.intra_node;

  if (rank != 0) return;
  std::vector<std::string> comment = {
      "Written by `trident bench-hw` (docs/plan.md) on " + cpu_model() + ", " +
          std::to_string(ranks) + " rank(s) x " + std::to_string(threads) +
          " thread(s) (" + chosen.explain(share) + ").",
      "Peak = the best trainer sgemm (cubes) measured per rank (all ranks at once); efficiency at",
      "size s = a linear layer's three training GEMMs (s^3 and the MLP's thin shapes of that",
      "volume) over that best; gemm_efficiency_shapes: the same by rows x in x out (the",
      "trainer's linear_forward and linear_backward), which the plan uses in place of the",
      "volume curve.",
      bf16_peak_text(bf16_best, best),
      "\"fp8\" multiplies its quantised operands at the fp32 rate (no peak_tflops_fp8).",
      "Memory: MemTotal / devices_per_node; reserved = this process's resident size;",
      "bandwidth: the trainer's GELU forward + backward over 16 Mi floats (bytes read +",
      "written), the rank's threads, all ranks at once (a 256 MiB memcpy: " +
          gbs_text(copy_bandwidth) + " GB/s).",
      notes.front(),
      "sgemm (n x n x n):"};
  for (const MeasuredGemm& p : gemm) {
    char line[80];
    std::snprintf(line, sizeof line, "  n = %5.0f  %8.2f GFLOP/s", p.size, p.gflops);
    comment.push_back(line);
  }
  append_curve_lines(comment, training, attention, optimizer, false);
  if (!table.empty()) comment.push_back("MPI (slowest rank, best of repetitions):");
  comment.insert(comment.end(), table.begin(), table.end());
  set_storage(hw, comment, options.storage_dir, storage, ranks);
  write_hardware_file(hw, comment, options.out);
}

}  // namespace trident
