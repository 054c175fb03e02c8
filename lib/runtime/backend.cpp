#include "runtime/backend.hpp"

#include <mpi.h>

#include <cstdio>

#include "kernels/cpu/bf16_gemm.hpp"
#include "util/error.hpp"
#include "util/test_hooks.hpp"

#ifdef TRIDENT_HAVE_CUDA
#include <dlfcn.h>

#include <filesystem>

#include "cuda/cuda_backend.hpp"
#endif

namespace trident {

#ifdef TRIDENT_HAVE_CUDA
void* cuda_module_function(const std::string& who, const char* symbol) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec)
    throw Error(who + ": cannot find this executable's directory, where the GPU backend's lib/ "
                "is (/proc/self/exe: " + ec.message() + ")");
  const fs::path module = exe.parent_path().parent_path() / "lib" / kCudaModuleFile;
  const std::string where = who + ": the GPU backend " + module.string();
  void* handle = dlopen(module.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw Error(where + " cannot be loaded: " + (why != nullptr ? why : "unknown dlopen error") +
                " (it is built with trident when nvcc is found; see docs/gpu.md)");
  }
  auto layout = reinterpret_cast<CudaModuleLayoutFn>(dlsym(handle, kCudaModuleLayoutSymbol));
  void* function = dlsym(handle, symbol);
  if (layout == nullptr || function == nullptr)
    throw Error(where + " lacks the symbols " + kCudaModuleLayoutSymbol + " and " + symbol +
                ": not a Trident GPU backend");
  if (layout() != backend_layout_tag())
    throw Error(where + " was built from other sources than this trident (type layout " +
                std::to_string(layout()) + " vs " + std::to_string(backend_layout_tag()) +
                "): rebuild both together");
  return function;
}

namespace {

// The GPU backend lives in libtrident_cuda.so (cuda/cuda_backend.hpp), loaded here on the
// first GPU run of the process and kept for its lifetime (the objects it makes run its code).
Backend load_cuda_backend(const Config& config, const ParallelDims& dims,
                          const ModelShard& shard) {
  const std::string who = config.source + ": train.device = \"cuda\"";
  auto make =
      reinterpret_cast<CudaModuleMakeFn>(cuda_module_function(who, kCudaModuleMakeSymbol));
  Backend b;
  make(config, dims, shard, b);
  return b;
}

}  // namespace
#endif

Backend make_backend(const Config& config, const ParallelDims& dims, const ModelShard& shard) {
  if (config.train.device == "cuda") {
#ifdef TRIDENT_HAVE_CUDA
    return load_cuda_backend(config, dims, shard);
#else
    throw Error(config.source + ": train.device = \"cuda\", but this trident was built without "
                "CUDA (nvcc was not found when it was configured; see docs/gpu.md)");
#endif
  }
  Backend b;
  b.device = make_cpu_device();
  // Host memory: the device communicators are the groups' own.
  make_device_comms(config, dims, b, [](Communicator& host, DeviceUse) { return &host; });
  if (config.train.precision == "bf16")
    b.model = make_cpu_bf16_stage_model(config.model, shard, *b.comm(Dim::Tensor), *b.device,
                                        cpu_bf16_uses_onednn(config));
  else
    b.model = make_cpu_stage_model(config.model, shard, *b.comm(Dim::Tensor), *b.device);
  return b;
}

bool cpu_bf16_uses_onednn(const Config& config) {
  const std::string& choice = config.train.cpu_bf16_gemm;
  if (choice == "fma") return false;
  if (choice == "auto") return cpu::bf16_gemm_outpaces_fp32();
  if (!cpu::bf16_gemm_available())
    throw Error(config.source + ": train.cpu_bf16_gemm = \"onednn\", but oneDNN has no bf16 "
                "matmul on this core: " + cpu::bf16_gemm_description() +
                " (use \"fma\" or \"auto\")");
  return true;
}

std::string cpu_bf16_gemm_text(const Config& config) {
  std::string core = cpu::bf16_gemm_description();
  // What decided "auto" where the core has bf16 dot products but no tiles: their measured rate.
  if (config.train.cpu_bf16_gemm == "auto" && cpu::bf16_gemm_available() &&
      !cpu::bf16_gemm_has_amx()) {
    const cpu::Bf16DotRate& r = cpu::bf16_dot_rate();
    char rate[160];
    std::snprintf(rate, sizeof rate,
                  "; its dot products at %.2fx the fp32 FMAs' rate (%.0f against %.0f GFLOP/s a "
                  "thread; oneDNN's bf16 matmul from %.1fx)",
                  r.ratio(), r.dot_gflops, r.fma_gflops, cpu::kBf16DotLead);
    core += rate;
  }
  if (cpu_bf16_uses_onednn(config)) return core;
  return "fp32 FMA GEMMs on bf16 values (train.cpu_bf16_gemm = \"" +
         config.train.cpu_bf16_gemm + "\"; the core: " + core + ")";
}

Config agree_cpu_bf16_gemm(const Config& config, MPI_Comm comm, std::string* note) {
  if (config.train.device != "cpu" || config.train.precision != "bf16" ||
      config.train.cpu_bf16_gemm != "auto")
    return config;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // TRIDENT_TEST_BF16_SLOW_RANK = "rank", read as straggler.cpp reads its "rank:ms".
  const std::string slow = test_hook(TestHook::Bf16SlowRank);
  int slow_rank = -1;
  char extra = 0;
  if (!slow.empty() &&
      (std::sscanf(slow.c_str(), "%d%c", &slow_rank, &extra) != 1 || slow_rank < 0))
    throw Error(std::string(test_hook_variable(TestHook::Bf16SlowRank)) + "='" + slow +
                "' is not a rank");
  const bool pretend_slow = slow_rank == rank;
  const int onednn = cpu_bf16_uses_onednn(config) && !pretend_slow ? 1 : 0;
  int ranks_onednn = 0;
  MPI_Allreduce(&onednn, &ranks_onednn, 1, MPI_INT, MPI_SUM, comm);
  if (ranks_onednn == 0 || ranks_onednn == size) return config;
  Config agreed = config;
  agreed.train.cpu_bf16_gemm = "fma";
  if (note != nullptr)
    *note = "note: train.cpu_bf16_gemm = \"auto\": oneDNN's bf16 matmul outruns the FMAs on " +
            std::to_string(ranks_onednn) + " of " + std::to_string(size) +
            " ranks' cores; every rank runs the FMA engine (\"fma\"), so that one engine "
            "computes the job's products";
  return agreed;
}

}  // namespace trident
