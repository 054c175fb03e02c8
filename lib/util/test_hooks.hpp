#pragma once
// The TRIDENT_TEST_* environment hooks: switches that make a run misbehave on purpose, so that a
// test can reach a failure path (a loss spike, a stalled peer, a full disk, a kill inside a
// commit) on any machine. They are for tests only, not user settings (docs/config.md lists
// those). Every hook is one row of test_hooks() below, with its value's format and
// what it is for, and every place that reads one reads it through test_hook() /
// test_hook_int(): grep for a TestHook value to find where a hook acts.
//
// A hook that is unset or set to "" is off.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace trident {

enum class TestHook {
  CorruptBatches,       // lib/train/test_corruption.cpp
  SlowRank,             // lib/train/straggler.cpp
  SkipCollective,       // app/cmd_train.cpp -> lib/comm/comm_watchdog.cpp
  SlowStartMs,          // app/cmd_train.cpp
  SlowCheckpointMs,     // lib/checkpoint/h5_file.cpp
  CheckpointFileLimit,  // lib/checkpoint/h5_file.cpp
  CommitPauseMs,        // lib/checkpoint/commit.cpp
  GemmCorename,         // lib/kernels/cpu/blas.cpp
  GemmWrong,            // lib/kernels/cpu/blas.cpp
  Bf16SlowRank,         // lib/runtime/backend.cpp
};
inline constexpr size_t kTestHookCount = 10;

struct TestHookSpec {
  TestHook hook;
  const char* variable;  // the environment variable
  const char* format;    // of its value
  const char* purpose;   // what it makes happen, and which tests use it
};

// Every hook, in TestHook's order.
const std::array<TestHookSpec, kTestHookCount>& test_hooks();
// The environment variable of `hook` ("TRIDENT_TEST_...").
const char* test_hook_variable(TestHook hook);
// The hook's value; "" when it is off (unset or empty).
std::string test_hook(TestHook hook);
// An integer hook's value (milliseconds, bytes): 0 when off; the leading integer of the value,
// as std::atoll reads it, otherwise.
int64_t test_hook_int(TestHook hook);

}  // namespace trident
