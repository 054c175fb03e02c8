// The registry of TRIDENT_TEST_* hooks (see test_hooks.hpp).
#include "util/test_hooks.hpp"

#include <cstdlib>

namespace trident {

namespace {

constexpr std::array<TestHookSpec, kTestHookCount> kHooks = {{
    {TestHook::CorruptBatches, "TRIDENT_TEST_CORRUPT_BATCHES", "b1,b2,... (global batches)",
     "the loss and gradients of those global batches times 1000: a loss spike the divergence "
     "guard must catch (test_app_rollback, test_rollback_np4)"},
    {TestHook::SlowRank, "TRIDENT_TEST_SLOW_RANK", "rank:ms",
     "world rank `rank` sleeps `ms` milliseconds per step, counted as compute: a straggler for "
     "the straggler report (test_app_watchdog, the Slurm requeue test)"},
    {TestHook::SkipCollective, "TRIDENT_TEST_SKIP_COLLECTIVE", "rank:group:seq",
     "world rank `rank` never joins operation number `seq` of the group named `group` (a name "
     "of grid/parallel_dims.hpp's table): a stalled peer for the collective watchdog "
     "(test_app_watchdog)"},
    {TestHook::SlowStartMs, "TRIDENT_TEST_SLOW_START_MS", "ms",
     "`trident train` takes that long in start-up (as a large model's initialisation would), "
     "so that a signal can arrive during it (test_app_train)"},
    {TestHook::SlowCheckpointMs, "TRIDENT_TEST_SLOW_CHECKPOINT_MS", "ms",
     "every tensor of a checkpoint write takes that much longer, so that a signal or a kill "
     "lands inside the write (test_app_checkpoint, test_checkpoint_io_np4, the chaos test)"},
    {TestHook::CheckpointFileLimit, "TRIDENT_TEST_CHECKPOINT_FILE_LIMIT", "bytes",
     "checkpoint writes past that many bytes fail with EFBIG: a full disk without mounting a "
     "small file system (test_app_checkpoint)"},
    {TestHook::CommitPauseMs, "TRIDENT_TEST_COMMIT_PAUSE_MS", "ms",
     "rank 0 sleeps that long at each step of a checkpoint's commit, so that a kill lands "
     "inside it (the chaos test, docs/reliability.md)"},
    {TestHook::GemmCorename, "TRIDENT_TEST_GEMM_CORENAME", "an OpenBLAS core name",
     "pretends OpenBLAS picked that kernel by itself, to reach the forced re-run on any "
     "machine (test_app_gemm)"},
    {TestHook::GemmWrong, "TRIDENT_TEST_GEMM_WRONG", "1",
     "pretends the forced GEMM kernel computed wrong results (test_app_gemm)"},
    {TestHook::Bf16SlowRank, "TRIDENT_TEST_BF16_SLOW_RANK", "rank",
     "world rank `rank` takes its core's bf16 matmul as no faster than its FMAs, so that "
     "train.cpu_bf16_gemm = \"auto\" meets ranks that disagree on any machine (test_app_bf16)"},
}};

constexpr bool hooks_in_enum_order() {
  for (size_t i = 0; i < kHooks.size(); ++i)
    if (static_cast<size_t>(kHooks[i].hook) != i) return false;
  return true;
}
static_assert(hooks_in_enum_order(), "test_hooks() must list the hooks in TestHook's order");

}  // namespace

const std::array<TestHookSpec, kTestHookCount>& test_hooks() { return kHooks; }

const char* test_hook_variable(TestHook hook) {
  return kHooks[static_cast<size_t>(hook)].variable;
}

std::string test_hook(TestHook hook) {
  const char* v = std::getenv(test_hook_variable(hook));
  return v != nullptr ? v : "";
}

int64_t test_hook_int(TestHook hook) {
  const std::string v = test_hook(hook);
  return v.empty() ? 0 : std::atoll(v.c_str());
}

}  // namespace trident
