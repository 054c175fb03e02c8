// trident generate --ckpt FILE [--tokenizer FILE] (--prompt TEXT | --prompt-file FILE |
//     --prompts FILE) [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
//     [--stop TOKEN] [--prompt-loss] [--set key=value]
// Text from a checkpoint's model through the trainer's model graph (Transformer::forward_decode:
// the training blocks and kernels, one token per sequence per step against a key/value cache),
// on the CPU or the GPU (--set train.device="cuda"), on one rank or under mpiexec with tensor
// parallelism: the launched ranks form one tensor group (parallel.tensor = the world size), and
// the checkpoint, whatever layout wrote it, is read into that layout by the trainer's reader.
// Every rank gets the whole logits (the vocab-parallel head's blocks all-gathered) and samples
// the same token; rank 0 prints.
//
// One prompt (--prompt, --prompt-file: the file's whole text) streams its tokens as they come.
// --prompts FILE runs one prompt per line as one batch and prints a line per prompt,
// "INDEX<TAB>TEXT" (newlines in the text written as \n). --prompt-loss also prints the mean
// cross-entropy of the prompt's tokens given those before them (the number the trainer's
// evaluation computes for the same window: tests/test_app_generate.cpp compares them).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "checkpoint/h5_file.hpp"
#include "cli_numbers.hpp"
#include "commands.hpp"
#include "config/config.hpp"
#include "grid/process_grid.hpp"
#include "runtime/backend.hpp"
#include "tokenizer/bpe_tokenizer.hpp"
#include "train/checkpointing.hpp"
#include "train/generation.hpp"
#include "train/training_checkpoint.hpp"
#include "util/error.hpp"
#include "util/input_file.hpp"

namespace trident {

void add_generate_command(CLI::App& app, GenerateOptions& options) {
  CLI::App* cmd = app.add_subcommand(
      "generate", "Sample text from a checkpoint's model (key/value cache; tensor parallel "
                  "under mpiexec)");
  cmd->add_option("--ckpt", options.checkpoint, "checkpoint file (any layout wrote it)")
      ->required();
  cmd->add_option("--tokenizer", options.tokenizer,
                  "Hugging Face tokenizer.json; default: byte-level (ids 0..255; a model of "
                  "model.vocab_size = 256 only)");
  auto* prompt = cmd->add_option("--prompt", options.prompt, "prompt text");
  auto* file = cmd->add_option("--prompt-file", options.prompt_file, "prompt text from a file");
  auto* prompts = cmd->add_option("--prompts", options.prompts_file,
                                  "one prompt per line, generated as one batch");
  prompt->excludes(file)->excludes(prompts);
  file->excludes(prompt)->excludes(prompts);
  prompts->excludes(prompt)->excludes(file);
  cmd->add_option("--max-new-tokens", options.max_new_tokens, "tokens to generate")
      ->check(whole_number(0));
  cmd->add_option("--temperature", options.temperature, "0: greedy (the most likely token)")
      ->check(finite_number(0.0, std::numeric_limits<double>::max()));
  cmd->add_option("--top-k", options.top_k, "sample among the k most likely tokens; 0: all")
      ->check(whole_number(0));
  cmd->add_option("--top-p", options.top_p,
                  "sample among the most likely tokens whose probabilities sum to p (nucleus)")
      ->check(finite_number(0.0, 1.0));
  cmd->add_option("--seed", options.seed, "sampling seed");
  cmd->add_option("--stop", options.stop,
                  "a token (e.g. <|endoftext|>) that ends a sequence when sampled (not printed)");
  cmd->add_flag("--prompt-loss", options.prompt_loss,
                "also print the mean cross-entropy of the prompt (each token given those before)");
  cmd->add_option("--set", options.overrides,
                  "Override a key of the stored config: section.key=value (repeatable; e.g. "
                  "train.device=\"cuda\", train.precision=\"bf16\")")
      ->take_all();
}

namespace {

// A prompt file: a regular text file of at most 64 MiB (many times any model.seq_len in text).
std::string read_text(const std::string& path, const std::string& option) {
  return read_input_file(path, {option + " " + path, "prompt", int64_t{64} << 20,
                                option + " needs a text file"});
}

// The prompts' texts: one, or a line each of --prompts (a last empty line ignored).
std::vector<std::string> prompt_texts(const GenerateOptions& o) {
  if (!o.prompts_file.empty()) {
    std::vector<std::string> lines;
    std::istringstream in(read_text(o.prompts_file, "--prompts"));
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    if (lines.empty()) throw Error("--prompts '" + o.prompts_file + "': no prompts in it");
    return lines;
  }
  if (!o.prompt_file.empty()) return {read_text(o.prompt_file, "--prompt-file")};
  if (o.prompt.empty()) throw Error("generate: give --prompt TEXT, --prompt-file or --prompts FILE");
  return {o.prompt};
}

// The stored config with the job's layout (one tensor group of all launched ranks) and the
// user's overrides; pipeline and data parallelism are refused (generation runs the whole model
// on each rank of one group).
Config generate_config(const GenerateOptions& o, const std::string& stored_toml, int world) {
  std::vector<std::string> overrides = {
      "checkpoint.dir=\"\"", "train.init_from=\"\"", "train.exit_interval=0",
      "train.exit_after_minutes=0", "train.max_bad_steps=0", "log.dir=\"\"",
      "log.tensorboard=false", "log.trace=false", "parallel.tensor=" + std::to_string(world),
      "parallel.pipeline=1",
      "parallel.context=1", "parallel.pipeline_layers=[]", "parallel.schedule=\"1f1b\"",
      "parallel.sequence_parallel=false", "parallel.data=1", "eval.sample_interval=0"};
  overrides.insert(overrides.end(), o.overrides.begin(), o.overrides.end());
  const Config config = parse_config(stored_toml, o.checkpoint + " (stored config)", overrides);
  if (config.parallel.pipeline != 1 || config.parallel.data != 1 || config.parallel.context != 1)
    throw Error("generate: parallel.pipeline = " + std::to_string(config.parallel.pipeline) +
                ", parallel.data = " + std::to_string(config.parallel.data) +
                ", parallel.context = " + std::to_string(config.parallel.context) +
                ": generation runs tensor parallelism only (launch parallel.tensor ranks)");
  if (config.parallel.tensor != world)
    throw Error("generate: parallel.tensor = " + std::to_string(config.parallel.tensor) +
                " but " + std::to_string(world) + " ranks were launched");
  return config;
}

// A "<|name|>" in a prompt that the tokenizer has no token for is refused: it would be encoded
// as plain text, which is never what such a marker means (a typo, or another model's token).
void check_special_tokens(const std::string& text, const BpeTokenizer& tokenizer,
                          const std::string& which) {
  for (size_t at = text.find("<|"); at != std::string::npos; at = text.find("<|", at + 2)) {
    const size_t end = text.find("|>", at + 2);
    if (end == std::string::npos) return;
    const std::string marker = text.substr(at, end + 2 - at);
    if (marker.find_first_of(" \t\n<", 1) != std::string::npos) continue;  // not one marker
    if (tokenizer.token_id(marker) < 0)
      throw Error("generate: " + which + " has '" + marker + "', which the tokenizer has no " +
                  "special token for (" + std::to_string(tokenizer.vocab_size()) + " ids)");
  }
}

void write_bytes(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

std::string one_line(const std::string& text) {
  std::string out;
  for (const char c : text) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return out;
}

// -log softmax(logits)[target], in double.
double cross_entropy(const float* logits, int64_t V, int32_t target) {
  const float max = *std::max_element(logits, logits + V);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  return std::log(sum) - (static_cast<double>(logits[target]) - max);
}

}  // namespace

void run_generate(const GenerateOptions& options) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::vector<std::string> texts = prompt_texts(options);
  const BpeTokenizer tokenizer = options.tokenizer.empty()
                                     ? BpeTokenizer::bytes()
                                     : BpeTokenizer::from_file(options.tokenizer);
  int32_t stop_token = -1;
  if (!options.stop.empty()) {
    stop_token = tokenizer.token_id(options.stop);
    if (stop_token < 0)
      throw Error("--stop '" + options.stop + "': not one token of the tokenizer (" +
                  std::to_string(tokenizer.vocab_size()) + " ids)");
  }
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < texts.size(); ++i) {
    check_special_tokens(texts[i], tokenizer,
                         texts.size() == 1 ? "the prompt" : "prompt " + std::to_string(i));
    prompts.push_back(tokenizer.encode(texts[i]));
  }

  CheckpointReader reader(options.checkpoint, MPI_COMM_WORLD, checkpoint_reader_options());
  const Config config = generate_config(options, check_checkpoint(reader).config.to_toml(), world);
  const ModelConfig& m = config.model;
  if (m.moe_experts > 0)
    throw Error("generate: checkpoint '" + options.checkpoint + "' has model.moe_experts = " +
                std::to_string(m.moe_experts) +
                ": the key/value-cache decoder has no mixture of experts yet (docs/moe.md)");
  // Bytes on a model of another vocabulary (a BPE one's) would decode nonsense, silently.
  if (options.tokenizer.empty() && m.vocab_size != tokenizer.vocab_size())
    throw Error("generate: checkpoint '" + options.checkpoint + "' has model.vocab_size = " +
                std::to_string(m.vocab_size) + " but no --tokenizer was given: the default, " +
                "byte-level (256 ids), is a 256-id model's; pass the tokenizer.json its data " +
                "was made with");
  if (tokenizer.vocab_size() > m.vocab_size)
    throw Error("generate: the tokenizer has " + std::to_string(tokenizer.vocab_size()) +
                " ids but the checkpoint's model.vocab_size is " + std::to_string(m.vocab_size));
  ProcessGrid grid(MPI_COMM_WORLD, config);
  set_rank_threads(config, grid);
  const ParallelDims& dims = grid.dims();
  ModelShard shard = ModelShard::whole(m);
  shard.tp_rank = dims.tensor().index;
  shard.tp_size = dims.tensor().size;
  const Config engine_config = agree_cpu_bf16_gemm(config, MPI_COMM_WORLD, nullptr);
  Backend backend = make_backend(engine_config, dims, shard);
  StageModel& model = *backend.model;
  read_model_weights(reader, model, [](const ParamInfo&) { return true; });
  reader.close();  // checksums checked here

  const bool batch = !options.prompts_file.empty();
  const bool printing = rank == 0;
  double loss_sum = 0;
  GenerateCallbacks callbacks;
  if (options.prompt_loss)
    callbacks.on_logits = [&](int64_t row, int64_t position, const float* logits) {
      if (row == 0 && position + 1 < static_cast<int64_t>(prompts[0].size()))
        loss_sum += cross_entropy(logits, m.vocab_size, prompts[0][position + 1]);
    };
  // One prompt streams its text as it comes; with --prompt-loss the text follows the loss line,
  // written once at the end.
  if (!batch && printing && !options.prompt_loss) {
    write_bytes(texts[0]);
    callbacks.on_token = [&](int64_t, int32_t id) { write_bytes(tokenizer.decode({id})); };
  }
  GenerateRequest request;
  request.max_new_tokens = options.max_new_tokens;
  request.sampling = {options.temperature, options.top_k, options.top_p, options.seed};
  request.sample_vocab = tokenizer.vocab_size();
  request.stop_token = stop_token;
  const auto generated = generate_tokens(model, prompts, request, callbacks);
  if (!printing) return;
  if (options.prompt_loss) {
    if (prompts[0].size() < 2) throw Error("--prompt-loss needs a prompt of at least 2 tokens");
    std::printf("prompt loss %.17g over %zu tokens\n", loss_sum / (prompts[0].size() - 1),
                prompts[0].size() - 1);
    if (!batch) {
      write_bytes(texts[0]);
      for (const int32_t id : generated[0]) write_bytes(tokenizer.decode({id}));
    }
  }
  if (batch)
    for (size_t i = 0; i < texts.size(); ++i)
      write_bytes(std::to_string(i) + "\t" +
                  one_line(texts[i] + tokenizer.decode(generated[i])) + "\n");
  else
    write_bytes("\n");
  for (size_t i = 0; i < generated.size(); ++i)
    if (static_cast<int64_t>(generated[i].size()) < options.max_new_tokens &&
        static_cast<int64_t>(prompts[i].size() + generated[i].size()) > m.seq_len)
      std::fprintf(stderr, "generate: %s stopped after %zu new tokens: model.seq_len (%lld) "
                   "reached\n", batch ? ("prompt " + std::to_string(i)).c_str() : "the text",
                   generated[i].size(), static_cast<long long>(m.seq_len));
}

}  // namespace trident
