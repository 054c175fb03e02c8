// trident plan: the predicted step time and memory of every valid parallel layout of a model
// on a described cluster (lib/plan, docs/plan.md), the best ones as a table and the best as
// ready --set overrides. Pure computation on rank 0; no device, no data.
#include <mpi.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli_numbers.hpp"
#include "commands.hpp"
#include "config/config.hpp"
#include "model/model_stats.hpp"
#include "plan/cost_model.hpp"
#include "plan/hardware.hpp"
#include "util/error.hpp"

namespace trident {

void add_plan_command(CLI::App& app, PlanOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "plan", "Predict step time and memory of every parallel layout on a cluster; pick the best");
  add_config_options(*cmd, options.configs, options.overrides);
  cmd->add_option("--hardware", options.hardware, "Hardware file (configs/hardware/*.toml)")
      ->required();
  cmd->add_option("--nodes", options.nodes, "Nodes of the cluster")->required();
  cmd->add_option("--global-batch", options.global_batch,
                  "Sequences per step (default: the config's train.global_batch)")
      ->check(whole_number(1));
  cmd->add_option("--top", options.top, "Layouts to print (default 10)");
  cmd->add_flag("--json", options.json, "Print JSON instead of the table");
  cmd->add_flag("--wide", options.wide,
                "Every column of the table: each time and memory part, tokens/s, TFLOP/s "
                "(default: what fits 120 columns)");
  cmd->add_option("--layout", options.layout,
                  "Only layouts with these values, e.g. tensor=8,pipeline=2,recompute=full");
  // Modelling another system than Trident's trainer (validation against published runs).
  cmd->add_option("--attention", options.attention,
                  "materialized | fused (default: the trainer's backend for the device kind)")
      ->check(CLI::IsMember({"materialized", "fused"}));
  cmd->add_flag("--no-dp-overlap", options.no_dp_overlap,
                "The DP gradient reduction does not overlap backward");
  cmd->add_flag("--attention-dropout", options.attention_dropout,
                "Dropout on the materialized attention probabilities (its memory passes)");
  // A precision the config does not say (a mixture of experts, whose kernels are fp32, planned
  // for a bf16 run).
  cmd->add_option("--precision", options.precision,
                  "fp32 | bf16 | fp8: the precision modelled (default: the config's "
                  "train.precision)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp8"}));
}

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

nlohmann::json warnings_json(const std::vector<PlanWarning>& warnings) {
  nlohmann::json out = nlohmann::json::array();
  for (const PlanWarning& w : warnings) out.push_back({{"kind", w.kind}, {"text", w.text}});
  return out;
}

nlohmann::json to_json(const PlanProblem& problem, const Prediction& p, int64_t global_batch) {
  const Layout& l = p.layout;
  return {{"layout",
           {{"tensor", l.tp}, {"context", l.cp}, {"pipeline", l.pp}, {"data", l.dp},
            {"micro_batch", l.micro_batch},
            {"schedule", to_string(l.schedule)}, {"virtual_stages", l.virtual_stages},
            {"zero", l.zero_stage}, {"sequence_parallel", l.sequence_parallel},
            {"recompute", to_string(l.recompute)}, {"expert", l.ep},
            {"pipeline_balance", l.balance}}},
          {"microbatches", p.microbatches},
          {"step_seconds", p.step_seconds},
          {"time",
           {{"compute", p.time.compute}, {"tp_comm", p.time.tp_comm}, {"bubble", p.time.bubble},
            {"pp_transfer", p.time.pp_transfer}, {"ep_comm", p.time.ep_comm},
            {"cp_comm", p.time.cp_comm}, {"dp_exposed", p.time.dp_exposed},
            {"optimizer", p.time.optimizer}, {"checkpoint", p.time.checkpoint}}},
          {"memory_bytes",
           {{"weights", p.memory.weights}, {"gradients", p.memory.gradients},
            {"optimizer", p.memory.optimizer}, {"activations", p.memory.activations},
            {"buffers", p.memory.buffers}, {"checkpoint_staging", p.memory.staging},
            {"total", p.memory.total()},
            {"fullest_stage", p.fullest_stage}}},
          {"fits", p.fits},
          {"tokens_per_second", p.tokens_per_second},
          {"tflops_per_device", p.tflops_per_device},
          {"mfu", p.mfu},
          {"dp_reduction",
           {{"gradient_bytes", p.dp_gradient_bytes}, {"seconds", p.dp_reduce_seconds},
            {"backward_window_seconds", p.dp_window_seconds},
            {"assumed_hidden_seconds", p.dp_hidden_seconds},
            {"reduced_bytes_per_step", p.dp_reduced_bytes},
            {"gathered_bytes_per_step", p.dp_gathered_bytes}}},
          {"context_ring",
           {{"block_bytes", p.cp_block_bytes},
            {"forward_bytes_per_layer", p.cp_forward_bytes_per_layer},
            {"transfer_seconds", p.cp_ring_seconds}, {"exposed_seconds", p.time.cp_comm}}},
          {"compute_parts",
           {{"gemm_seconds", p.compute_gemm_seconds},
            {"attention_seconds", p.compute_attention_seconds},
            {"memory_seconds", p.compute_memory_seconds},
            {"head_seconds", p.compute_head_seconds}}},
          {"fp8",
           {{"layers", p.fp8_layers}, {"gemm_seconds", p.fp8_gemm_seconds},
            {"quantise_bytes", p.fp8_quantise_bytes},
            {"quantise_seconds", p.fp8_quantise_seconds},
            {"amax_all_reduces", p.fp8_amax_reductions},
            {"amax_seconds", p.fp8_amax_seconds}, {"scratch_bytes", p.fp8_scratch_bytes}}},
          {"checkpoint",
           {{"modelled", problem.models_checkpoints()},
            {"interval", problem.checkpoint_interval},
            {"asynchronous", problem.checkpoint_async},
            {"bytes", p.checkpoint_bytes}, {"write_seconds", p.checkpoint_write_seconds},
            {"staging_bytes", p.checkpoint_staging_bytes},
            {"staging_seconds", p.checkpoint_staging_seconds},
            {"stall_seconds", p.checkpoint_stall_seconds},
            {"backlog", p.checkpoint_backlog}}},
          {"warnings", warnings_json(layout_warnings(problem, p))},
          {"set", layout_overrides(p.layout, global_batch)}};
}

// The warn column: each warning's letter, in their fixed order.
std::string warning_codes(const std::vector<PlanWarning>& warnings) {
  std::string codes;
  for (const PlanWarning& w : warnings) codes += w.code;
  return codes.empty() ? "-" : codes;
}

// --wide: every column, each time and memory part apart. With MoE layers (`moe`) two more
// columns: the expert-parallel degree and its all-to-alls.
void print_wide_table(const PlanProblem& problem, const std::vector<Prediction>& ranked,
                      size_t top, bool moe) {
  std::printf("%4s %3s %3s %3s %4s%s %3s %-11s %4s %-5s %2s %2s %-9s %9s | %8s %7s%s %7s %7s "
              "%7s %7s %7s %7s | %8s %7s %7s %7s %7s %7s | %10s %7s %6s %s\n",
              "#", "TP", "CP", "PP", "DP", moe ? "  EP" : "", "mb", "schedule", "v", "split", "Z",
              "SP", "recompute", "step s", "compute", "tp", moe ? "      ep" : "", "cp", "bubble",
              "pp", "dp", "optim", "ckpt", "mem GiB", "wts", "grads", "opt", "acts", "bufs",
              "tokens/s",
              "TFLOP/s", "MFU", "warn");
  for (size_t i = 0; i < ranked.size() && i < top; ++i) {
    const Prediction& p = ranked[i];
    const Layout& l = p.layout;
    char ep[16] = "", ep_time[16] = "";
    if (moe) {
      std::snprintf(ep, sizeof ep, " %3lld", static_cast<long long>(l.ep));
      std::snprintf(ep_time, sizeof ep_time, " %7.3g", p.time.ep_comm);
    }
    std::printf("%4zu %3lld %3lld %3lld %4lld%s %3lld %-11s %4lld %-5s %2d %2d %-9s %9.4g | "
                "%8.3g %7.3g%s %7.3g %7.3g %7.3g %7.3g %7.3g %7.3g | %7.3g%s %7.3g %7.3g %7.3g "
                "%7.3g %7.3g | %10.4g %7.4g %5.1f%% %s\n",
                i + 1, static_cast<long long>(l.tp), static_cast<long long>(l.cp),
                static_cast<long long>(l.pp), static_cast<long long>(l.dp), ep,
                static_cast<long long>(l.micro_batch), to_string(l.schedule).c_str(),
                static_cast<long long>(l.virtual_stages), l.balance.c_str(), l.zero_stage,
                l.sequence_parallel ? 1 : 0, to_string(l.recompute).c_str(), p.step_seconds,
                p.time.compute, p.time.tp_comm, ep_time, p.time.cp_comm, p.time.bubble,
                p.time.pp_transfer, p.time.dp_exposed, p.time.optimizer, p.time.checkpoint,
                p.memory.total() / kGiB, p.fits ? " " : "!", p.memory.weights / kGiB,
                p.memory.gradients / kGiB, p.memory.optimizer / kGiB,
                p.memory.activations / kGiB, (p.memory.buffers + p.memory.staging) / kGiB,
                p.tokens_per_second,
                p.tflops_per_device, 100.0 * p.mfu,
                warning_codes(layout_warnings(problem, p)).c_str());
  }
}

// The default table, within 120 columns (118 with the EP column): the layout, the step time
// and its shares (compute; communication: TP, EP, the exposed CP ring, pipeline transfers and
// the exposed DP reduction; bubble; optimizer), the memory of the fullest device, MFU and the
// warnings' letters.
void print_table(const PlanProblem& problem, const std::vector<Prediction>& ranked, size_t top,
                 bool moe) {
  std::printf("%4s %3s %3s %3s %4s%s %3s %-11s %2s %-5s %1s %2s %-9s %8s %5s %5s %5s %5s %8s  "
              "%5s %s\n",
              "#", "TP", "CP", "PP", "DP", moe ? "  EP" : "", "mb", "schedule", "v", "split", "Z",
              "SP", "recompute", "step s", "comp%", "comm%", "bub%", "opt%", "mem GiB", "MFU%",
              "warn");
  for (size_t i = 0; i < ranked.size() && i < top; ++i) {
    const Prediction& p = ranked[i];
    const Layout& l = p.layout;
    char ep[16] = "";
    if (moe) std::snprintf(ep, sizeof ep, " %3lld", static_cast<long long>(l.ep));
    const double step = p.step_seconds > 0.0 ? p.step_seconds : 1.0;
    auto share = [step](double seconds) { return 100.0 * seconds / step; };
    const double comm = p.time.tp_comm + p.time.ep_comm + p.time.cp_comm + p.time.pp_transfer +
                        p.time.dp_exposed;
    std::printf("%4zu %3lld %3lld %3lld %4lld%s %3lld %-11s %2lld %-5s %1d %2d %-9s %8.4g %5.1f "
                "%5.1f %5.1f %5.1f %8.3g%s %5.1f %s\n",
                i + 1, static_cast<long long>(l.tp), static_cast<long long>(l.cp),
                static_cast<long long>(l.pp), static_cast<long long>(l.dp), ep,
                static_cast<long long>(l.micro_batch),
                to_string(l.schedule).c_str(), static_cast<long long>(l.virtual_stages),
                l.balance.c_str(), l.zero_stage, l.sequence_parallel ? 1 : 0,
                to_string(l.recompute).c_str(), p.step_seconds, share(p.time.compute),
                share(comm), share(p.time.bubble), share(p.time.optimizer),
                p.memory.total() / kGiB, p.fits ? " " : "!", 100.0 * p.mfu,
                warning_codes(layout_warnings(problem, p)).c_str());
  }
}

// `text` after `lead`, its words wrapped within 120 columns, continuation lines indented 4.
void print_wrapped(const std::string& lead, const std::string& text) {
  constexpr size_t kColumns = 120;
  std::string line = lead;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(at, end - at);
    const bool fresh = line.find_first_not_of(' ') == std::string::npos;
    if (!fresh && line.size() + 1 + word.size() > kColumns) {
      std::printf("%s\n", line.c_str());
      line = "    ";
    }
    line += (line.find_first_not_of(' ') == std::string::npos ? "" : " ") + word;
    at = end + 1;
  }
  std::printf("%s\n", line.c_str());
}

// The warnings in full: the plan's own, then the best layout's; the other rows' are their
// letters in the warn column. Nothing when there are none.
void print_warnings(const PlanProblem& problem, const std::vector<Prediction>& ranked,
                    size_t top) {
  const std::vector<PlanWarning> all = problem_warnings(problem);
  const std::vector<PlanWarning> best = layout_warnings(problem, ranked.front());
  bool listed = false;  // any listed row with a warning
  for (size_t i = 0; i < ranked.size() && i < top && !listed; ++i)
    listed = !layout_warnings(problem, ranked[i]).empty();
  if (all.empty() && !listed) return;
  print_wrapped("warnings", "(warn: m micro-batches per stage, h memory headroom, b bubble, o "
                            "overlap assumed, r context ring exposed, x context group across "
                            "nodes, c checkpoints; docs/plan.md \"Warnings\"):");
  for (const PlanWarning& w : all) print_wrapped("  every layout:", w.text);
  for (const PlanWarning& w : best) print_wrapped("  layout 1:", w.text);
}

// What checkpoints cost layout 1 (in its step time), or why they are not modelled: one line,
// nothing without periodic saves (checkpoint.interval with a checkpoint.dir).
void print_checkpoints(const PlanProblem& problem, const Prediction& p) {
  if (problem.checkpoint_interval <= 0) return;
  if (!problem.models_checkpoints()) {
    print_wrapped("checkpoints:", "a save every " + std::to_string(problem.checkpoint_interval) +
                                      " steps is not modelled: " + problem.hw.source +
                                      " has no storage.write_gbs (trident bench-hw "
                                      "--storage-dir DIR measures it; docs/plan.md "
                                      "\"Checkpoints\")");
    return;
  }
  char line[700];
  std::snprintf(line, sizeof line,
                "a save every %lld steps (%s): %s; training waits %.3g s a save, %.3g s a step "
                "on average (%.1f %% of layout 1's)%s",
                static_cast<long long>(problem.checkpoint_interval),
                problem.checkpoint_async ? "checkpoint.async" : "synchronous",
                checkpoint_save_text(problem, p).c_str(), p.checkpoint_stall_seconds,
                p.time.checkpoint, 100.0 * p.time.checkpoint / p.step_seconds,
                p.checkpoint_backlog ? "; the write outlasts the interval's steps" : "");
  print_wrapped("checkpoints:", line);
}

// The one line for a model that fits no layout: the layout that needs the least memory, and
// by how much it is short.
std::string nothing_fits(const PlanProblem& problem, const std::vector<Prediction>& ranked) {
  const Prediction* least = &ranked.front();
  for (const Prediction& p : ranked)
    if (p.memory.total() < least->memory.total()) least = &p;
  const MemoryUse& m = least->memory;
  const double capacity = problem.hw.device.memory_gib;
  char line[700];
  std::snprintf(line, sizeof line,
                "no layout fits: of %zu layouts on %lld x %lld devices of %.1f GiB, the "
                "smallest needs %.1f GiB per device (%s: weights %.1f, gradients %.1f, "
                "optimizer %.1f, activations %.1f, buffers %.1f GiB), %.1f GiB short; add "
                "nodes, a smaller micro-batch or a shorter model.seq_len",
                ranked.size(), static_cast<long long>(problem.nodes),
                static_cast<long long>(problem.hw.devices_per_node), capacity,
                m.total() / kGiB, to_string(least->layout).c_str(), m.weights / kGiB,
                m.gradients / kGiB, m.optimizer / kGiB, m.activations / kGiB, m.buffers / kGiB,
                m.total() / kGiB - capacity);
  return line;
}

// Why the trainer refuses layout `l` with the rest of config `c`, or "" when it accepts it: the
// config's own checks (parse_config with the layout's overrides). layout_problem knows the
// grid's rules; the config also knows what the trainer does not run yet with its other keys
// (e.g. context parallelism with train.device = "cuda" or eval.sample_interval > 0).
// `precision`: the precision planned where --precision says another than the config's (fp8
// with train.device = "cuda", which the trainer does not run yet); "" for the config's.
std::string trainer_refusal(const Config& c, const Layout& l, int64_t global_batch,
                            const std::string& precision = "") {
  std::vector<std::string> overrides = layout_overrides(l, global_batch);
  if (!precision.empty()) overrides.push_back("train.precision=" + precision);
  try {
    parse_config(c.to_toml(), c.source, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

PlanProblem problem_of(const Config& c, const std::string& hardware) {
  PlanProblem problem;
  problem.model = c.model;
  problem.global_batch = c.train.global_batch;
  problem.precision = c.train.precision;
  problem.fp8_skip_first = c.train.fp8_skip_first_layers;
  problem.fp8_skip_last = c.train.fp8_skip_last_layers;
  problem.fp8_delayed = c.train.fp8_recipe == "delayed";
  problem.dp_bucket_mb = c.parallel.dp_bucket_mb;
  problem.checkpoint_interval = c.checkpoint.dir.empty() ? 0 : c.checkpoint.interval;
  problem.checkpoint_async = c.checkpoint.saves_async();
  problem.hw = load_hardware(hardware);
  return problem;
}

// What the hardware file must have for the precision planned, checked before any layout: fp8
// on a GPU needs device.peak_tflops_fp8 (one line naming the file and the key).
void check_precision(const PlanProblem& problem) {
  problem.hw.peak_flops(problem.precision);
  if (problem.fp8()) problem.hw.fp8_gemm_flops();
}

// `value` as printf's `format` (one conversion of a double) prints it.
std::string printed(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

// train.precision = "fp8" in one sentence: the FP8 GEMMs' rate, the layers they cover, the
// rest's precision and the peak MFU is against (the base precision's: "bf16-equivalent",
// torchtitan's and Megatron-LM's convention for FP8 runs).
std::string fp8_text(const PlanProblem& problem) {
  const std::string base = problem.base_precision();
  char text[600];
  std::snprintf(text, sizeof text,
                "the linear GEMMs of %lld of %lld layers at %.4g TFLOP/s "
                "(train.fp8_skip_first_layers = %lld, train.fp8_skip_last_layers = %lld), "
                "their operands quantised at the memory bandwidth; the rest in %s; MFU against "
                "the %s peak (%s-equivalent)",
                static_cast<long long>(problem.fp8_layers()),
                static_cast<long long>(problem.model.layers), problem.hw.fp8_gemm_flops() / 1e12,
                static_cast<long long>(problem.fp8_skip_first),
                static_cast<long long>(problem.fp8_skip_last), base.c_str(), base.c_str(),
                base.c_str());
  return text;
}

}  // namespace

AutoLayout plan_layout_for_ranks(const Config& c, const std::string& hardware, int ranks) {
  PlanProblem problem = problem_of(c, hardware);
  if (const std::string why = plan_size_problem(problem, "train.global_batch"); !why.empty())
    throw Error("train --plan auto: " + why);
  check_precision(problem);
  const int64_t per_node = problem.hw.devices_per_node;
  if (ranks < per_node) {
    problem.hw.devices_per_node = ranks;  // one node, partly used
  } else if (ranks % per_node != 0) {
    throw Error("train --plan auto: " + std::to_string(ranks) + " ranks are not whole nodes of " +
                std::to_string(per_node) + " devices (devices_per_node of " + hardware + ")");
  } else {
    problem.nodes = ranks / per_node;
  }
  const std::vector<Layout> layouts = enumerate_layouts(problem, LayoutFilter{});
  if (layouts.empty())
    throw Error("train --plan auto: no valid layout of " + std::to_string(ranks) +
                " ranks for this model and train.global_batch = " +
                std::to_string(problem.global_batch) +
                " (TP must divide model.heads, model.kv_heads and the devices per node; "
                "micro-batch x DP must divide the global batch; 2 x CP must divide "
                "model.seq_len)");
  const std::vector<Prediction> all = rank_layouts(problem, layouts);
  if (!all.front().fits) throw Error("train --plan auto: " + nothing_fits(problem, all));
  // The fastest three the trainer runs with this config; the faster ones it refuses are said.
  std::vector<Prediction> ranked;
  size_t refused = 0;
  std::string first_refusal;
  for (const Prediction& p : all) {
    if (ranked.size() == 3 || (!p.fits && ranked.empty())) break;
    const std::string why = trainer_refusal(c, p.layout, problem.global_batch);
    if (why.empty()) {
      ranked.push_back(p);
    } else if (ranked.empty()) {
      if (refused++ == 0) first_refusal = to_string(p.layout) + ": " + why;
    }
  }
  if (ranked.empty())
    throw Error("train --plan auto: the trainer refuses every layout that fits with this config "
                "(the fastest, " + first_refusal + ")");
  AutoLayout chosen;
  chosen.overrides = layout_overrides(ranked.front().layout, problem.global_batch);
  char line[512];
  std::snprintf(line, sizeof line,
                "plan auto: %d rank(s) as %lld node(s) x %lld devices of %s; %zu valid layouts",
                ranks, static_cast<long long>(problem.nodes),
                static_cast<long long>(problem.hw.devices_per_node), problem.hw.name.c_str(),
                all.size());
  chosen.why = line;
  if (refused > 0)
    chosen.why += "\n  skipped " + std::to_string(refused) +
                  " faster layout(s) the trainer refuses with this config, the fastest " +
                  first_refusal;
  for (size_t i = 0; i < ranked.size() && i < 3; ++i) {
    const Prediction& p = ranked[i];
    std::snprintf(line, sizeof line,
                  "\n  %s %s: predicted %.4g s/step (compute %.3g, tensor %.3g, context %.3g, "
                  "bubble %.3g, pipeline %.3g, data %.3g, optimizer %.3g, checkpoint %.3g), %.3g "
                  "GiB of %.3g per device%s",
                  i == 0 ? "chosen" : "next  ", to_string(p.layout).c_str(), p.step_seconds,
                  p.time.compute, p.time.tp_comm, p.time.cp_comm, p.time.bubble,
                  p.time.pp_transfer, p.time.dp_exposed, p.time.optimizer, p.time.checkpoint,
                  p.memory.total() / kGiB,
                  problem.hw.device.memory_gib, p.fits ? "" : " (does not fit)");
    chosen.why += line;
  }
  std::vector<PlanWarning> warnings = problem_warnings(problem);
  for (PlanWarning& w : layout_warnings(problem, ranked.front())) warnings.push_back(w);
  for (const PlanWarning& w : warnings) chosen.why += "\n  warning: " + w.text;
  return chosen;
}

void run_plan(const PlanOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const Config c = load_configs(options.configs, options.overrides);
  if (options.nodes < 1)
    throw Error("plan --nodes = " + std::to_string(options.nodes) + " must be >= 1");
  if (options.top < 1) throw Error("plan --top must be >= 1");
  PlanProblem problem = problem_of(c, options.hardware);
  if (options.global_batch > 0) problem.global_batch = options.global_batch;
  if (options.global_batch < 0) throw Error("plan --global-batch must be >= 1");
  // The bounds of what a plan models (plan/cost_model.hpp), each naming its option.
  const int64_t per_node = problem.hw.devices_per_node;
  if (options.nodes > kPlanMaxDevices / per_node)
    throw Error("plan --nodes = " + std::to_string(options.nodes) + " is past the " +
                std::to_string(kPlanMaxDevices / per_node) + " nodes of " +
                std::to_string(per_node) + " devices a plan models (" +
                std::to_string(kPlanMaxDevices) + " devices)");
  problem.nodes = options.nodes;
  if (const std::string why = plan_size_problem(
          problem, options.global_batch > 0 ? "--global-batch" : "train.global_batch");
      !why.empty())
    throw Error("plan " + why);
  problem.attention = options.attention;
  problem.dp_overlap = !options.no_dp_overlap;
  problem.attention_dropout = options.attention_dropout;
  if (!options.precision.empty()) problem.precision = options.precision;
  check_precision(problem);
  const LayoutFilter filter = parse_layout_filter(options.layout);
  if (filter.pp > kPlanMaxPipeline)
    throw Error("plan --layout pipeline = " + std::to_string(filter.pp) + " is past the " +
                std::to_string(kPlanMaxPipeline) + " pipeline stages a plan models");
  // Deeper pipelines the model and the devices would allow are not listed: say so.
  const bool pipeline_capped = pipeline_cap_excludes(problem, filter);
  const std::string cap_note = "pipelines deeper than " + std::to_string(kPlanMaxPipeline) +
                               " stages are not modelled (model.layers = " +
                               std::to_string(c.model.layers) + ")";
  const std::vector<Layout> layouts = enumerate_layouts(problem, filter);
  if (layouts.empty()) {
    // A fully given layout says exactly why; otherwise name what must divide what.
    Layout l{filter.tp, filter.pp, filter.dp, filter.micro_batch,
             filter.schedule.empty() ? ScheduleKind::OneFOneB : parse_schedule_kind(filter.schedule),
             filter.virtual_stages ? filter.virtual_stages : 1, std::max(filter.zero_stage, 0),
             filter.sequence_parallel == 1,
             filter.recompute.empty() ? Recompute::None : parse_recompute(filter.recompute),
             filter.ep ? filter.ep : 1,
             filter.balance.empty() ? "even" : filter.balance,
             filter.cp ? filter.cp : 1};
    const std::string why = (filter.tp && filter.pp && filter.dp && filter.micro_batch)
                                ? ": " + layout_problem(problem, l)
                                : "";
    throw Error("no valid layout on " + std::to_string(options.nodes) + " node(s) x " +
                std::to_string(problem.hw.devices_per_node) + " devices = " +
                std::to_string(problem.devices()) + " devices" +
                (options.layout.empty() ? "" : " with --layout " + options.layout) +
                " (TP must divide the devices per node, model.heads and model.kv_heads; TP x "
                "CP x PP x DP = the devices; 2 x CP must divide model.seq_len; micro-batch x "
                "DP must divide the global batch " +
                std::to_string(problem.global_batch) + (pipeline_capped ? "; " + cap_note : "") +
                ")" + why);
  }
  const std::vector<Prediction> ranked = rank_layouts(problem, layouts);
  if (!ranked.front().fits) throw Error(nothing_fits(problem, ranked));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  size_t fitting = 0;
  for (const Prediction& p : ranked) fitting += p.fits ? 1 : 0;
  const size_t top = static_cast<size_t>(options.top);
  if (options.json) {
    nlohmann::json out = {{"config", c.source},         {"hardware", problem.hw.source},
                          {"nodes", problem.nodes},     {"devices", problem.devices()},
                          {"device_memory_gib", problem.hw.device.memory_gib},
                          {"global_batch", problem.global_batch},
                          {"precision", problem.precision},
                          {"mfu_peak_tflops", problem.hw.peak_flops(problem.precision) / 1e12},
                          {"mfu_peak_precision", problem.base_precision()},
                          {"layouts", ranked.size()},
                          {"fitting", fitting}, {"plan_seconds", seconds},
                          {"warnings", warnings_json(problem_warnings(problem))}};
    out["best"] = nlohmann::json::array();
    for (size_t i = 0; i < ranked.size() && i < top; ++i)
      out["best"].push_back(to_json(problem, ranked[i], problem.global_batch));
    std::printf("%s\n", out.dump(2).c_str());
    std::fflush(stdout);
    return;
  }
  const ModelConfig& m = c.model;
  // (Wrapped at the table's 120 columns: a config's path has any length.)
  print_wrapped("model:", c.source + " (" + m.arch + ", " + std::to_string(m.layers) +
                              " layers, width " + std::to_string(m.width) + ", " +
                              std::to_string(m.heads) + " heads, " +
                              std::to_string(m.kv_head_count()) + " kv heads, seq_len " +
                              std::to_string(m.seq_len) + "), " +
                              printed("%.3g", static_cast<double>(parameter_count(m)) / 1e9) +
                              " B parameters");
  if (m.moe_experts > 0)
    print_wrapped("mixture of experts:",
                  std::to_string(moe_layer_count(m)) + " of " + std::to_string(m.layers) +
                      " layers with " + std::to_string(m.moe_experts) + " experts, top-" +
                      std::to_string(m.moe_top_k) + ", capacity factor " +
                      printed("%g", m.moe_capacity_factor) + " (0: dropless), " +
                      printed("%.3g", static_cast<double>(active_parameter_count(m)) / 1e9) +
                      " B parameters active per token");
  std::printf("cluster: %s: %lld node(s) x %lld = %lld devices, %.1f GiB each, peak %.4g "
              "TFLOP/s %s\n",
              problem.hw.name.c_str(), static_cast<long long>(problem.nodes),
              static_cast<long long>(problem.hw.devices_per_node),
              static_cast<long long>(problem.devices()), problem.hw.device.memory_gib,
              problem.hw.peak_flops(problem.precision) / 1e12,
              problem.base_precision().c_str());
  if (problem.fp8()) print_wrapped("fp8:", fp8_text(problem));
  std::printf("global batch: %lld sequences (%lld tokens)\n",
              static_cast<long long>(problem.global_batch),
              static_cast<long long>(problem.global_batch * m.seq_len));
  std::printf("layouts: %zu valid, %zu fit in memory (! marks one that does not); times in "
              "seconds per step\n",
              ranked.size(), fitting);
  if (pipeline_capped) std::printf("%s\n", cap_note.c_str());
  std::printf("planned in %.2f s\n", seconds);
  if (options.wide)
    print_wide_table(problem, ranked, top, c.model.moe_experts > 0);
  else
    print_table(problem, ranked, top, c.model.moe_experts > 0);
  print_warnings(problem, ranked, top);
  print_checkpoints(problem, ranked.front());
  std::printf("best layout:\n ");
  for (const std::string& s : layout_overrides(ranked.front().layout, problem.global_batch))
    std::printf(" --set %s", s.c_str());
  std::printf("\n");
  // The plan models what the trainer is designed to run; say where this config cannot run it yet.
  const std::string refusal =
      trainer_refusal(c, ranked.front().layout, problem.global_batch, options.precision);
  if (!refusal.empty())
    print_wrapped("note:", "with this config the trainer refuses it: " + refusal);
  std::fflush(stdout);
}

}  // namespace trident
