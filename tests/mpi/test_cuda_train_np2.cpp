// The GPU trainer (train.device = "cuda") against the CPU trainer, the reference, on the same
// data and initial weights:
//  * fp32 on one GPU: losses within 1e-5 relative over 10 steps, gradients after step 1 within
//    1e-4 relative per parameter; bf16: losses within 2e-2 of the CPU's fp32, and within 5e-3
//    (step 1's gradients 2e-2) of the CPU's bf16, which rounds what the GPU rounds.
//  * Two ranks sharing the one GPU over the MPI path (parallel.comm = "mpi": device buffers
//    staged through host memory): TP=2, PP=2 and DP=2 with ZeRO-1 against the one-GPU run.
//  * Checkpoint on the GPU: 3 steps, save, a fresh trainer loads, 3 more steps = 6 straight,
//    bit for bit (the GPU kernels are deterministic).
//  * The Llama architecture (grouped-query attention, untied head): fp32 and bf16 against the
//    CPU as above, and tensor parallelism with sequence parallelism over MPI (both
//    architectures) against one GPU.
//  * A mixture of experts (fp32): the GPU against the CPU as above, and TP=2 over MPI against
//    one GPU.
//  * Context parallelism: CP=2 over MPI against one GPU, GPT-2 and Llama (skipped while the
//    configuration refuses CP on the GPU).
//  * Packed documents (both architectures): fp32 and bf16 against the CPU, PP=2 over MPI.
//  * train.deterministic = false (the bf16 attention backward's atomic dQ) against the CPU.
//  * train.precision = "fp8" (cuBLASLt's FP8 GEMMs, bf16 base) against the CPU's FP8 reference
//    (fp32 base), both recipes; skipped on a GPU without FP8 tensor cores.
// Every test skips on a machine without a GPU (CI), with a message saying so.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "parity.hpp"

#ifdef TRIDENT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/ops.hpp"
#endif

using namespace trident;
using namespace trident::test;

namespace {

constexpr int64_t kSteps = 10;

bool have_gpu() {
#ifdef TRIDENT_HAVE_CUDA
  return cuda::device_available();
#else
  return false;
#endif
}

#define REQUIRE_GPU()                                                                    \
  do {                                                                                   \
    if (!have_gpu())                                                                     \
      GTEST_SKIP() << "no CUDA device (or a build without CUDA): GPU trainer untested"; \
  } while (0)

// Head size 32 (the CUDA attention kernels take 32, 64 or 128).
Config gpu_config(const std::filesystem::path& dir, std::vector<std::string> extra) {
  std::vector<std::string> overrides = {
      "train.steps=10", "eval.interval=0", "model.vocab_size=250", "model.width=64",
      "model.heads=2", "log.dir=" + (dir / "run").string()};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return parse_config(tiny_config(dir), "gpu.toml", overrides);
}

double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

// Worst per-parameter ||g - g_ref|| / ||g_ref|| between two single-rank references.
double worst_grad_relative(const Reference& got, const Reference& ref, std::string* name) {
  double worst = 0;
  for (const auto& [param, g_ref] : ref.grads) {
    const std::vector<float>& g = got.grads.at(param);
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      d2 += std::pow(static_cast<double>(g[i]) - g_ref[i], 2);
      r2 += static_cast<double>(g_ref[i]) * g_ref[i];
    }
    const double rel = r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
    if (rel > worst) worst = rel, *name = param;
  }
  return worst;
}

// One GPU against the CPU on the same model (`extra`): fp32 losses and step-1 gradients, or bf16
// losses only.
void check_against_cpu(const std::string& label, const std::vector<std::string>& extra,
                       bool bf16) {
  const auto dir = shared_corpus("gpu_" + label);
  const Reference cpu = reference_run(gpu_config(dir, extra), kSteps);
  std::vector<std::string> gpu = extra;
  gpu.push_back("train.device=cuda");
  if (bf16) gpu.push_back("train.precision=bf16");
  const Reference got = reference_run(gpu_config(dir, gpu), kSteps);
  const double losses = worst_relative(got.losses, cpu.losses);
  if (bf16) {
    std::printf("[ measured ] GPU %s bf16 vs CPU fp32: losses %.3g over %lld steps (first %.6f vs "
                "%.6f, last %.6f vs %.6f)\n", label.c_str(), losses,
                static_cast<long long>(kSteps), got.losses.front(), cpu.losses.front(),
                got.losses.back(), cpu.losses.back());
    EXPECT_LE(losses, 2e-2) << label;
    EXPECT_LT(got.losses.back(), got.losses.front()) << label;
    // Against the CPU's bf16 (model/cpu_bf16_kernels.hpp), which rounds the same tensors at the
    // same places: only the order of the fp32 sums differs, so a value lands at most a bf16
    // step from the GPU's now and then (as between the CPU's own layouts, 9.6e-4 at most over
    // 6 steps): losses within 5e-3 (against fp32's 2e-2) and step 1's gradients within 2e-2
    // relative L2 per parameter.
    std::vector<std::string> cpu_bf16 = extra;
    cpu_bf16.push_back("train.precision=bf16");
    const Reference ref16 = reference_run(gpu_config(dir, cpu_bf16), kSteps);
    std::string name;
    const double losses16 = worst_relative(got.losses, ref16.losses);
    const double grads16 = worst_grad_relative(got, ref16, &name);
    std::printf("[ measured ] GPU %s bf16 vs CPU bf16: losses %.3g over %lld steps, gradients "
                "after step 1 %.3g (%s)\n", label.c_str(), losses16,
                static_cast<long long>(kSteps), grads16, name.c_str());
    EXPECT_LE(losses16, 5e-3) << label;
    EXPECT_LE(grads16, 2e-2) << label << ": " << name;
    return;
  }
  std::string name;
  const double grads = worst_grad_relative(got, cpu, &name);
  std::printf("[ measured ] GPU %s fp32 vs CPU: losses %.3g over %lld steps, gradients after "
              "step 1 %.3g (%s)\n", label.c_str(), losses, static_cast<long long>(kSteps), grads,
              name.c_str());
  EXPECT_LE(losses, 1e-5) << label;
  EXPECT_LE(grads, 1e-4) << label << ": " << name;
}

TEST(GpuTrainer, Fp32MatchesTheCpu) {
  REQUIRE_GPU();
  check_against_cpu("gpt2", {}, false);
}

TEST(GpuTrainer, Bf16TracksTheCpu) {
  REQUIRE_GPU();
  check_against_cpu("gpt2", {}, true);
}

// Two ranks on the one GPU, device buffers through MPI, against the one-GPU run.
void check_layout_over_mpi(const std::string& label, std::vector<std::string> layout) {
  const auto dir = shared_corpus("gpu_" + label);
  std::vector<std::string> gpu = {"train.device=cuda", "parallel.comm=mpi"};
  gpu.insert(gpu.end(), layout.begin(), layout.end());
  const Config config = gpu_config(dir, gpu);
  const Reference ref = reference_run(config, kSteps);  // the same model on one rank
  double worst = 0;
  on_layout(config, [&](Trainer& t, ProcessGrid&) {
    for (int64_t s = 0; s < kSteps; ++s) {
      const double loss = t.train_step(s).loss;
      worst = std::max(worst, std::abs(loss - ref.losses[s]) / ref.losses[s]);
    }
  });
  worst = max_over_world(worst);
  std::printf("[ measured ] GPU %s over MPI (two ranks, one GPU) vs one GPU: losses %.3g\n",
              label.c_str(), worst);
  EXPECT_LE(worst, 1e-5) << label;
}

TEST(GpuTrainer, TensorParallelOverMpiMatchesOneGpu) {
  REQUIRE_GPU();
  check_layout_over_mpi("TP=2", {"parallel.tensor=2"});
}

TEST(GpuTrainer, PipelineOverMpiMatchesOneGpu) {
  REQUIRE_GPU();
  check_layout_over_mpi("PP=2", {"parallel.pipeline=2"});
}

TEST(GpuTrainer, DataParallelZeroOverMpiMatchesOneGpu) {
  REQUIRE_GPU();
  check_layout_over_mpi("DP=2 ZeRO-1", {"parallel.data=2", "optim.zero_stage=1"});
}

// ZeRO-2's gradient windows and ZeRO-3's weight gathers (bf16 compute copies on the GPU) over
// the device communicator.
TEST(GpuTrainer, DataParallelZero2And3OverMpiMatchOneGpu) {
  REQUIRE_GPU();
  check_layout_over_mpi("DP=2 ZeRO-2", {"parallel.data=2", "optim.zero_stage=2"});
  check_layout_over_mpi("DP=2 ZeRO-3", {"parallel.data=2", "optim.zero_stage=3"});
}

// Llama with head size 32: 2 query heads sharing 1 kv head.
const std::vector<std::string> kLlama = {"model.arch=llama", "model.kv_heads=1",
                                         "model.ffn_width=128"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Whether GPU 0 has FP8 tensor cores (compute capability 8.9 or later).
bool gpu_has_fp8() {
#ifdef TRIDENT_HAVE_CUDA
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major * 10 + prop.minor >= 89;
#else
  return false;
#endif
}

// train.precision = "fp8" on the GPU (cuBLASLt's FP8 GEMMs on codes quantised from bf16, bf16
// everything else) against the CPU's FP8 reference (the same quantisation from fp32), every
// layer in FP8, both recipes, GPT-2 and Llama: the same scales and codes where the bf16 and
// fp32 inputs round alike, so losses within 2e-2 of the reference (the bound of the GPU's bf16
// against the CPU's fp32: the base precision is what differs), falling, and not the GPU's bf16
// run's (the FP8 GEMMs ran).
TEST(GpuTrainer, Fp8TracksTheCpuReference) {
  REQUIRE_GPU();
  if (!gpu_has_fp8()) GTEST_SKIP() << "GPU 0 has no FP8 tensor cores (compute capability < 8.9)";
  const std::vector<std::string> every_layer = {"train.precision=fp8",
                                                "train.fp8_skip_first_layers=0",
                                                "train.fp8_skip_last_layers=0"};
  int compared = 0;
  for (const bool llama : {false, true})
    for (const std::string recipe : {"current", "delayed"}) {
      const std::string label = std::string(llama ? "llama" : "gpt2") + "-fp8-" + recipe;
      const auto dir = shared_corpus("gpu_" + label);
      std::vector<std::string> fp8 = with(every_layer, {"train.fp8_recipe=" + recipe});
      if (llama) fp8 = with(fp8, kLlama);
      std::vector<std::string> bf16 = {"train.device=cuda", "train.precision=bf16"};
      if (llama) bf16 = with(bf16, kLlama);
      const Reference cpu = reference_run(gpu_config(dir, fp8), kSteps);
      const Reference got =
          reference_run(gpu_config(dir, with(fp8, {"train.device=cuda"})), kSteps);
      const Reference plain = reference_run(gpu_config(dir, bf16), kSteps);
      const double losses = worst_relative(got.losses, cpu.losses);
      const double from_bf16 = worst_relative(got.losses, plain.losses);
      std::printf("[ measured ] GPU %s vs the CPU's FP8 reference: losses %.3g over %lld steps "
                  "(first %.6f vs %.6f, last %.6f vs %.6f); %.3g from the GPU's bf16\n",
                  label.c_str(), losses, static_cast<long long>(kSteps), got.losses.front(),
                  cpu.losses.front(), got.losses.back(), cpu.losses.back(), from_bf16);
      EXPECT_LE(losses, 2e-2) << label;
      EXPECT_LT(got.losses.back(), got.losses.front()) << label;
      EXPECT_GT(from_bf16, 1e-6) << label << ": the GPU's bf16 losses: no FP8 GEMM ran";
      ++compared;
    }
  EXPECT_EQ(compared, 4);
}

TEST(GpuTrainer, LlamaFp32MatchesTheCpu) {
  REQUIRE_GPU();
  check_against_cpu("llama", kLlama, false);
}

TEST(GpuTrainer, LlamaBf16TracksTheCpu) {
  REQUIRE_GPU();
  check_against_cpu("llama", kLlama, true);
}

// Packed documents (data.document_mask, model.position_reset): 'a' (97) ends a document, about
// one token in 26 of the corpus, so a sequence of 32 holds a few documents and the attention
// kernels' masks and skipped tiles are on the path; both architectures (learned positions and
// RoPE restarted per document).
const std::vector<std::string> kDocuments = {"data.document_mask=true", "data.eod_id=97",
                                             "model.position_reset=true"};

TEST(GpuTrainer, PackedDocumentsFp32MatchTheCpu) {
  REQUIRE_GPU();
  check_against_cpu("gpt2-documents", kDocuments, false);
  check_against_cpu("llama-documents", with(kLlama, kDocuments), false);
}

TEST(GpuTrainer, PackedDocumentsBf16TrackTheCpu) {
  REQUIRE_GPU();
  check_against_cpu("gpt2-documents", kDocuments, true);
  check_against_cpu("llama-documents", with(kLlama, kDocuments), true);
}

// train.deterministic = false: the bf16 attention backward's atomic dQ tracks the CPU as the
// deterministic one does (both architectures; packed documents too): the default kernels (wgmma
// on an H100/H200), and the mma_sync ones named.
TEST(GpuTrainer, NonDeterministicBf16TracksTheCpu) {
  REQUIRE_GPU();
  const std::vector<std::string> atomic = {"train.deterministic=false"};
  check_against_cpu("gpt2-atomic-dq", atomic, true);
  check_against_cpu("llama-atomic-dq", with(kLlama, atomic), true);
  check_against_cpu("llama-documents-atomic-dq", with(with(kLlama, kDocuments), atomic), true);
  check_against_cpu("gpt2-atomic-dq-mma-sync", with(atomic, {"train.attention_kernel=mma_sync"}),
                    true);
}

TEST(GpuTrainer, PackedDocumentsPipelineOverMpiMatchesOneGpu) {
  REQUIRE_GPU();  // every stage reads the tokens for its masks
  check_layout_over_mpi("documents PP=2", with(kDocuments, {"parallel.pipeline=2"}));
}

TEST(GpuTrainer, SequenceParallelOverMpiMatchesOneGpu) {
  REQUIRE_GPU();
  check_layout_over_mpi("TP=2 SP", {"parallel.tensor=2", "parallel.sequence_parallel=true"});
}

TEST(GpuTrainer, LlamaSequenceParallelOverMpiMatchesOneGpu) {
  REQUIRE_GPU();
  // kv_heads 2 so that each tensor rank holds one kv head.
  check_layout_over_mpi("llama TP=2 SP",
                        with(kLlama, {"model.kv_heads=2", "parallel.tensor=2",
                                      "parallel.sequence_parallel=true"}));
}

// Context parallelism on the GPU (kernels/cuda/context_attention.cu): CP=2 on the two ranks
// sharing the GPU, the ring's key/value blocks and their gradients staged through host memory,
// against one GPU; GPT-2 (learned positions at the chunks' positions) and Llama (grouped-query
// attention, RoPE at the chunks' positions). The configuration refuses parallel.context > 1
// with train.device = "cuda" (config.cpp, check_context) until a GPU has passed this test: while
// it does, the test skips, naming the refusal; lifting it makes the test run.
TEST(GpuTrainer, ContextParallelOverMpiMatchesOneGpu) {
  REQUIRE_GPU();
  try {
    gpu_config(shared_corpus("gpu_CP=2"),
               {"train.device=cuda", "parallel.comm=mpi", "parallel.context=2"});
  } catch (const Error& e) {
    GTEST_SKIP() << "the configuration refuses context parallelism on the GPU (lift the "
                    "refusal in config.cpp's check_context to run this test): "
                 << e.what();
  }
  check_layout_over_mpi("CP=2", {"parallel.context=2"});
  check_layout_over_mpi("llama CP=2", with(kLlama, {"parallel.context=2"}));
}

// A mixture of experts in every layer (kernels/cuda/moe.cu): 4 experts, top-2, a capacity that
// drops assignments, the load-balancing and z-losses on.
const std::vector<std::string> kMoe = {"model.moe_experts=4", "model.moe_top_k=2",
                                       "model.moe_capacity_factor=1.25",
                                       "model.moe_aux_loss_coeff=0.01",
                                       "model.moe_z_loss_coeff=0.001"};

TEST(GpuTrainer, MoeFp32MatchesTheCpu) {
  REQUIRE_GPU();
  check_against_cpu("moe", kMoe, false);
}

TEST(GpuTrainer, MoeTensorParallelOverMpiMatchesOneGpu) {
  REQUIRE_GPU();
  check_layout_over_mpi("moe TP=2", with(kMoe, {"parallel.tensor=2"}));
}

TEST(GpuTrainer, MoeExpertParallelOverMpiMatchesOneGpu) {
  REQUIRE_GPU();
  check_layout_over_mpi("moe EP=2", with(kMoe, {"parallel.data=2", "parallel.expert=2"}));
}

// Runs `body` as a one-rank job on rank 0 (self communicators) while rank 1 waits.
template <class F>
void on_rank_zero(F&& body) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) body();
  MPI_Barrier(MPI_COMM_WORLD);
}

// The losses of steps [from, to) of a fresh one-rank trainer of `config`, resumed from
// `checkpoint` first unless it is "".
std::vector<double> step_losses(const Config& config, int64_t from, int64_t to,
                                const std::string& checkpoint = "") {
  SelfGroups self;
  Trainer t(config, self.groups());
  if (!checkpoint.empty()) {
    t.load_checkpoint(checkpoint);
    EXPECT_EQ(t.start_step(), from);
  }
  std::vector<double> losses;
  for (int64_t s = from; s < to; ++s) losses.push_back(t.train_step(s).loss);
  return losses;
}

TEST(GpuTrainer, CheckpointResumeIsBitwiseIdentical) {
  REQUIRE_GPU();
  const auto dir = shared_corpus("gpu_ckpt");
  on_rank_zero([&] {
    const auto ckpt = dir / "ckpt";
    const Config config = gpu_config(dir, {"train.device=cuda", "train.steps=6",
                                           "checkpoint.dir=" + ckpt.string()});
    const std::vector<double> straight = step_losses(config, 0, 6);
    std::vector<double> resumed;
    std::string path;
    {
      SelfGroups self;
      Trainer t(config, self.groups());
      for (int64_t s = 0; s < 3; ++s) resumed.push_back(t.train_step(s).loss);
      path = t.save_checkpoint(3);
    }
    for (double loss : step_losses(config, 3, 6, path)) resumed.push_back(loss);
    ASSERT_EQ(straight.size(), resumed.size());
    for (size_t i = 0; i < straight.size(); ++i)
      EXPECT_EQ(straight[i], resumed[i]) << "step " << i + 1;
  });
}

// checkpoint.async on a GPU: the state staged by one device-to-host copy into pinned memory
// (Device::allocate_host) and written by the writer thread while training goes on. A resume
// from the asynchronously written checkpoint of step 4 continues the uninterrupted run bit
// for bit.
TEST(GpuTrainer, AsynchronousCheckpointResumeIsBitwiseIdentical) {
  REQUIRE_GPU();
  const auto dir = shared_corpus("gpu_async_ckpt");
  on_rank_zero([&] {
    const auto ckpt = dir / "ckpt";
    std::filesystem::remove_all(ckpt);
    const Config config =
        gpu_config(dir, {"train.device=cuda", "train.steps=6", "checkpoint.dir=" + ckpt.string(),
                         "checkpoint.interval=2", "checkpoint.keep=10", "checkpoint.async=true"});
    const std::vector<double> straight = step_losses(config, 0, 6);
    {
      SelfGroups self;
      Trainer t(config, self.groups());
      EXPECT_EQ(t.run(), RunOutcome::Finished);  // saves 2 and 4 asynchronously, 6 at the end
    }
    const std::vector<double> resumed =
        step_losses(config, 4, 6, (ckpt / "step_00000004.h5").string());
    ASSERT_EQ(resumed.size(), 2u);
    for (size_t i = 0; i < resumed.size(); ++i)
      EXPECT_EQ(straight[4 + i], resumed[i]) << "step " << 5 + i;
  });
}

}  // namespace
