// The start-up checks of a run (lib/train/startup_checks.hpp): checkpoint.dir usable, and a
// rank's share of the model and activations against the node's memory (issue 22, items 8, 13).
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "config/config.hpp"
#include "comm/comm.hpp"
#include "model/cpu_model.hpp"
#include "model/model_stats.hpp"
#include "sanitizer.hpp"
#include "train/startup_checks.hpp"

using namespace trident;
namespace fs = std::filesystem;

namespace {

Config tiny(const std::vector<std::string>& sets = {}) {
  return parse_config(
      "[model]\nlayers = 4\nheads = 4\nwidth = 64\nvocab_size = 256\nseq_len = 64\n"
      "[train]\nmicro_batch = 2\nglobal_batch = 8\n[data]\ntrain = \"x.bin\"\n",
      "tiny.toml", sets);
}

fs::path scratch(const std::string& name) {
  const auto dir = fs::temp_directory_path() /
                   ("trident_startup_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace

TEST(CheckpointDir, CreatedWhenMissingAndLeftEmpty) {
  const auto dir = scratch("create");
  EXPECT_EQ(checkpoint_dir_problem(""), "");  // no checkpoints: nothing to check
  const auto nested = dir / "a" / "b";
  EXPECT_EQ(checkpoint_dir_problem(nested.string()), "");
  EXPECT_TRUE(fs::is_directory(nested));
  EXPECT_TRUE(fs::is_empty(nested)) << "the probe file is removed again";
  fs::remove_all(dir);
}

TEST(CheckpointDir, NotADirectoryOrUnderAFile) {
  const auto dir = scratch("file");
  const auto file = dir / "f";
  std::ofstream(file) << "x";
  EXPECT_EQ(checkpoint_dir_problem(file.string()),
            "checkpoint.dir '" + file.string() + "' is not a directory");
  EXPECT_EQ(checkpoint_dir_problem((file / "sub").string()),
            "checkpoint.dir '" + (file / "sub").string() + "': cannot create: Not a directory");
  fs::remove_all(dir);
}

TEST(CheckpointDir, ReadOnlyWhenPermissionBitsApply) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores permission bits (test_app_layout mounts "
                                        "a read-only tmpfs instead)";
  const auto dir = scratch("ro");
  fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
  EXPECT_EQ(checkpoint_dir_problem(dir.string()),
            "checkpoint.dir '" + dir.string() + "' is not writable: Permission denied");
  fs::permissions(dir, fs::perms::owner_all);
  fs::remove_all(dir);
}

TEST(RankMemory, ShareOfTheModel) {
  const Config c = tiny();
  const double total = static_cast<double>(parameter_count(c.model));
  const RankMemory whole = estimate_rank_memory(c, ModelShard::whole(c.model), 1);
  EXPECT_DOUBLE_EQ(whole.parameters, total);
  EXPECT_DOUBLE_EQ(whole.state_bytes, 16 * total);  // weights, gradients, two moments
  EXPECT_GT(whole.activation_bytes, 0);

  ModelShard half = ModelShard::whole(c.model);
  half.tp_size = 2;
  EXPECT_DOUBLE_EQ(estimate_rank_memory(c, half, 1).parameters, total / 2);

  const Config zero = tiny({"optim.zero_stage=1"});
  // Weights, gradients, a quarter of the moments, and the reduce-scatter's staging: the tiny
  // model is one bucket (under parallel.dp_bucket_mb), padded, and a slice of it.
  EXPECT_DOUBLE_EQ(estimate_rank_memory(zero, ModelShard::whole(c.model), 4).state_bytes,
                   (4 + 4 + 2) * total + 4 * (total + total / 4));

  ModelShard middle = ModelShard::whole(c.model);  // a middle stage: layers only
  middle.layer_begin = 1, middle.layer_end = 3, middle.has_embedding = false,
  middle.has_head = false;
  const RankMemory m = estimate_rank_memory(c, middle, 1);
  EXPECT_LT(m.parameters, total / 2);
  EXPECT_LT(m.activation_bytes, whole.activation_bytes);
}

// Context parallelism: a rank of CP = 2 holds seq_len / 2 rows of each sequence, so its
// activations are those of CP = 1 at half the sequence length, to the byte; the model's
// state is untouched (replicated over the context group), and ZeRO-1 shards it over
// data x context (the replica count the caller passes).
TEST(RankMemory, ContextParallelHoldsTheRowsOfAHalfLengthSequence) {
  const Config c = tiny({"model.seq_len=64"}), half_length = tiny({"model.seq_len=32"});
  ModelShard cp2 = ModelShard::whole(c.model);
  cp2.cp_size = 2;
  const RankMemory split = estimate_rank_memory(c, cp2, 1);
  const RankMemory whole = estimate_rank_memory(c, ModelShard::whole(c.model), 1);
  const RankMemory shorter =
      estimate_rank_memory(half_length, ModelShard::whole(half_length.model), 1);
  // The ring's four key/value blocks [B, T/2, 2 KVH HS] in fp32 come on top.
  const double ring = 4.0 * 4 * c.train.micro_batch * 32 * 2 * c.model.kv_head_count() *
                      c.model.head_size();
  EXPECT_DOUBLE_EQ(split.activation_bytes, shorter.activation_bytes + ring);
  EXPECT_LT(split.activation_bytes, 0.6 * whole.activation_bytes);
  EXPECT_DOUBLE_EQ(split.state_bytes, whole.state_bytes);
}

// The estimate covers what one micro-batch's forward and backward really allocate beyond the
// weights and gradients, the backward's scratch included (it was left out: a 32K-token run on
// one rank passed the check under a 1 GiB address-space limit and then died of bad_alloc,
// found by bench/context_parallel.py), and not much more.
// fp8 (the quantised copies in the backward's scratch) with packed documents (their starts
// and positions per micro-batch) too; and a mixture of experts (E 4, top 2, every layer),
// whose router and expert rows and MoE buffers the estimate left out (it was 2.7x short).
TEST(RankMemory, CoversWhatAStepAllocates) {
  for (const bool moe : {false, true})
  for (const bool fp8_documents : {false, true})
  for (const char* seq : {"64", "1024"}) {
    std::vector<std::string> sets = {std::string("model.seq_len=") + seq, "train.micro_batch=1",
                                     "train.global_batch=1"};
    if (moe) sets.insert(sets.end(), {"model.moe_experts=4", "model.moe_top_k=2"});
    if (fp8_documents)
      sets.insert(sets.end(), {"train.precision=\"fp8\"", "data.document_mask=true",
                               "data.eod_id=7", "model.position_reset=true",
                               "train.fp8_skip_first_layers=0", "train.fp8_skip_last_layers=0"});
    const Config c = tiny(sets);
    ModelShard shard = ModelShard::whole(c.model);
    if (fp8_documents) {
      shard.fp8.enabled = true;
      shard.fp8.skip_first = shard.fp8.skip_last = 0;
      shard.document_eod = 7;
    }
    auto self = make_self_communicator("tensor");
    CpuModel<float> model(c.model, shard, *self);
    model.init_weights(1);
    Device& device = model.kernels().device();
    const int64_t state = device.allocated_bytes();  // weights and gradients
    const int64_t N = c.model.seq_len;
    std::vector<int32_t> tokens(static_cast<size_t>(N)), targets(tokens.size());
    for (int64_t i = 0; i < N; ++i) tokens[i] = targets[i] = static_cast<int32_t>(i % 256);
    {
      auto a = model.make_activations(1);
      model.forward(a, tokens.data(), targets.data(), nullptr, 1.0f);
      model.backward(a, 1.0f, nullptr, nullptr);
    }
    const double measured = static_cast<double>(device.peak_allocated_bytes() - state);
    const double estimated = estimate_rank_memory(c, shard, 1).activation_bytes;
    const std::string what = std::string("seq_len ") + seq + (moe ? ", MoE" : "") +
                             (fp8_documents ? ", fp8 and documents" : "");
    std::printf("[ measured ] %s: a step allocates %.0f bytes beyond the state, the estimate "
                "%.0f\n",
                what.c_str(), measured, estimated);
    EXPECT_GE(estimated, measured) << what;
    EXPECT_LE(estimated, 1.5 * measured) << what;
  }
}

// A stage whose layers all keep the base precision (train.fp8_skip_*) never makes FP8's
// quantised copies: its estimate is fp32's; one FP8 layer adds them.
TEST(RankMemory, Fp8ScratchOnlyWhereAStageHasAnFp8Layer) {
  const Config fp32 = tiny({"train.micro_batch=1", "train.global_batch=1"});
  const Config fp8 = tiny({"train.micro_batch=1", "train.global_batch=1",
                           "train.precision=\"fp8\"", "train.fp8_skip_first_layers=0",
                           "train.fp8_skip_last_layers=0"});
  ModelShard plain = ModelShard::whole(fp32.model), skipped = plain, covered = plain;
  skipped.fp8 = covered.fp8 = fp8_settings(fp8.train);
  skipped.fp8.skip_first = fp8.model.layers;  // every layer skipped
  const double base = estimate_rank_memory(fp32, plain, 1).activation_bytes;
  EXPECT_EQ(estimate_rank_memory(fp8, skipped, 1).activation_bytes, base);
  EXPECT_GT(estimate_rank_memory(fp8, covered, 1).activation_bytes, base);
}

// ZB-H1 keeps a micro-batch's linear-layer output gradients from its input gradient to its
// weight gradient: the estimate adds exactly what the model allocates for them.
TEST(RankMemory, ZeroBubbleAddsTheDeferredOutputGradients) {
  const Config c = tiny(), zb = tiny({"parallel.schedule=zb-h1"});
  const ModelShard shard = ModelShard::whole(c.model);
  auto self = make_self_communicator("tensor");
  const CpuModel<float> model(c.model, shard, *self);
  const double deferred =
      static_cast<double>(model.deferred_weight_grad_bytes(c.train.micro_batch));
  EXPECT_GT(deferred, 0);
  EXPECT_DOUBLE_EQ(estimate_rank_memory(zb, shard, 1).activation_bytes -
                       estimate_rank_memory(c, shard, 1).activation_bytes,
                   deferred);
}

// Recomputation shrinks the estimate by what the model stops allocating per layer, and adds
// the workspace it recomputes in: the model's own figures (model_stats.hpp).
TEST(RankMemory, RecomputeCountsWhatTheModelKeeps) {
  const ModelShard shard = ModelShard::whole(tiny().model);
  auto self = make_self_communicator("tensor");
  const double none = estimate_rank_memory(tiny(), shard, 1).activation_bytes;
  for (const std::string mode : {"selective", "full"}) {
    const Config c = tiny({"train.recompute=" + mode});
    ModelShard s = shard;
    s.recompute = parse_recompute(mode);
    const CpuModel<float> plain(c.model, shard, *self), model(c.model, s, *self);
    const int64_t B = c.train.micro_batch;
    const double expected = none - static_cast<double>(plain.activation_bytes(B)) +
                            static_cast<double>(model.activation_bytes(B)) +
                            static_cast<double>(model.recompute_workspace_bytes(B));
    const double estimate = estimate_rank_memory(c, shard, 1).activation_bytes;
    EXPECT_DOUBLE_EQ(estimate, expected) << mode;
    // Each mode keeps less per layer. Selective drops only attention's row logsumexp, which
    // its workspace (one layer's logsumexp and attention output) can outweigh: only full is
    // smaller in total.
    EXPECT_LT(model.activation_bytes(B), plain.activation_bytes(B)) << mode;
    if (mode == "full") EXPECT_LT(estimate, none) << mode;
  }
}

// A pipeline stage holds as many micro-batches' activations as its schedule keeps in flight
// (schedule_peak_bound): stage 0 of 2 with 8 micro-batches holds 2 under 1F1B and ZB-H1, 3
// under ZB-H2, all 8 under GPipe, and 5 chunk stashes of half its layers under interleaved
// (counted as 2 whole ones); the last stage 1 under 1F1B. Stage 0 without recomputation and
// without the head holds only the backward's scratch once beside that many stashes.
TEST(RankMemory, CountsTheMicroBatchesTheScheduleHolds) {
  const std::vector<std::string> pp2 = {"parallel.pipeline=2", "train.global_batch=16"};
  auto config = [&](const std::string& schedule, std::vector<std::string> more = {}) {
    more.insert(more.end(), pp2.begin(), pp2.end());
    more.push_back("parallel.schedule=\"" + schedule + "\"");
    return tiny(more);
  };
  ModelShard first = ModelShard::whole(tiny().model);
  first.layer_begin = 0, first.layer_end = 2, first.has_head = false;
  auto held = [&](const Config& c, int stage = 0) {
    const RankMemory r = estimate_rank_memory(c, first, 1, stage);
    return std::make_pair(r.micro_batches_held, r.activation_bytes);
  };
  const auto [one_f_one_b, stash2] = held(config("1f1b"));
  const auto [gpipe, stash8] = held(config("gpipe"));
  const auto [h1, split2] = held(config("zb-h1"));
  const auto [h2, split3] = held(config("zb-h2"));
  const auto [interleaved, chunks] = held(config("interleaved", {"parallel.virtual_stages=2"}));
  EXPECT_EQ(one_f_one_b, 2);
  EXPECT_EQ(gpipe, 8);
  EXPECT_EQ(h1, 2);
  EXPECT_EQ(h2, 3);
  EXPECT_EQ(interleaved, 2);
  // k stashes and what is held once (the backward's scratch): stash(k) = k S + H.
  const double stash = (stash8 - stash2) / 6, once = stash2 - 2 * stash;
  EXPECT_GT(stash, 0);
  EXPECT_GT(once, 0);
  EXPECT_DOUBLE_EQ(split2 - 2 * (split3 - split2), once) << "the split stash, the same H";
  EXPECT_DOUBLE_EQ(chunks, stash2);
  EXPECT_EQ(held(config("1f1b"), 1).first, 1) << "the last stage of 1F1B holds one";
  EXPECT_EQ(held(tiny({"parallel.schedule=\"gpipe\""})).first, 4)
      << "GPipe without a pipeline still runs every forward first";

  // The problem line says how many it counted, and why.
  const std::string act = rank_memory_problem(config("gpipe"), first, 0, 1, 1e3, 0);
  EXPECT_NE(act.find("8 micro-batches of activations held at once (parallel.schedule = "
                     "\"gpipe\" on pipeline stage 0) (model.seq_len = 64, train.micro_batch = "
                     "2) needs "),
            std::string::npos)
      << act;
  EXPECT_EQ(act.find('\n'), std::string::npos);
}

TEST(RankMemory, ProblemNamesTheKeysThatSizeIt) {
  const Config c = tiny();
  const ModelShard shard = ModelShard::whole(c.model);
  EXPECT_EQ(rank_memory_problem(c, shard, 0, 1, 1e12), "");
  EXPECT_EQ(rank_memory_problem(c, shard, 0, 1, 0), "") << "unknown memory: no check";

  const std::string model = rank_memory_problem(c, shard, 3, 1, 1e3);
  EXPECT_EQ(model.rfind("not enough memory on rank 3: this rank's share of the model "
                        "(model.layers = 4, model.width = 64, model.vocab_size = 256 over "
                        "parallel.tensor = 1 x parallel.pipeline = 1: ",
                        0),
            0u)
      << model;
  EXPECT_NE(model.find("of physical memory of this node"), std::string::npos) << model;
  EXPECT_EQ(model.find('\n'), std::string::npos);

  // Activations first when they dominate: the CPU kernels' attention matrix grows as T^2.
  const Config longer = tiny({"model.seq_len=1000000000"});
  const std::string act =
      rank_memory_problem(longer, ModelShard::whole(longer.model), 0, 1, 1e12);
  EXPECT_EQ(act.rfind("not enough memory on rank 0: one micro-batch of activations "
                      "(model.seq_len = 1000000000, train.micro_batch = 2) needs ",
                      0),
            0u)
      << act;
  EXPECT_GT(usable_memory_limit().bytes, 1e8);
}

// checkpoint.async keeps a host copy of the rank's weights and moments (its staging buffer):
// counted in the estimate only with a checkpoint.dir, and named in the problem line.
TEST(RankMemory, AsynchronousCheckpointsCountTheirStagingCopy) {
  const Config sync = tiny({"checkpoint.dir=ck"});
  const ModelShard shard = ModelShard::whole(sync.model);
  const double total = static_cast<double>(parameter_count(sync.model));
  EXPECT_DOUBLE_EQ(estimate_rank_memory(sync, shard, 1).staging_bytes, 0);
  const Config async = tiny({"checkpoint.dir=ck", "checkpoint.async=true"});
  const RankMemory r = estimate_rank_memory(async, shard, 1);
  EXPECT_DOUBLE_EQ(r.staging_bytes, 12 * total);  // weights and two moments, fp32
  EXPECT_DOUBLE_EQ(r.total(), r.state_bytes + r.activation_bytes + r.staging_bytes);
  // ZeRO-1 over 4: the rank's quarter of the moments only.
  const Config zero = tiny({"checkpoint.dir=ck", "checkpoint.async=true", "optim.zero_stage=1"});
  EXPECT_DOUBLE_EQ(estimate_rank_memory(zero, shard, 4).staging_bytes, (4 + 2) * total);
  EXPECT_DOUBLE_EQ(
      estimate_rank_memory(tiny({"checkpoint.async=true"}), shard, 1).staging_bytes, 0)
      << "no checkpoint.dir: nothing saved, nothing staged";
  const std::string line = rank_memory_problem(async, shard, 0, 1, 1e3);
  EXPECT_NE(line.find("for checkpoint.async's staging copy of the weights and moments"),
            std::string::npos)
      << line;
}

TEST(AsyncCheckpoint, NeedsMpiThreadMultiple) {
  const Config async = tiny({"checkpoint.dir=ck", "checkpoint.async=true"});
  EXPECT_EQ(async_checkpoint_problem(async, MPI_THREAD_MULTIPLE), "");
  const std::string line = async_checkpoint_problem(async, MPI_THREAD_SERIALIZED);
  EXPECT_EQ(line.rfind("checkpoint.async = true in tiny.toml needs MPI_THREAD_MULTIPLE", 0), 0u)
      << line;
  EXPECT_NE(line.find("provides thread level " + std::to_string(MPI_THREAD_SERIALIZED)),
            std::string::npos)
      << line;
  EXPECT_EQ(async_checkpoint_problem(tiny({"checkpoint.dir=ck"}), MPI_THREAD_SINGLE), "");
  EXPECT_EQ(async_checkpoint_problem(tiny({"checkpoint.async=true"}), MPI_THREAD_SINGLE), "")
      << "no checkpoint.dir: no writer thread";
}

// Issue 56 item 14: under `ulimit -v` a model too large for the address space passed the
// start-up check (physical memory only) and failed 36 s later with "internal error:
// std::bad_alloc". The check takes the smallest of physical memory, the address space left
// under RLIMIT_AS, the cgroup's memory limit and Slurm's, and its line names which.
TEST(MemoryLimits, CgroupV1AndV2LimitsOfTheProcessAndItsAncestors) {
  const auto root = scratch("cgroup");
  auto put = [&](const std::string& rel, const std::string& text) {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text << "\n";
  };
  put("memory/job/step/memory.limit_in_bytes", "9223372036854771712");  // v1's "unlimited"
  put("memory/job/memory.limit_in_bytes", "2000000000");
  put("memory/memory.limit_in_bytes", "9223372036854771712");
  MemoryLimit v1 = cgroup_memory_limit("5:devices:/\n4:cpu,memory:/job/step\n0::/\n",
                                       root.string());
  EXPECT_EQ(v1.bytes, 2e9);
  EXPECT_EQ(v1.what, "of the memory limit of this process's cgroup (" + root.string() +
                         "/memory/job/memory.limit_in_bytes)");
  put("slice/task/memory.max", "max");
  put("slice/memory.max", "3000000000");
  put("unified/slice/task/memory.max", "1500000000");  // a hybrid layout's v2 tree
  const MemoryLimit v2 = cgroup_memory_limit("0::/slice/task\n", root.string());
  EXPECT_EQ(v2.bytes, 1.5e9);
  EXPECT_NE(v2.what.find("unified/slice/task/memory.max)"), std::string::npos) << v2.what;
  EXPECT_EQ(cgroup_memory_limit("0::/\n1:name=systemd:/\n", root.string()).bytes, 0.0);
  EXPECT_EQ(cgroup_memory_limit("", "/nonexistent").bytes, 0.0);
  fs::remove_all(root);
}

TEST(MemoryLimits, SlurmMemoryPerNodeOrPerCpuAndTheSmallestLimitIsNamed) {
  const char* keys[] = {"SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU", "SLURM_CPUS_ON_NODE"};
  for (const char* k : keys) ::unsetenv(k);
  EXPECT_EQ(slurm_memory_limit().bytes, 0.0);
  ::setenv("SLURM_MEM_PER_CPU", "1000", 1);
  ::setenv("SLURM_CPUS_ON_NODE", "4", 1);
  MemoryLimit slurm = slurm_memory_limit();
  EXPECT_EQ(slurm.bytes, 4000.0 * 1024 * 1024);
  EXPECT_EQ(slurm.what, "of the job's memory on this node (SLURM_MEM_PER_CPU = 1000 MB x "
                        "SLURM_CPUS_ON_NODE = 4)");
  ::setenv("SLURM_MEM_PER_NODE", "1", 1);  // 1 MiB: below any other limit
  slurm = usable_memory_limit();
  EXPECT_EQ(slurm.bytes, 1024.0 * 1024);
  EXPECT_EQ(slurm.what, "of the job's memory on this node (SLURM_MEM_PER_NODE = 1 MB)");
  const Config c = tiny();
  const std::string line = rank_memory_problem(c, ModelShard::whole(c.model), 0, 1, slurm);
  EXPECT_NE(line.find("more than the 0.0 GB of the job's memory on this node "
                      "(SLURM_MEM_PER_NODE = 1 MB)"),
            std::string::npos)
      << line;
  for (const char* k : keys) ::unsetenv(k);
  EXPECT_EQ(usable_memory_limit().what.find("SLURM"), std::string::npos);
}

TEST(MemoryLimits, AddressSpaceLimitLessWhatIsMapped) {
  if (test::kUnderAddressSanitizer) GTEST_SKIP() << "ASan's shadow memory: no RLIMIT_AS";
  // In a child: the limit set there stays there.
  const auto child = [] {
    const rlimit limit{rlim_t{64} << 30, rlim_t{64} << 30};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) std::exit(3);
    const MemoryLimit as = address_space_limit();
    const bool named = as.what.rfind("of address space this process may still map under its "
                                     "limit (ulimit -v, RLIMIT_AS: 68.7 GB, ", 0) == 0;
    const bool less = as.bytes > 0 && as.bytes < 68.72e9;
    const bool smallest = usable_memory_limit().bytes <= as.bytes;
    std::exit(named && less && smallest ? 0 : 2);
  };
  EXPECT_EXIT(child(), testing::ExitedWithCode(0), "");
}
