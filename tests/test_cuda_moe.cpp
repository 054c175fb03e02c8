// The CUDA mixture-of-experts kernels (kernels/cuda/moe.cu) against their CPU twins
// (kernels/cpu/moe.cpp), fp32, on random inputs: the router forward and backward, the
// load-balancing and z-losses, the dispatch plan (dropless and with a capacity that drops:
// slots, rows, offsets and loads exactly equal), the permutation and the weighted combine with
// their backwards, the row scatter, and the grouped expert GEMMs (an empty expert included).
// The kernel set's wrappers (cuda/cuda_kernels.hpp) are checked with the index arrays in host
// memory as well as on the device (expert parallelism hands them host arrays), and its
// accumulate_mean into a host accumulator (the block's statistics) as well as a device one.
// The error printed and checked is the max-norm relative error max|gpu - ref| / max|ref|
// (tolerance 1e-4 like test_cuda_kernels' fp32 path, 1e-5 where the GPU computes in double);
// each comparison prints one line "[ cuda ] <kernel> <tensor> ... rel=...", and counts the
// elements it compared (a comparison of nothing fails).
// Without a CUDA device every test is skipped with "no CUDA device: GPU tests skipped".
// The whole MoE model on the GPU against the CPU is GpuTrainer.MoeFp32MatchesTheCpu
// (tests/mpi/test_cuda_train_np2.cpp).
#include <gtest/gtest.h>

#ifndef TRIDENT_TEST_CUDA

TEST(CudaMoe, NotBuilt) { GTEST_SKIP() << "TRIDENT_CUDA is OFF: GPU tests not built"; }

#else

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_device.hpp"
#include "cuda/cuda_kernels.hpp"
#include "kernels/cpu/moe.hpp"
#include "kernels/cuda/ops.hpp"
#include "model/moe.hpp"  // kernels_have_moe

namespace {

namespace gpu = trident::cuda;
namespace cpu = trident::cpu;

#define REQUIRE_CUDA_DEVICE()                                                          \
  do {                                                                                 \
    if (!gpu::device_available()) GTEST_SKIP() << "no CUDA device: GPU tests skipped"; \
  } while (0)

constexpr double kTol = 1e-4;

// Device buffer of n elements of T (at least one allocated), uploaded from / downloaded to host.
template <typename T>
class DevBuf {
 public:
  explicit DevBuf(size_t n) : n_(n) {
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T)));
  }
  // Complete on return: a kernel on another (non-blocking) stream may read it at once.
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) {
    CUDA_CHECK(cudaMemcpy(p_, h.data(), sizeof(T) * h.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~DevBuf() { cudaFree(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  T* get() const { return p_; }
  std::vector<T> download(size_t n) const {
    std::vector<T> h(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h.data(), p_, sizeof(T) * n, cudaMemcpyDeviceToHost));
    return h;
  }
  std::vector<T> download() const { return download(n_); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

std::vector<float> random_vec(std::mt19937_64& rng, size_t n, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

void expect_close(const std::string& kernel, const std::string& tensor,
                  const std::vector<float>& got, const std::vector<float>& ref, double tol) {
  ASSERT_EQ(got.size(), ref.size()) << kernel << " " << tensor;
  ASSERT_GT(ref.size(), 0u) << kernel << " " << tensor << ": nothing compared";
  double max_abs = 0, max_ref = 0;
  size_t nonfinite = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) ++nonfinite;
    max_abs = std::max(max_abs, std::abs(static_cast<double>(got[i]) - ref[i]));
    max_ref = std::max(max_ref, std::abs(static_cast<double>(ref[i])));
  }
  const double rel = max_abs / std::max(max_ref, 1e-30);
  std::printf("[ cuda ] %-26s %-14s fp32  n=%zu max_abs=%.3e max_ref=%.3e rel=%.3e (tol %.0e)%s\n",
              kernel.c_str(), tensor.c_str(), ref.size(), max_abs, max_ref, rel, tol,
              (rel <= tol && nonfinite == 0) ? "" : "  <-- FAIL");
  EXPECT_EQ(nonfinite, 0u) << kernel << " " << tensor;
  EXPECT_LE(rel, tol) << kernel << " " << tensor;
}

template <typename I>
void expect_equal(const std::string& kernel, const std::string& tensor, const std::vector<I>& got,
                  const std::vector<I>& ref) {
  ASSERT_GT(ref.size(), 0u) << kernel << " " << tensor << ": nothing compared";
  size_t differ = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) differ += got[i] != ref[i];
  std::printf("[ cuda ] %-26s %-14s int   n=%zu differing=%zu\n", kernel.c_str(), tensor.c_str(),
              ref.size(), differ);
  EXPECT_EQ(got, ref) << kernel << " " << tensor;
}

// The shapes of every test: B sequences of T tokens, E experts, top-K, width C.
struct Shape {
  int64_t B = 3, T = 16, E = 8, K = 2, C = 40;
  int64_t N() const { return B * T; }
};

// Router logits favouring expert 0 (so a capacity drops assignments) with random rest.
std::vector<float> router_logits(std::mt19937_64& rng, const Shape& s) {
  std::vector<float> logits = random_vec(rng, static_cast<size_t>(s.N() * s.E), -2.f, 2.f);
  for (int64_t n = 0; n < s.N(); ++n) logits[n * s.E] += 1.5f;
  return logits;
}

// The CPU router's choice for these logits (the reference the later kernels start from).
struct Routing {
  std::vector<float> probs, weight;
  std::vector<int32_t> expert;
};
Routing cpu_route(const std::vector<float>& logits, const Shape& s) {
  Routing r;
  r.probs.resize(static_cast<size_t>(s.N() * s.E));
  r.weight.resize(static_cast<size_t>(s.N() * s.K));
  r.expert.resize(static_cast<size_t>(s.N() * s.K));
  cpu::moe_router_forward(r.probs.data(), r.expert.data(), r.weight.data(), logits.data(),
                          s.N(), s.E, s.K);
  return r;
}

struct Plan {
  std::vector<int64_t> slot, slot_token, offsets, load;
  int64_t rows = 0;
};
Plan cpu_plan(const std::vector<int32_t>& expert, const Shape& s, int64_t capacity) {
  Plan p;
  p.slot.resize(static_cast<size_t>(s.N() * s.K));
  p.slot_token.resize(static_cast<size_t>(s.N() * s.K));
  p.offsets.resize(static_cast<size_t>(s.E + 1));
  p.load.resize(static_cast<size_t>(s.E));
  p.rows = cpu::moe_dispatch_plan(p.slot.data(), p.slot_token.data(), p.offsets.data(),
                                  p.load.data(), expert.data(), s.B, s.T, s.E, s.K, capacity);
  p.slot_token.resize(static_cast<size_t>(p.rows));
  return p;
}

TEST(CudaMoe, RouterForwardBackward) {
  REQUIRE_CUDA_DEVICE();
  const Shape s;
  std::mt19937_64 rng(11);
  const std::vector<float> logits = router_logits(rng, s);
  const Routing ref = cpu_route(logits, s);
  DevBuf<float> d_logits(logits), d_probs(s.N() * s.E), d_weight(s.N() * s.K);
  DevBuf<int32_t> d_expert(s.N() * s.K);
  gpu::moe_router_forward(d_probs.get(), d_expert.get(), d_weight.get(), d_logits.get(), s.N(),
                          s.E, s.K);
  expect_close("moe_router_forward", "probs", d_probs.download(), ref.probs, 1e-5);
  expect_equal("moe_router_forward", "expert", d_expert.download(), ref.expert);
  expect_close("moe_router_forward", "weight", d_weight.download(), ref.weight, 1e-5);

  // Backward from the CPU's routing, with and without an extra probability gradient.
  const std::vector<float> dweight = random_vec(rng, static_cast<size_t>(s.N() * s.K));
  const std::vector<float> extra = random_vec(rng, static_cast<size_t>(s.N() * s.E));
  DevBuf<float> d_dweight(dweight), d_extra(extra), d_dlogits(s.N() * s.E);
  DevBuf<float> d_rprobs(ref.probs), d_rweight(ref.weight);
  DevBuf<int32_t> d_rexpert(ref.expert);
  for (const bool with_extra : {true, false}) {
    std::vector<float> dlogits(static_cast<size_t>(s.N() * s.E));
    cpu::moe_router_backward(dlogits.data(), dweight.data(), with_extra ? extra.data() : nullptr,
                             ref.probs.data(), ref.expert.data(), ref.weight.data(), s.N(), s.E,
                             s.K);
    gpu::moe_router_backward(d_dlogits.get(), d_dweight.get(),
                             with_extra ? d_extra.get() : nullptr, d_rprobs.get(),
                             d_rexpert.get(), d_rweight.get(), s.N(), s.E, s.K);
    expect_close("moe_router_backward", with_extra ? "dlogits" : "dlogits(no extra)",
                 d_dlogits.download(), dlogits, 1e-5);
  }
}

TEST(CudaMoe, AuxAndZLosses) {
  REQUIRE_CUDA_DEVICE();
  const Shape s;
  std::mt19937_64 rng(12);
  const std::vector<float> logits = router_logits(rng, s);
  const Routing r = cpu_route(logits, s);
  DevBuf<float> d_logits(logits), d_probs(r.probs);
  DevBuf<int32_t> d_expert(r.expert);

  std::vector<float> aux(static_cast<size_t>(s.B)), z(static_cast<size_t>(s.B));
  cpu::moe_aux_loss_forward(aux.data(), r.probs.data(), r.expert.data(), s.B, s.T, s.E, s.K);
  cpu::moe_z_loss_forward(z.data(), logits.data(), s.B, s.T, s.E);
  DevBuf<float> d_aux(s.B), d_z(s.B);
  gpu::moe_aux_loss_forward(d_aux.get(), d_probs.get(), d_expert.get(), s.B, s.T, s.E, s.K);
  gpu::moe_z_loss_forward(d_z.get(), d_logits.get(), s.B, s.T, s.E);
  expect_close("moe_aux_loss_forward", "aux", d_aux.download(), aux, 1e-5);
  expect_close("moe_z_loss_forward", "z", d_z.download(), z, 1e-5);

  // Backwards accumulate (+=) onto random gradients.
  const std::vector<float> daux = random_vec(rng, static_cast<size_t>(s.B), 0.5f, 2.f);
  std::vector<float> dprobs = random_vec(rng, static_cast<size_t>(s.N() * s.E));
  std::vector<float> dlogits = random_vec(rng, static_cast<size_t>(s.N() * s.E));
  DevBuf<float> d_daux(daux), d_dprobs(dprobs), d_dlogits(dlogits);
  cpu::moe_aux_loss_backward(dprobs.data(), daux.data(), r.expert.data(), s.B, s.T, s.E, s.K);
  cpu::moe_z_loss_backward(dlogits.data(), daux.data(), logits.data(), s.B, s.T, s.E);
  gpu::moe_aux_loss_backward(d_dprobs.get(), d_daux.get(), d_expert.get(), s.B, s.T, s.E, s.K);
  gpu::moe_z_loss_backward(d_dlogits.get(), d_daux.get(), d_logits.get(), s.B, s.T, s.E);
  expect_close("moe_aux_loss_backward", "dprobs(+=)", d_dprobs.download(), dprobs, 1e-5);
  expect_close("moe_z_loss_backward", "dlogits(+=)", d_dlogits.download(), dlogits, 1e-5);
}

TEST(CudaMoe, DispatchPlanMatchesExactly) {
  REQUIRE_CUDA_DEVICE();
  const Shape s;
  std::mt19937_64 rng(13);
  const Routing r = cpu_route(router_logits(rng, s), s);
  DevBuf<int32_t> d_expert(r.expert);
  const int64_t NK = s.N() * s.K;
  // Dropless, and a capacity of ceil(1.0 * T * K / E) = 4 that the favoured expert exceeds.
  for (const int64_t capacity : {int64_t{0}, cpu::moe_capacity(1.0, s.T, s.E, s.K)}) {
    const Plan ref = cpu_plan(r.expert, s, capacity);
    if (capacity > 0) ASSERT_LT(ref.rows, NK) << "the capacity must drop something here";
    DevBuf<int64_t> d_slot(NK), d_slot_token(NK), d_offsets(s.E + 1);
    std::vector<int64_t> load(static_cast<size_t>(s.E), -1);
    const int64_t rows =
        gpu::moe_dispatch_plan(d_slot.get(), d_slot_token.get(), d_offsets.get(), load.data(),
                               d_expert.get(), s.B, s.T, s.E, s.K, capacity);
    const std::string k = "moe_dispatch_plan cap " + std::to_string(capacity);
    std::printf("[ cuda ] %-26s rows %lld of %lld (cpu %lld)\n", k.c_str(),
                static_cast<long long>(rows), static_cast<long long>(NK),
                static_cast<long long>(ref.rows));
    EXPECT_EQ(rows, ref.rows);
    expect_equal(k, "slot", d_slot.download(), ref.slot);
    expect_equal(k, "slot_token", d_slot_token.download(static_cast<size_t>(ref.rows)),
                 ref.slot_token);
    expect_equal(k, "offsets", d_offsets.download(), ref.offsets);
    expect_equal(k, "load", load, ref.load);
  }
}

TEST(CudaMoe, PermuteCombineAndTheirBackwards) {
  REQUIRE_CUDA_DEVICE();
  const Shape s;
  std::mt19937_64 rng(14);
  const Routing r = cpu_route(router_logits(rng, s), s);
  const Plan p = cpu_plan(r.expert, s, cpu::moe_capacity(1.0, s.T, s.E, s.K));  // with drops
  const int64_t N = s.N(), K = s.K, C = s.C, M = p.rows;
  DevBuf<int64_t> d_slot(p.slot), d_slot_token(p.slot_token);
  DevBuf<float> d_weight(r.weight);

  const std::vector<float> x = random_vec(rng, static_cast<size_t>(N * C));
  std::vector<float> xp(static_cast<size_t>(M * C));
  cpu::moe_permute(xp.data(), x.data(), p.slot_token.data(), M, C);
  DevBuf<float> d_x(x), d_xp(M * C);
  gpu::moe_permute(d_xp.get(), d_x.get(), d_slot_token.get(), M, C);
  expect_close("moe_permute", "xp", d_xp.download(), xp, 0.0);  // a copy: exact

  const std::vector<float> dxp = random_vec(rng, static_cast<size_t>(M * C));
  std::vector<float> dx(static_cast<size_t>(N * C));
  cpu::moe_permute_backward(dx.data(), dxp.data(), p.slot.data(), N, K, C);
  DevBuf<float> d_dxp(dxp), d_dx(N * C);
  gpu::moe_permute_backward(d_dx.get(), d_dxp.get(), d_slot.get(), N, K, C);
  expect_close("moe_permute_backward", "dx", d_dx.download(), dx, kTol);

  const std::vector<float> y = random_vec(rng, static_cast<size_t>(M * C));
  std::vector<float> out(static_cast<size_t>(N * C));
  cpu::moe_unpermute(out.data(), y.data(), p.slot.data(), r.weight.data(), N, K, C);
  DevBuf<float> d_y(y), d_out(N * C);
  gpu::moe_unpermute(d_out.get(), d_y.get(), d_slot.get(), d_weight.get(), N, K, C);
  expect_close("moe_unpermute", "out", d_out.download(), out, kTol);

  const std::vector<float> dout = random_vec(rng, static_cast<size_t>(N * C));
  std::vector<float> dy(static_cast<size_t>(M * C)), dweight(static_cast<size_t>(N * K));
  cpu::moe_unpermute_backward(dy.data(), dweight.data(), dout.data(), y.data(), p.slot.data(),
                              r.weight.data(), N, K, C);
  DevBuf<float> d_dout(dout), d_dy(M * C), d_dweight(N * K);
  gpu::moe_unpermute_backward(d_dy.get(), d_dweight.get(), d_dout.get(), d_y.get(), d_slot.get(),
                              d_weight.get(), N, K, C);
  expect_close("moe_unpermute_backward", "dy", d_dy.download(), dy, kTol);
  expect_close("moe_unpermute_backward", "dweight", d_dweight.download(), dweight, 1e-5);

  // The scatter: a random permutation of the M rows.
  std::vector<int64_t> row(static_cast<size_t>(M));
  std::iota(row.begin(), row.end(), 0);
  std::shuffle(row.begin(), row.end(), rng);
  std::vector<float> scattered(static_cast<size_t>(M * C));
  cpu::moe_scatter_rows(scattered.data(), y.data(), row.data(), M, C);
  DevBuf<int64_t> d_row(row);
  DevBuf<float> d_scattered(M * C);
  gpu::moe_scatter_rows(d_scattered.get(), d_y.get(), d_row.get(), M, C);
  expect_close("moe_scatter_rows", "out", d_scattered.download(), scattered, 0.0);
}

// The expert rows of E experts with counts {5, 0, 9, 1, 12}: the second expert empty.
std::vector<int64_t> expert_offsets() {
  const std::vector<int64_t> counts{5, 0, 9, 1, 12};
  std::vector<int64_t> offsets{0};
  for (int64_t c : counts) offsets.push_back(offsets.back() + c);
  return offsets;
}

TEST(CudaMoe, GroupedExpertLinear) {
  REQUIRE_CUDA_DEVICE();
  const std::vector<int64_t> offsets = expert_offsets();
  const int64_t E = static_cast<int64_t>(offsets.size()) - 1, M = offsets.back();
  const int64_t C = 48, OC = 72;
  std::mt19937_64 rng(15);
  const std::vector<float> inp = random_vec(rng, static_cast<size_t>(M * C));
  const std::vector<float> w = random_vec(rng, static_cast<size_t>(E * OC * C), -0.2f, 0.2f);
  const std::vector<float> b = random_vec(rng, static_cast<size_t>(E * OC));
  gpu::CublasContext ctx;
  DevBuf<float> d_inp(inp), d_w(w), d_b(b), d_out(M * OC);
  for (const bool bias : {true, false}) {
    std::vector<float> out(static_cast<size_t>(M * OC));
    cpu::moe_expert_linear_forward(out.data(), inp.data(), w.data(), bias ? b.data() : nullptr,
                                   offsets.data(), E, C, OC);
    gpu::moe_expert_linear_forward(ctx, d_out.get(), d_inp.get(), d_w.get(),
                                   bias ? d_b.get() : nullptr, offsets.data(), E, C, OC);
    expect_close("moe_expert_linear_forward", bias ? "out" : "out(no bias)", d_out.download(),
                 out, kTol);
  }
  const std::vector<float> dout = random_vec(rng, static_cast<size_t>(M * OC));
  std::vector<float> dinp(static_cast<size_t>(M * C));
  std::vector<float> dw = random_vec(rng, static_cast<size_t>(E * OC * C));
  std::vector<float> db = random_vec(rng, static_cast<size_t>(E * OC));
  DevBuf<float> d_dout(dout), d_dinp(M * C), d_dw(dw), d_db(db);
  cpu::moe_expert_linear_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                                  w.data(), offsets.data(), E, C, OC);
  gpu::moe_expert_linear_backward(ctx, d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(),
                                  d_inp.get(), d_w.get(), offsets.data(), E, C, OC);
  expect_close("moe_expert_linear_backward", "dinp", d_dinp.download(), dinp, kTol);
  expect_close("moe_expert_linear_backward", "dweight(+=)", d_dw.download(), dw, kTol);
  expect_close("moe_expert_linear_backward", "dbias(+=)", d_db.download(), db, kTol);
}

// CudaKernels<float>: the index arrays the graph passes may be device memory (the dispatch
// plan's) or host memory (expert parallelism's receive plan), and the MoE block accumulates its
// statistics into host doubles; both give the same results.
TEST(CudaMoe, KernelSetTakesHostOrDeviceMemory) {
  REQUIRE_CUDA_DEVICE();
  static_assert(trident::kernels_have_moe<trident::CudaKernels<float>>);
  static_assert(!trident::kernels_have_moe<trident::CudaKernels<gpu::bf16>>);
  trident::CudaDevice dev(0);
  trident::CudaKernels<float> k(dev);
  const std::vector<int64_t> offsets = expert_offsets();
  const int64_t E = static_cast<int64_t>(offsets.size()) - 1, M = offsets.back();
  const int64_t C = 32, OC = 24;
  std::mt19937_64 rng(16);
  const std::vector<float> inp = random_vec(rng, static_cast<size_t>(M * C));
  const std::vector<float> w = random_vec(rng, static_cast<size_t>(E * OC * C), -0.2f, 0.2f);
  std::vector<float> out(static_cast<size_t>(M * OC));
  cpu::moe_expert_linear_forward<float>(out.data(), inp.data(), w.data(), nullptr,
                                        offsets.data(), E, C, OC);
  DevBuf<float> d_inp(inp), d_w(w), d_out(M * OC);
  DevBuf<int64_t> d_offsets(offsets);
  for (const bool on_device : {true, false}) {
    k.moe_expert_linear_forward(d_out.get(), d_inp.get(), d_w.get(), nullptr,
                                on_device ? d_offsets.get() : offsets.data(), E, C, OC);
    expect_close("CudaKernels expert linear", on_device ? "out(dev offs)" : "out(host offs)",
                 d_out.download(), out, kTol);
  }
  std::vector<int64_t> row(static_cast<size_t>(M));
  std::iota(row.begin(), row.end(), 0);
  std::shuffle(row.begin(), row.end(), rng);
  std::vector<float> gathered(static_cast<size_t>(M * C)), scattered(static_cast<size_t>(M * C));
  cpu::moe_permute(gathered.data(), inp.data(), row.data(), M, C);
  cpu::moe_scatter_rows(scattered.data(), inp.data(), row.data(), M, C);
  DevBuf<int64_t> d_row(row);
  DevBuf<float> d_moved(M * C);
  for (const bool on_device : {true, false}) {
    const int64_t* idx = on_device ? d_row.get() : row.data();
    k.moe_permute(d_moved.get(), d_inp.get(), idx, M, C);
    expect_close("CudaKernels permute", on_device ? "xp(dev index)" : "xp(host index)",
                 d_moved.download(), gathered, 0.0);
    k.moe_scatter_rows(d_moved.get(), d_inp.get(), idx, M, C);
    expect_close("CudaKernels scatter_rows", on_device ? "out(dev index)" : "out(host index)",
                 d_moved.download(), scattered, 0.0);
  }
  // The block's statistics: accumulate_mean into a host double (the loss sum's is on the
  // device); both add the same mean.
  const std::vector<float> aux = random_vec(rng, 7, 0.f, 2.f);
  double ref_mean = 0.0;
  for (float a : aux) ref_mean += a;
  ref_mean /= 7.0;
  DevBuf<float> d_aux(aux);
  DevBuf<double> d_sum(std::vector<double>{0.5});
  double host_sum = 0.5;
  k.accumulate_mean(&host_sum, d_aux.get(), 7);
  k.accumulate_mean(d_sum.get(), d_aux.get(), 7);
  const double dev_sum = d_sum.download()[0];
  std::printf("[ cuda ] %-26s host %.17g device %.17g cpu %.17g\n", "CudaKernels accumulate_mean",
              host_sum, dev_sum, 0.5 + ref_mean);
  EXPECT_EQ(host_sum, dev_sum);
  EXPECT_NEAR(host_sum, 0.5 + ref_mean, 1e-12);
  // Expert parallelism's send counts read the dispatch plan's device offsets.
  std::vector<int64_t> send(1), per_expert(static_cast<size_t>(E)), ref_send(1),
      ref_per_expert(static_cast<size_t>(E));
  trident::CudaKernels<float>::moe_ep_send_counts(send.data(), per_expert.data(),
                                                  d_offsets.get(), E, 1);
  cpu::moe_ep_send_counts(ref_send.data(), ref_per_expert.data(), offsets.data(), E, 1);
  expect_equal("CudaKernels ep_send_counts", "expert_rows", per_expert, ref_per_expert);
  expect_equal("CudaKernels ep_send_counts", "send_rows", send, ref_send);
}

}  // namespace

#endif  // TRIDENT_TEST_CUDA
