#include "train/training_checkpoint.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "checkpoint/ckpt_mpi.hpp"
#include "checkpoint/commit.hpp"
#include "comm/comm_watchdog.hpp"
#include "model/stage_model.hpp"
#include "optim/adamw.hpp"
#include "optim/grad_sync.hpp"
#include "train/checkpoint_tensors.hpp"
#include "train/divergence_guard.hpp"
#include "util/elapsed.hpp"
#include "util/error.hpp"

namespace trident {

namespace {

// Host memory holding `n` floats of device memory `data`: the memory itself on the host
// device, else a copy in `staging` (HDF5 reads and writes host memory).
float* host_view(Device& device, float* data, int64_t n, std::vector<float>& staging) {
  if (device.is_host()) return data;
  staging.resize(static_cast<size_t>(n));
  device.to_host(staging.data(), data, n * static_cast<int64_t>(sizeof(float)));
  return staging.data();
}

// Host views of a training state's weights and moments (a GPU rank's staged copies).
struct HostState {
  std::vector<float> staging[CheckpointBuffers::kCount];
  std::span<float> weights, exp_avg, exp_avg_sq;  // checkpoint_buffers' order

  explicit HostState(const CheckpointedState& s) {
    Device& device = s.model.device();
    const CheckpointBuffers b = checkpoint_buffers(s);
    std::span<float>* views[] = {&weights, &exp_avg, &exp_avg_sq};
    for (int i = 0; i < CheckpointBuffers::kCount; ++i)
      *views[i] = {host_view(device, b.data[i], b.size[i], staging[i]),
                   static_cast<size_t>(b.size[i])};
  }
  // After a read: the staged copies back to the device.
  void to_device(const CheckpointedState& s) const {
    Device& device = s.model.device();
    if (device.is_host()) return;
    const CheckpointBuffers b = checkpoint_buffers(s);
    const std::span<float> views[] = {weights, exp_avg, exp_avg_sq};
    for (int i = 0; i < CheckpointBuffers::kCount; ++i)
      device.from_host(b.data[i], views[i].data(), static_cast<int64_t>(views[i].size_bytes()));
  }
};

// This rank's part of one tensor of the training state: the runs of its whole shard (weights
// in the flat buffer, moments in the optimizer's state), and whether its copy is the one the
// checkpoint holds: then it writes it, and what it reads counts in the checksums (each element
// on one rank only, so the sums agree with the file's).
struct TensorShare {
  std::vector<Run> weights, moments;
  bool writes_weights = false, writes_moments = false;
};

TensorShare share_of(const CheckpointTensor& t, const CheckpointedState& s) {
  TensorShare share;
  const ParamInfo* p = t.local;
  if (p == nullptr) return share;
  share.weights = state_runs(*p, s.model.weight_store().ranges);
  share.moments = state_runs(*p, s.optimizer.owned());
  // The first of p's data-parallel replicas (under expert parallelism an expert's are its
  // expert-data group) writes p; every holder of a ZeRO slice writes its slice's moments (and
  // at ZeRO-3 its slice's weights).
  const bool first_replica = s.sync.replica_of(*p) == 0;
  share.writes_weights = p->counted_in_norm && (first_replica || s.sync.weights_sharded_for(*p));
  share.writes_moments = p->counted_in_norm && (first_replica || s.sync.zero_for(*p));
  return share;
}

ChecksumShare counted_if(bool counts) {
  return counts ? ChecksumShare::all() : ChecksumShare::none();
}

// Whether this rank writes layer `layer`'s FP8 scaling state: one copy per stage, its tensor
// and data-parallel (x context) rank 0's (the end of each step leaves every rank of the stage
// with the same state).
bool writes_fp8_layer(const CheckpointedState& s, int64_t layer) {
  const Fp8DelayedRecipe* fp8 = s.model.fp8_delayed();
  const std::vector<ParamInfo>& params = s.model.params();
  return fp8 && fp8->has_layer(layer) && s.model.shard().tp_rank == 0 && !params.empty() &&
         s.sync.replica_of(params.front()) == 0;
}

// train.fp8_recipe = "delayed": the state of the rank's FP8 layers from the checkpoint, each
// read whole by every rank that holds it (the writer's read counts in the checksum), from
// another history length if the file has one (the newest steps that fit). A checkpoint
// without the state (another precision or recipe, `trident import`) leaves it fresh.
void read_fp8_state(CheckpointReader& reader, const Config& c, const CheckpointedState& s,
                    MPI_Comm comm, bool report) {
  Fp8DelayedRecipe* fp8 = s.model.fp8_delayed();
  const std::vector<Fp8StateDataset> datasets = fp8_state_datasets(c);
  // Each held dataset's layer, its stored history length and its rows.
  struct Held {
    int64_t layer, history;
    std::vector<float> rows;
  };
  std::vector<Held> held;
  int64_t fresh = 0;
  for (const Fp8StateDataset& d : datasets) {
    if (!reader.has_dataset(d.name)) {
      ++fresh;
      continue;
    }
    // check_schema's: [layer_rows, >= 3]
    const std::vector<int64_t> shape = reader.shape(d.name);
    const bool holds = fp8 && fp8->has_layer(d.layer);
    std::vector<float> rows(holds ? static_cast<size_t>(shape[0] * shape[1]) : 0);
    const auto n = static_cast<int64_t>(rows.size());
    reader.read_tensor(d.name, shape, holds ? std::vector<Run>{{0, 0, n}} : std::vector<Run>{},
                       rows, counted_if(writes_fp8_layer(s, d.layer)));
    if (holds) held.push_back({d.layer, shape[1] - 2, std::move(rows)});
  }
  reader.finish();  // checksums and values (finite, >= 0) agreed before the rows are used
  std::string error;  // what restore_layer refuses (a scale of 0), agreed on by every rank
  try {
    for (const Held& h : held) fp8->restore_layer(h.layer, h.rows, h.history);
  } catch (const Error& e) {
    error = "checkpoint '" + reader.path() + "': " + e.what();
  }
  ckpt::agree_or_throw(comm, error);
  if (fresh > 0 && report)
    std::printf("note: checkpoint '%s' holds no FP8 scaling state for %lld of the %zu FP8 "
                "layers: their delayed scaling starts afresh\n",
                reader.path().c_str(), static_cast<long long>(fresh), datasets.size());
}

// Resume's checks of the data order against the checkpoint's; returns the run's skip list
// joined with the checkpoint's.
std::vector<int64_t> resumed_skip_list(const std::string& path, const CheckpointMeta& meta,
                                       const Config& c, const std::vector<int64_t>& run_skips,
                                       bool report) {
  // Which samples step `meta.step` reads depends on the global batch, the seed and shuffling
  // (the sampler is a pure function of them and the step): with another value the run would
  // not go on with the samples it has not seen yet.
  const std::string changes = data_order_changes(meta.config, c);
  if (!changes.empty() && !c.checkpoint.allow_data_change)
    throw Error("checkpoint '" + path + "' was written with another data order (" + changes +
                " in " + c.source + "): resuming would not continue where it stopped; set "
                "checkpoint.allow_data_change = true to resume anyway");
  if (!changes.empty() && report)
    std::printf("note: resuming with another data order (%s; checkpoint.allow_data_change): "
                "step %lld reads the new order's batch %lld\n",
                changes.c_str(), static_cast<long long>(meta.step),
                static_cast<long long>(meta.step));
  // The checkpoint's skip list joins the run's. The batches the steps before it read must stay
  // the same: a skip added below its position would shift them.
  const std::vector<int64_t> skips = merged_skip_list(run_skips, meta.skipped_batches);
  if (skips_below(skips, meta.sampler_position) != skips_below(meta.skipped_batches,
                                                                meta.sampler_position) &&
      !c.checkpoint.allow_data_change)
    throw Error("checkpoint '" + path + "' is at global batch " +
                std::to_string(meta.sampler_position) + " with skipped_batches " +
                skip_list_text(meta.skipped_batches) + ", but train.skip_batches in " +
                c.source + " skips " + skip_list_text(skips_below(skips, meta.sampler_position)) +
                " below it: resuming would not continue where it stopped; set "
                "checkpoint.allow_data_change = true to resume anyway");
  return skips;
}

}  // namespace

CheckpointContent plan_checkpoint(const Config& c, const CheckpointedState& state,
                                  CheckpointProgress progress) {
  CheckpointContent content{c, std::move(progress), {}, {}, {}, {}, {}};
  for_each_checkpoint_tensor(c.model, state.model.params(), [&](const CheckpointTensor& t) {
    TensorShare share = share_of(t, state);
    content.tensors.push_back(
        {t.dataset(kWeightsRoot), t.dataset(kExpAvgRoot), t.dataset(kExpAvgSqRoot),
         t.global.global_shape,
         share.writes_weights ? std::move(share.weights) : std::vector<Run>{},
         share.writes_moments ? std::move(share.moments) : std::vector<Run>{}});
  });
  for (const Fp8StateDataset& d : fp8_state_datasets(c))
    content.fp8.push_back({d.name, d.shape,
                           writes_fp8_layer(state, d.layer)
                               ? state.model.fp8_delayed()->layer_state(d.layer)
                               : std::vector<float>{}});
  return content;
}

CheckpointBuffers checkpoint_buffers(const CheckpointedState& state) {
  const int64_t moments = state.optimizer.exp_avg().size();
  return {{state.model.weights(), state.optimizer.exp_avg().data(),
           state.optimizer.exp_avg_sq().data()},
          {state.model.weight_store().size(), moments, moments}};
}

std::string write_training_checkpoint(const CheckpointContent& content, MPI_Comm comm,
                                      bool report, const std::string& resumed_from,
                                      CommWatchdog* watchdog, const char* how) {
  const Config& c = content.config;
  const int64_t step = content.progress.step;
  auto fill = [&](CheckpointWriter& w) {
    // Every rank makes every write (they are collective); a rank's runs are the parts it
    // writes, none for the copies another rank writes.
    for (const CheckpointContent::Tensor& t : content.tensors) {
      w.write_tensor(t.weights, t.shape, t.weight_runs, content.weights);
      w.write_tensor(t.exp_avg, t.shape, t.moment_runs, content.exp_avg);
      w.write_tensor(t.exp_avg_sq, t.shape, t.moment_runs, content.exp_avg_sq);
    }
    for (const CheckpointContent::Fp8Layer& f : content.fp8) {
      const auto n = static_cast<int64_t>(f.rows.size());
      w.write_tensor(f.name, f.shape, n ? std::vector<Run>{{0, 0, n}} : std::vector<Run>{},
                     f.rows);
    }
    write_checkpoint_attributes(w, c, content.progress);
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::string path;
  {
    const CommWatchdog::IoScope io(
        watchdog,
        "writing checkpoint '" +
            (std::filesystem::path(c.checkpoint.dir) / checkpoint_name(step)).string() + "'");
    path = write_checkpoint(c.checkpoint.dir, step, comm, fill);
  }
  const double seconds = seconds_since(t0);
  if (report) {
    std::vector<std::string> protect = {path};
    if (!resumed_from.empty()) protect.push_back(resumed_from);
    prune_checkpoints(c.checkpoint.dir, c.checkpoint.keep, protect);
    const double mb = std::filesystem::file_size(path) / 1e6;
    std::printf("checkpoint %s written (step %lld%s): %.1f MB in %.3f s, %.1f MB/s\n",
                path.c_str(), static_cast<long long>(step), how, mb, seconds, mb / seconds);
    std::fflush(stdout);
  }
  return path;
}

std::string save_training_checkpoint(const Config& c, const CheckpointedState& state,
                                     const CheckpointProgress& progress, MPI_Comm comm,
                                     bool report, const std::string& resumed_from,
                                     CommWatchdog* watchdog) {
  const HostState host(state);
  CheckpointContent content = plan_checkpoint(c, state, progress);
  content.weights = host.weights;
  content.exp_avg = host.exp_avg;
  content.exp_avg_sq = host.exp_avg_sq;
  return write_training_checkpoint(content, comm, report, resumed_from, watchdog);
}

std::string agreed_checkpoint_at_or_before(const std::string& dir, int64_t max_step,
                                           MPI_Comm comm) {
  std::string found;
  if (ckpt::comm_rank(comm) == 0)
    for (const CheckpointEntry& e : list_checkpoints(dir))
      if (e.step <= max_step) found = e.path;  // by increasing step: the newest that qualifies
  return ckpt::bcast_string(comm, found, 0);
}

ResumedProgress load_training_checkpoint(const std::string& path, const Config& c,
                                         const std::vector<int64_t>& run_skips,
                                         const CheckpointedState& state, MPI_Comm comm,
                                         bool report, CommWatchdog* watchdog) {
  const auto t0 = std::chrono::steady_clock::now();
  const CommWatchdog::IoScope io(watchdog, "reading checkpoint '" + path + "'");
  // The same checks as `trident ckpt info --verify`: the metadata and schema here, the
  // checksums and values of every tensor as it is read (checkpoint_reader_options).
  CheckpointReader reader(path, comm, checkpoint_reader_options());
  ResumedProgress out;
  out.meta = check_checkpoint(reader);
  // The model must be the config's; everything else may differ (the layout above all).
  check_checkpoint_compatible(reader, out.meta, c.model, c.source, "checkpoint '" + path + "'");
  out.skipped_batches = resumed_skip_list(path, out.meta, c, run_skips, report);
  HostState host(state);  // a GPU rank's copies: padding keeps the device's values
  // Every rank reads its whole shard; reads are collective like the writes.
  for_each_checkpoint_tensor(c.model, state.model.params(), [&](const CheckpointTensor& t) {
    const TensorShare share = share_of(t, state);
    const std::vector<int64_t>& shape = t.global.global_shape;
    reader.read_tensor(t.dataset(kWeightsRoot), shape, share.weights, host.weights,
                       counted_if(share.writes_weights));
    reader.read_tensor(t.dataset(kExpAvgRoot), shape, share.moments, host.exp_avg,
                       counted_if(share.writes_moments));
    reader.read_tensor(t.dataset(kExpAvgSqRoot), shape, share.moments, host.exp_avg_sq,
                       counted_if(share.writes_moments));
  });
  reader.finish();  // the tensors' checksums and values, on every rank
  read_fp8_state(reader, c, state, comm, report);
  reader.close();
  state.optimizer.set_updates(out.meta.optimizer_updates);
  host.to_device(state);
  state.model.weights_changed();
  if (report) {
    const double seconds = seconds_since(t0);
    const double mb = std::filesystem::file_size(path) / 1e6;
    std::printf("checkpoint %s read: %.1f MB in %.3f s, %.1f MB/s\n", path.c_str(), mb, seconds,
                mb / seconds);
  }
  if (out.meta.step > c.train.steps)
    throw Error("checkpoint '" + path + "' is at step " + std::to_string(out.meta.step) +
                ", past train.steps = " + std::to_string(c.train.steps));
  return out;
}

int64_t load_checkpoint_weights(const std::string& path, const Config& config, StageModel& model,
                                const std::function<bool(const ParamInfo&)>& counts_checksum,
                                MPI_Comm comm, CommWatchdog* watchdog) {
  const CommWatchdog::IoScope io(watchdog, "reading checkpoint '" + path + "'");
  CheckpointReader reader(path, comm, checkpoint_reader_options());
  const CheckpointMeta meta = check_checkpoint(reader);
  check_checkpoint_compatible(reader, meta, config.model, config.source,
                              "train.init_from '" + path + "'");
  read_model_weights(reader, model, counts_checksum);
  reader.close();  // verifies the checksums and values of everything read, on every rank
  return meta.step;
}

void read_model_weights(CheckpointReader& reader, StageModel& model,
                        const std::function<bool(const ParamInfo&)>& counts_checksum) {
  const int64_t n = model.weight_store().size();
  Device& device = model.device();
  std::vector<float> staging;
  if (!device.is_host()) staging.resize(static_cast<size_t>(n));
  float* weights = device.is_host() ? model.weights() : staging.data();
  for_each_checkpoint_tensor(model.config(), model.params(), [&](const CheckpointTensor& t) {
    const ParamInfo* p = t.local;
    const auto runs = p ? state_runs(*p, model.weight_store().ranges) : std::vector<Run>{};
    reader.read_tensor(t.dataset(kWeightsRoot), t.global.global_shape, runs,
                       {weights, static_cast<size_t>(n)},
                       counted_if(p && p->counted_in_norm && counts_checksum(*p)));
  });
  if (!device.is_host())
    device.from_host(model.weights(), weights, n * static_cast<int64_t>(sizeof(float)));
  model.weights_changed();
}

}  // namespace trident
