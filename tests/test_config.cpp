// Configuration: defaults, every rejection class (the message names the file and the key),
// `--set` overrides, to_toml round trip, files, and docs/config.md staying in sync.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <toml++/toml.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.hpp"
#include "config/schema.hpp"
#include "config/toml_nesting.hpp"
#include "sanitizer.hpp"
#include "util/error.hpp"

namespace trident {
namespace {

const std::string kSrc = "configs/x.toml";
// The smallest valid file: data.train has no default.
const std::string kBase = "[data]\ntrain = \"data/train_*.bin\"\n";

// Parses kBase + `extra` (+ overrides) and returns the error message; fails if nothing throws.
std::string error_of(const std::string& extra, const std::vector<std::string>& overrides = {},
                     const std::string& base = kBase) {
  try {
    parse_config(base + extra, kSrc, overrides);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a trident::Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "accepted:\n" << extra;
  return "";
}

// The message must be exactly `expected` (which starts after "configs/x.toml: ").
#define EXPECT_ERROR(extra, expected) EXPECT_EQ(error_of(extra), kSrc + ": " + (expected))
#define EXPECT_OVERRIDE_ERROR(overrides, expected) \
  EXPECT_EQ(error_of("", overrides), kSrc + ": " + (expected))

Config parse(const std::string& extra, const std::vector<std::string>& overrides = {}) {
  return parse_config(kBase + extra, kSrc, overrides);
}

// A section with one key set to a value, e.g. section_with("model.layers", "0").
std::string section_with(const std::string& key, const std::string& value) {
  const size_t dot = key.find('.');
  return "[" + key.substr(0, dot) + "]\n" + key.substr(dot + 1) + " = " + value + "\n";
}

// kBase with data.train replaced, for keys in [data].
std::string set_key(const std::string& key, const std::string& value) {
  if (key.rfind("data.", 0) == 0)
    return "[data]\n" + (key == "data.train" ? "" : std::string("train = \"x.bin\"\n")) +
           key.substr(5) + " = " + value + "\n";
  return kBase + section_with(key, value);
}

std::string error_of_key(const std::string& key, const std::string& value) {
  return error_of(set_key(key, value), {}, "");
}

bool bits_equal(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Every field, written out independently of the schema (so a key missing from it shows up).
void expect_same(const Config& a, const Config& b) {
  EXPECT_EQ(a.model.arch, b.model.arch);
  EXPECT_EQ(a.model.layers, b.model.layers);
  EXPECT_EQ(a.model.heads, b.model.heads);
  EXPECT_EQ(a.model.kv_heads, b.model.kv_heads);
  EXPECT_EQ(a.model.width, b.model.width);
  EXPECT_EQ(a.model.ffn_width, b.model.ffn_width);
  EXPECT_EQ(a.model.vocab_size, b.model.vocab_size);
  EXPECT_EQ(a.model.seq_len, b.model.seq_len);
  EXPECT_EQ(a.model.vocab_multiple, b.model.vocab_multiple);
  EXPECT_EQ(a.model.tie_embeddings, b.model.tie_embeddings);
  EXPECT_TRUE(bits_equal(a.model.norm_eps, b.model.norm_eps));
  EXPECT_TRUE(bits_equal(a.model.rope_theta, b.model.rope_theta));
  EXPECT_EQ(a.model.moe_experts, b.model.moe_experts);
  EXPECT_EQ(a.model.moe_top_k, b.model.moe_top_k);
  EXPECT_TRUE(bits_equal(a.model.moe_aux_loss_coeff, b.model.moe_aux_loss_coeff));
  EXPECT_TRUE(bits_equal(a.model.moe_z_loss_coeff, b.model.moe_z_loss_coeff));
  EXPECT_TRUE(bits_equal(a.model.moe_capacity_factor, b.model.moe_capacity_factor));
  EXPECT_EQ(a.model.moe_layer_interval, b.model.moe_layer_interval);
  EXPECT_EQ(a.parallel.expert, b.parallel.expert);
  EXPECT_EQ(a.parallel.tensor, b.parallel.tensor);
  EXPECT_EQ(a.parallel.pipeline, b.parallel.pipeline);
  EXPECT_EQ(a.parallel.data, b.parallel.data);
  EXPECT_EQ(a.parallel.ranks_per_node, b.parallel.ranks_per_node);
  EXPECT_EQ(a.parallel.schedule, b.parallel.schedule);
  EXPECT_EQ(a.parallel.sequence_parallel, b.parallel.sequence_parallel);
  EXPECT_EQ(a.parallel.pipeline_layers, b.parallel.pipeline_layers);
  EXPECT_TRUE(bits_equal(a.parallel.dp_bucket_mb, b.parallel.dp_bucket_mb));
  EXPECT_EQ(a.train.steps, b.train.steps);
  EXPECT_EQ(a.train.seed, b.train.seed);
  EXPECT_EQ(a.train.micro_batch, b.train.micro_batch);
  EXPECT_EQ(a.train.global_batch, b.train.global_batch);
  EXPECT_EQ(a.train.threads, b.train.threads);
  EXPECT_EQ(a.train.device, b.train.device);
  EXPECT_EQ(a.train.precision, b.train.precision);
  EXPECT_TRUE(bits_equal(a.train.exit_after_minutes, b.train.exit_after_minutes));
  EXPECT_EQ(a.train.exit_interval, b.train.exit_interval);
  EXPECT_TRUE(bits_equal(a.optim.lr, b.optim.lr));
  EXPECT_TRUE(bits_equal(a.optim.min_lr, b.optim.min_lr));
  EXPECT_EQ(a.optim.warmup_steps, b.optim.warmup_steps);
  EXPECT_TRUE(bits_equal(a.optim.weight_decay, b.optim.weight_decay));
  EXPECT_TRUE(bits_equal(a.optim.beta1, b.optim.beta1));
  EXPECT_TRUE(bits_equal(a.optim.beta2, b.optim.beta2));
  EXPECT_TRUE(bits_equal(a.optim.eps, b.optim.eps));
  EXPECT_TRUE(bits_equal(a.optim.grad_clip, b.optim.grad_clip));
  EXPECT_EQ(a.optim.zero_stage, b.optim.zero_stage);
  EXPECT_EQ(a.optim.decay_position_embedding, b.optim.decay_position_embedding);
  EXPECT_EQ(a.data.train, b.data.train);
  EXPECT_EQ(a.data.val, b.data.val);
  EXPECT_EQ(a.data.shuffle, b.data.shuffle);
  EXPECT_EQ(a.eval.interval, b.eval.interval);
  EXPECT_EQ(a.eval.steps, b.eval.steps);
  EXPECT_EQ(a.checkpoint.dir, b.checkpoint.dir);
  EXPECT_EQ(a.checkpoint.interval, b.checkpoint.interval);
  EXPECT_EQ(a.checkpoint.keep, b.checkpoint.keep);
  EXPECT_EQ(a.log.dir, b.log.dir);
  EXPECT_EQ(a.log.interval, b.log.interval);
}

// A valid configuration with every field different from its default.
Config everything_changed() {
  Config c;
  c.model = {.arch = "llama", .layers = 6, .heads = 3, .kv_heads = 1, .width = 96,
             .ffn_width = 200, .vocab_size = 128256, .seq_len = 128, .vocab_multiple = 8,
             .tie_embeddings = true, .norm_eps = 1e-6, .rope_theta = 500000.5,
             // moe_experts stays 0 (its keys are still read and written): the CUDA device
             // below refuses experts, and parallel.expert > 1 needs them.
             .moe_top_k = 3, .moe_aux_loss_coeff = 0.1 / 3, .moe_z_loss_coeff = 1e-3,
             .moe_capacity_factor = 1.25, .moe_layer_interval = 2};
  c.parallel.tensor = 2;
  c.parallel.pipeline = 3;
  c.parallel.data = 2;
  c.parallel.ranks_per_node = 4;
  c.parallel.schedule = "gpipe";
  c.parallel.sequence_parallel = true;
  c.parallel.pipeline_layers = {1, 2, 3};
  c.parallel.dp_bucket_mb = 12.5;
  c.train.steps = 1000;
  c.train.seed = -7;
  c.train.micro_batch = 3;
  c.train.global_batch = 36;
  c.train.threads = 5;
  c.train.device = "cuda";
  c.train.precision = "bf16";
  c.train.cpu_bf16_gemm = "onednn";
  c.train.exit_after_minutes = 1.0 / 3.0;
  c.train.exit_interval = 7;
  c.optim.lr = 0.1 + 0.2;
  c.optim.min_lr = 6e-5 / 7;
  c.optim.warmup_steps = 17;
  c.optim.weight_decay = 1e300;
  c.optim.beta1 = 0.8;
  c.optim.beta2 = 0.999;
  c.optim.eps = 5e-324;
  c.optim.grad_clip = 0.0;
  c.optim.zero_stage = 1;
  c.optim.decay_position_embedding = true;
  c.data.train = {"data/\"quoted\" \\back\\slash\\ x_*.bin"};
  c.data.val = {"2:tab\there\nnewline \x01\x7f ünïcødé €", "0.5:b.bin"};  // a blend
  c.data.shuffle = true;
  c.eval.interval = 50;
  c.eval.steps = 3;
  c.checkpoint.dir = "C:\\ckpt\\'single' \"\"\" # not a comment";
  c.checkpoint.interval = 100;
  c.checkpoint.keep = 5;
  c.log.dir = "";
  c.log.interval = 10;
  return c;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::path(testing::TempDir()) /
          ("trident_test_config_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// ---------------------------------------------------------------------------------------------
// Defaults and derived figures

TEST(ConfigDefaults, MinimalFileGivesStructDefaults) {
  Config expected;
  expected.data.train = {"data/train_*.bin"};
  const Config c = parse("");
  expect_same(c, expected);
  EXPECT_EQ(c.source, kSrc);
  // The documented defaults, spelled out.
  EXPECT_EQ(c.model.layers, 2);
  EXPECT_EQ(c.model.heads, 4);
  EXPECT_EQ(c.model.width, 64);
  EXPECT_EQ(c.model.vocab_size, 256);
  EXPECT_EQ(c.model.arch, "gpt2");
  EXPECT_EQ(c.model.kv_heads, 0);
  EXPECT_EQ(c.model.kv_head_count(), 4);
  EXPECT_EQ(c.model.ffn_width, 0);
  EXPECT_EQ(c.model.ffn_size(), 256);
  EXPECT_TRUE(c.model.tie_embeddings);
  EXPECT_EQ(c.model.norm_eps, 1e-5);
  EXPECT_EQ(c.model.rope_theta, 10000.0);
  EXPECT_EQ(c.parallel.schedule, "1f1b");
  EXPECT_EQ(c.parallel.dp_bucket_mb, 25.0);
  EXPECT_EQ(c.train.device, "cpu");
  EXPECT_EQ(c.train.precision, "fp32");
  EXPECT_EQ(c.optim.lr, 6e-4);
  EXPECT_EQ(c.log.dir, "runs/default");
}

TEST(ConfigDefaults, DerivedFigures) {
  const Config c = parse(
      "[model]\nseq_len = 32\n[parallel]\ndata = 2\n[train]\nmicro_batch = 3\n"
      "global_batch = 24\n");
  EXPECT_EQ(c.num_microbatches(), 4);
  EXPECT_EQ(c.tokens_per_step(), 24 * 32);
}

TEST(ConfigDefaults, EmptySectionsAndInlineTablesAreFine) {
  const Config c = parse_config(
      "optim = { lr = 0.001, beta1 = 0.5 }\n[model]\n[eval]\n" + kBase, kSrc);
  EXPECT_EQ(c.optim.lr, 0.001);
  EXPECT_EQ(c.optim.beta1, 0.5);
}

// ---------------------------------------------------------------------------------------------
// Unknown names

TEST(ConfigReject, UnknownKey) {
  EXPECT_ERROR("[model]\nwidht = 64\n", "unknown key 'model.widht'");
  EXPECT_EQ(error_of_key("data.shufle", "true"), kSrc + ": unknown key 'data.shufle'");
}

TEST(ConfigReject, UnknownSection) {
  EXPECT_ERROR("[modle]\nwidth = 64\n", "unknown section 'modle'");
  EXPECT_ERROR("[model.sub]\nx = 1\n", "unknown key 'model.sub'");
}

TEST(ConfigReject, TopLevelKey) {
  EXPECT_EQ(error_of("steps = 3\n", {}, ""), kSrc + ": unknown key 'steps'");
}

TEST(ConfigReject, SectionThatIsNotATable) {
  EXPECT_EQ(error_of("model = 3\n", {}, ""), kSrc + ": model: expected a table, got integer 3");
  EXPECT_EQ(error_of("[[model]]\nlayers = 3\n", {}, ""),
            kSrc + ": model: expected a table, got array [{...}]");
}

// ---------------------------------------------------------------------------------------------
// Types

TEST(ConfigReject, StringWhereIntegerExpected) {
  EXPECT_ERROR("[model]\nheads = \"four\"\n",
               "model.heads: expected an integer, got string \"four\"");
}

TEST(ConfigReject, FloatWhereIntegerExpected) {
  EXPECT_ERROR("[model]\nlayers = 2.5\n", "model.layers: expected an integer, got float 2.5");
  EXPECT_ERROR("[model]\nlayers = 2.0\n", "model.layers: expected an integer, got float 2.0");
}

TEST(ConfigReject, BoolAndIntegerAreStrict) {
  EXPECT_ERROR("[train]\nsteps = true\n", "train.steps: expected an integer, got boolean true");
  EXPECT_EQ(error_of_key("data.shuffle", "1"),
            kSrc + ": data.shuffle: expected a boolean, got integer 1");
  EXPECT_ERROR("[optim]\nlr = false\n", "optim.lr: expected a float, got boolean false");
}

TEST(ConfigReject, OtherTypeMismatches) {
  EXPECT_ERROR("[train]\ndevice = 1\n", "train.device: expected a string, got integer 1");
  EXPECT_ERROR("[optim]\nlr = \"0.1\"\n", "optim.lr: expected a float, got string \"0.1\"");
  EXPECT_ERROR("[model]\nlayers = [2]\n", "model.layers: expected an integer, got array [2]");
  EXPECT_ERROR("[model]\nlayers = { n = 2 }\n", "model.layers: expected an integer, got table");
  EXPECT_ERROR("[log]\ndir = 2024-01-02\n", "log.dir: expected a string, got date 2024-01-02");
  EXPECT_ERROR("[parallel]\npipeline_layers = 2\n",
               "parallel.pipeline_layers: expected an array of integers, got integer 2");
  EXPECT_ERROR("[parallel]\npipeline = 2\npipeline_layers = [1, 1.5]\n",
               "parallel.pipeline_layers[1]: expected an integer, got float 1.5");
}

TEST(ConfigTypes, IntegerWhereFloatExpectedIsConverted) {
  const Config c = parse("[optim]\nlr = 1\nmin_lr = 0\n[parallel]\ndp_bucket_mb = 100\n");
  EXPECT_EQ(c.optim.lr, 1.0);
  EXPECT_EQ(c.optim.min_lr, 0.0);
  EXPECT_EQ(c.parallel.dp_bucket_mb, 100.0);
}

TEST(ConfigTypes, SyntaxErrorHasLineAndColumn) {
  const std::string msg = error_of("[model]\nlayers = = 3\n");
  EXPECT_EQ(msg.rfind(kSrc + ":4:", 0), 0u) << msg;  // kBase is two lines
  EXPECT_NE(msg.find("syntax error"), std::string::npos) << msg;
  const std::string dup = error_of("[model]\nlayers = 3\nlayers = 4\n");
  EXPECT_EQ(dup.rfind(kSrc + ":5:", 0), 0u) << dup;
}

// ---------------------------------------------------------------------------------------------
// Values of single keys

TEST(ConfigReject, SizesMustBePositive) {
  for (const char* key :
       {"model.layers", "model.heads", "model.width", "model.vocab_size", "model.seq_len",
        "model.vocab_multiple", "parallel.tensor", "parallel.pipeline", "parallel.data",
        "train.steps", "train.micro_batch", "train.global_batch", "eval.steps",
        "log.interval"}) {
    SCOPED_TRACE(key);
    for (const char* bad : {"0", "-1"}) {
      const std::string expected = std::string(key) + " (" + bad + ") must be ";
      const std::string msg = error_of_key(key, bad);
      EXPECT_EQ(msg.rfind(kSrc + ": " + expected, 0), 0u) << msg;
    }
  }
  EXPECT_EQ(error_of_key("model.layers", "0"), kSrc + ": model.layers (0) must be >= 1");
}

TEST(ConfigReject, CountsMustBeNonNegative) {
  for (const char* key : {"parallel.ranks_per_node", "optim.warmup_steps", "eval.interval",
                          "checkpoint.interval"}) {
    SCOPED_TRACE(key);
    EXPECT_EQ(error_of_key(key, "-1"), kSrc + ": " + key + " (-1) must be >= 0");
    EXPECT_NO_THROW(parse_config(set_key(key, "0"), kSrc));
  }
}

// Issue 22 item 11: train.threads = 100000 spun for ten minutes creating threads.
TEST(ConfigReject, ThreadsAreBounded) {
  EXPECT_EQ(error_of_key("train.threads", "-1"),
            kSrc + ": train.threads (-1) must be in [0, 1024] (more threads than a rank's "
                   "share of cores only slow a run down)");
  EXPECT_EQ(error_of_key("train.threads", "100000"),
            kSrc + ": train.threads (100000) must be in [0, 1024] (more threads than a rank's "
                   "share of cores only slow a run down)");
  EXPECT_NO_THROW(parse_config(set_key("train.threads", "0"), kSrc));
  EXPECT_NO_THROW(parse_config(set_key("train.threads", "1024"), kSrc));
}

// Issue 22 item 13: sizes whose element counts overflow int64 are refused at validation,
// naming the key; legitimately large configs (configs/llama_3.1_8b.toml) still load.
TEST(ConfigReject, SizesBeyondSixtyFourBitCounts) {
  EXPECT_ERROR(section_with("model.seq_len", "10000000000"),
               "model.seq_len (10000000000) is too large: the attention matrix of one "
               "micro-batch, train.micro_batch * model.heads * model.seq_len^2 = 4 * 4 * "
               "10000000000^2 elements, overflows a 64-bit size");
  EXPECT_ERROR("[train]\nglobal_batch = 4611686018427387904\n",
               "train.global_batch * model.seq_len (4611686018427387904 * 64 = "
               "295147905179352825856 tokens per step) overflows a 64-bit count");
}

TEST(ConfigReject, KeepMustBePositive) {
  EXPECT_EQ(error_of_key("checkpoint.keep", "0"), kSrc + ": checkpoint.keep (0) must be >= 1");
  EXPECT_NO_THROW(parse_config(set_key("checkpoint.keep", "1"), kSrc));
}

// The uint16 limit of the token shards is checked when the shards are opened (TokenDataset),
// not here: a Llama-3 vocabulary (128256) is a valid configuration.
TEST(ConfigReject, VocabUpToInt32Max) {
  EXPECT_ERROR("[model]\nvocab_size = 2147483648\n",
               "model.vocab_size (2147483648) must be in [1, 2147483647]");
  EXPECT_EQ(parse("[model]\nvocab_size = 65536\n").model.vocab_size, 65536);
  EXPECT_EQ(parse("[model]\nvocab_size = 65537\n").model.vocab_size, 65537);
  EXPECT_EQ(parse("[model]\nvocab_size = 128256\n").model.vocab_size, 128256);
  EXPECT_EQ(parse("[model]\nvocab_size = 2147483647\n").model.vocab_size, 2147483647);
}

TEST(ConfigReject, ModelArchitecture) {
  EXPECT_ERROR("[model]\narch = \"mistral\"\n",
               "model.arch (\"mistral\") must be gpt2 or llama");
  EXPECT_ERROR("[model]\narch = \"Llama\"\n", "model.arch (\"Llama\") must be gpt2 or llama");
  EXPECT_ERROR("[model]\narch = \"\"\n", "model.arch (\"\") must be gpt2 or llama");
  // A value from --set names the override, not the file (issue 56: it named the file).
  EXPECT_EQ(error_of("", {"model.arch=gpt3"}),
            "--set: model.arch (\"gpt3\") must be gpt2 or llama");
  EXPECT_EQ(error_of("[train]\nsteps = 5\n", {"train.steps=0"}),
            "--set: train.steps (0) must be >= 1");
  EXPECT_TRUE(parse("[model]\narch = \"llama\"\n").model.is_llama());
  EXPECT_FALSE(parse("[model]\narch = \"gpt2\"\n").model.is_llama());
}

TEST(ConfigReject, LlamaKeysSingleValues) {
  EXPECT_ERROR("[model]\nkv_heads = -1\n", "model.kv_heads (-1) must be >= 0");
  EXPECT_ERROR("[model]\nffn_width = -1\n", "model.ffn_width (-1) must be >= 0");
  EXPECT_ERROR("[model]\nnorm_eps = 0\n", "model.norm_eps (0.0) must be > 0");
  EXPECT_ERROR("[model]\nnorm_eps = -1e-5\n", "model.norm_eps (-1e-5) must be > 0");
  EXPECT_ERROR("[model]\nrope_theta = 0\n", "model.rope_theta (0.0) must be > 0");
  EXPECT_ERROR("[model]\nrope_theta = nan\n", "model.rope_theta (nan) must be finite");
  EXPECT_ERROR("[model]\ntie_embeddings = 1\n",
               "model.tie_embeddings: expected a boolean, got integer 1");
  const Config c = parse("[model]\nkv_heads = 0\nffn_width = 0\nrope_theta = 500000\n");
  EXPECT_EQ(c.model.kv_head_count(), c.model.heads);
  EXPECT_EQ(c.model.rope_theta, 500000.0);
}

TEST(ConfigReject, LearningRate) {
  EXPECT_ERROR("[optim]\nlr = 0\nmin_lr = 0\n", "optim.lr (0.0) must be > 0");
  EXPECT_ERROR("[optim]\nlr = -0.001\nmin_lr = 0\n", "optim.lr (-0.001) must be > 0");
  EXPECT_ERROR("[optim]\nmin_lr = -1e-5\n", "optim.min_lr (-1e-5) must be >= 0");
  EXPECT_ERROR("[optim]\nlr = 0.001\nmin_lr = 0.002\n",
               "optim.min_lr (0.002) must be <= optim.lr (0.001)");
  EXPECT_NO_THROW(parse("[optim]\nlr = 0.001\nmin_lr = 0.001\n"));
  EXPECT_NO_THROW(parse("[optim]\nmin_lr = 0\n"));
}

TEST(ConfigReject, Betas) {
  EXPECT_ERROR("[optim]\nbeta1 = 1.0\n", "optim.beta1 (1.0) must be in [0, 1)");
  EXPECT_ERROR("[optim]\nbeta2 = -0.1\n", "optim.beta2 (-0.1) must be in [0, 1)");
  EXPECT_ERROR("[optim]\nbeta2 = 1\n", "optim.beta2 (1.0) must be in [0, 1)");
  EXPECT_NO_THROW(parse("[optim]\nbeta1 = 0\nbeta2 = 0.999999\n"));
}

TEST(ConfigReject, EpsClipDecay) {
  EXPECT_ERROR("[optim]\neps = 0\n", "optim.eps (0.0) must be > 0");
  EXPECT_ERROR("[optim]\ngrad_clip = -1\n", "optim.grad_clip (-1.0) must be >= 0");
  EXPECT_ERROR("[optim]\nweight_decay = -0.1\n", "optim.weight_decay (-0.1) must be >= 0");
  EXPECT_NO_THROW(parse("[optim]\ngrad_clip = 0\nweight_decay = 0\n"));
}

TEST(ConfigReject, NonFiniteFloats) {
  EXPECT_ERROR("[optim]\nlr = nan\n", "optim.lr (nan) must be finite");
  EXPECT_ERROR("[parallel]\ndp_bucket_mb = inf\n", "parallel.dp_bucket_mb (inf) must be finite");
  EXPECT_ERROR("[train]\nexit_after_minutes = -inf\n",
               "train.exit_after_minutes (-inf) must be finite");
}

// parallel.schedule = "interleaved" and parallel.virtual_stages: one line per broken relation.
TEST(ConfigReject, Interleaved) {
  // 8 layers, 4 micro-batches of 2 sequences per step.
  const std::string base = "[model]\nlayers = 8\n[train]\nmicro_batch = 2\nglobal_batch = 8\n";
  const Config ok = parse(base + "[parallel]\npipeline = 2\nschedule = \"interleaved\"\n"
                                 "virtual_stages = 2\n");
  EXPECT_EQ(ok.parallel.virtual_stages, 2);
  EXPECT_EQ(parse(base).parallel.virtual_stages, 1);
  EXPECT_ERROR(base + "[parallel]\npipeline = 2\nschedule = \"interleaved\"\n",
               "parallel.schedule = \"interleaved\" needs parallel.virtual_stages >= 2 model "
               "chunks per stage (it is 1)");
  EXPECT_ERROR(base + "[parallel]\npipeline = 2\nvirtual_stages = 2\n",
               "parallel.virtual_stages (2) > 1 needs parallel.schedule = \"interleaved\" (it "
               "is \"1f1b\")");
  EXPECT_ERROR(base + "[parallel]\nvirtual_stages = 0\n",
               "parallel.virtual_stages (0) must be >= 1");
  EXPECT_ERROR(base + "[parallel]\nschedule = \"interleaved\"\nvirtual_stages = 2\n",
               "parallel.schedule = \"interleaved\" needs parallel.pipeline >= 2 (it is 1)");
  EXPECT_ERROR(base + "[parallel]\npipeline = 2\nschedule = \"interleaved\"\n"
                      "virtual_stages = 3\n",
               "model.layers (8) must be divisible by parallel.pipeline * "
               "parallel.virtual_stages (2 * 3 = 6) under parallel.schedule = \"interleaved\"");
  EXPECT_ERROR(base + "[parallel]\npipeline = 4\ndata = 2\nschedule = \"interleaved\"\n"
                      "virtual_stages = 2\n",
               "parallel.schedule = \"interleaved\" needs the micro-batches per step (2 = "
               "train.global_batch / (train.micro_batch * parallel.data)) to be a multiple of "
               "parallel.pipeline (4)");
  EXPECT_ERROR(base + "[parallel]\npipeline = 2\nschedule = \"interleaved\"\n"
                      "virtual_stages = 2\npipeline_layers = [4, 4]\n",
               "parallel.pipeline_layers cannot be used with parallel.schedule = "
               "\"interleaved\": its chunks are model.layers / (parallel.pipeline * "
               "parallel.virtual_stages) layers each");
  // parallel.pipeline_balance: "even" (default) or "flops", the latter alone choosing the split.
  EXPECT_EQ(parse(base).parallel.pipeline_balance, "even");
  EXPECT_EQ(parse(base + "[parallel]\npipeline = 2\npipeline_balance = \"flops\"\n")
                .parallel.pipeline_balance,
            "flops");
  EXPECT_ERROR(base + "[parallel]\npipeline = 2\nschedule = \"interleaved\"\n"
                      "virtual_stages = 2\npipeline_balance = \"flops\"\n",
               "parallel.pipeline_balance = \"flops\" cannot be used with parallel.schedule = "
               "\"interleaved\": its chunks are model.layers / (parallel.pipeline * "
               "parallel.virtual_stages) layers each");
  EXPECT_ERROR(base + "[parallel]\npipeline = 2\npipeline_layers = [5, 3]\n"
                      "pipeline_balance = \"flops\"\n",
               "parallel.pipeline_balance = \"flops\" chooses the split that "
               "parallel.pipeline_layers ([5, 3]) gives: set one of them");
  EXPECT_ERROR(base + "[parallel]\npipeline_balance = \"memory\"\n",
               "parallel.pipeline_balance (\"memory\") must be even or flops");
}

TEST(ConfigReject, ZeroStage) {
  EXPECT_ERROR("[optim]\nzero_stage = 4\n", "optim.zero_stage (4) must be 0, 1, 2 or 3");
  EXPECT_ERROR("[optim]\nzero_stage = -1\n", "optim.zero_stage (-1) must be 0, 1, 2 or 3");
  EXPECT_ERROR("[optim]\nzero_stage = \"3\"\n",
               "optim.zero_stage: expected an integer, got string \"3\"");
  EXPECT_ERROR("[optim]\nzero_stage = 2.5\n",
               "optim.zero_stage: expected an integer, got float 2.5");
  for (int stage = 0; stage <= 3; ++stage)
    EXPECT_EQ(parse("[optim]\nzero_stage = " + std::to_string(stage) + "\n").optim.zero_stage,
              stage);
}

TEST(ConfigReject, Choices) {
  EXPECT_ERROR("[parallel]\nschedule = \"zero\"\n",
               "parallel.schedule (\"zero\") must be 1f1b, gpipe, interleaved, zb-h1 or zb-h2");
  EXPECT_EQ(parse("[parallel]\nschedule = \"zb-h1\"\n").parallel.schedule, "zb-h1");
  EXPECT_EQ(parse("[parallel]\nschedule = \"zb-h2\"\n").parallel.schedule, "zb-h2");
  EXPECT_ERROR("[train]\ndevice = \"gpu\"\n", "train.device (\"gpu\") must be cpu or cuda");
  EXPECT_ERROR("[train]\ndevice = \"CPU\"\n", "train.device (\"CPU\") must be cpu or cuda");
  EXPECT_ERROR("[train]\nprecision = \"fp16\"\n",
               "train.precision (\"fp16\") must be fp32, bf16 or fp8");
  const Config c = parse(
      "[parallel]\nschedule = \"gpipe\"\n[train]\ndevice = \"cuda\"\nprecision = \"bf16\"\n");
  EXPECT_EQ(c.parallel.schedule, "gpipe");
  EXPECT_EQ(c.train.device, "cuda");
  EXPECT_EQ(c.train.precision, "bf16");
}

// train.precision = "fp8" must leave a layer in FP8: the default skips (first 1, last 1) take
// both layers of a 2-layer model, which would train in the base precision under fp8's name.
TEST(ConfigReject, Fp8LeavesALayerInFp8) {
  EXPECT_ERROR("[train]\nprecision = \"fp8\"\n",
               "train.precision = \"fp8\": train.fp8_skip_first_layers (1) + "
               "train.fp8_skip_last_layers (1) leave none of model.layers (2) in FP8; lower them "
               "(0 puts every layer in FP8)");
  EXPECT_ERROR("[model]\nlayers = 4\n[train]\nprecision = \"fp8\"\n"
               "fp8_skip_first_layers = 0\nfp8_skip_last_layers = 9223372036854775807\n",
               "train.precision = \"fp8\": train.fp8_skip_first_layers (0) + "
               "train.fp8_skip_last_layers (9223372036854775807) leave none of model.layers (4) "
               "in FP8; lower them (0 puts every layer in FP8)");
  EXPECT_ERROR("[model]\nlayers = 4\n[train]\nprecision = \"fp8\"\n"
               "fp8_skip_first_layers = 9223372036854775807\n",
               "train.precision = \"fp8\": train.fp8_skip_first_layers (9223372036854775807) + "
               "train.fp8_skip_last_layers (1) leave none of model.layers (4) in FP8; lower them "
               "(0 puts every layer in FP8)");
  // One layer left in FP8 is enough; the skips mean nothing in the other precisions.
  EXPECT_EQ(parse("[model]\nlayers = 3\n[train]\nprecision = \"fp8\"\n").train.precision, "fp8");
  EXPECT_EQ(parse("[train]\nprecision = \"fp8\"\nfp8_skip_first_layers = 0\n")
                .train.fp8_skip_last_layers,
            1);
  EXPECT_EQ(parse("[train]\nfp8_skip_first_layers = 5\n").train.precision, "fp32");
}

TEST(ConfigReject, BucketSize) {
  EXPECT_ERROR("[parallel]\ndp_bucket_mb = 0\n", "parallel.dp_bucket_mb (0.0) must be > 0");
  EXPECT_ERROR("[parallel]\ndp_bucket_mb = -2.5\n",
               "parallel.dp_bucket_mb (-2.5) must be > 0");
  EXPECT_EQ(parse("[parallel]\ndp_bucket_mb = 0.5\n").parallel.dp_bucket_mb, 0.5);
}

TEST(ConfigReject, ExitAfterMinutesNegative) {
  EXPECT_ERROR("[train]\nexit_after_minutes = -1\n",
               "train.exit_after_minutes (-1.0) must be >= 0");
}

TEST(ConfigReject, EmptyTrainData) {
  EXPECT_EQ(error_of("", {}, ""), kSrc + ": data.train must not be empty");
  EXPECT_EQ(error_of("[data]\ntrain = \"\"\n", {}, ""), kSrc + ": data.train must not be empty");
  EXPECT_EQ(error_of("[data]\ntrain = []\n", {}, ""), kSrc + ": data.train must not be empty");
}

// Blends (docs/data.md): an array of "WEIGHT:SOURCE", from the file or from --set.
TEST(ConfigBlend, ArraysOfWeightedEntries) {
  const Config c = parse_config(
      "[data]\ntrain = [\"0.7:data/web/part\", \"0.3:data/code/train_*.bin\"]\n"
      "val = [\"1:v1.bin\", \"1:v2\"]\n", kSrc);
  EXPECT_EQ(c.data.train,
            (std::vector<std::string>{"0.7:data/web/part", "0.3:data/code/train_*.bin"}));
  EXPECT_EQ(c.data.val, (std::vector<std::string>{"1:v1.bin", "1:v2"}));
  // to_toml writes a blend as an array and reads it back; one entry stays a plain string.
  EXPECT_NE(c.to_toml().find("train = [\"0.7:data/web/part\", \"0.3:data/code/train_*.bin\"]"),
            std::string::npos) << c.to_toml();
  EXPECT_EQ(parse_config(c.to_toml(), kSrc).data.train, c.data.train);
  EXPECT_NE(parse("").to_toml().find("train = \"data/train_*.bin\"\nval = \"\"\n"),
            std::string::npos);
  EXPECT_EQ(parse("", {"data.train=[\"2:a.bin\", \"1:b\"]"}).data.train,
            (std::vector<std::string>{"2:a.bin", "1:b"}));
}

TEST(ConfigBlend, BadEntriesNameTheFileTheKeyAndTheEntry) {
  EXPECT_EQ(error_of("[data]\ntrain = [\"0.7:a\", \"b.bin\"]\n", {}, ""),
            kSrc + ": data.train[1] = \"b.bin\": expected WEIGHT:PATH (a weight, a colon, a "
                   "shard path or glob or an indexed dataset's prefix)");
  EXPECT_EQ(error_of("[data]\ntrain = [\"-0.7:a\", \"1:b\"]\n", {}, ""),
            kSrc + ": data.train[0] = \"-0.7:a\": the weight must be > 0");
  EXPECT_EQ(error_of("[data]\ntrain = [\"1:a\", \"nan:b\"]\n", {}, ""),
            kSrc + ": data.train[1] = \"nan:b\": the weight is not a finite number");
  EXPECT_EQ(error_of("", {"data.val=[\"1:v\", \"2:v\"]"}),
            kSrc + ": data.val[1] = \"2:v\": the dataset 'v' is already in the blend");
  EXPECT_EQ(error_of("[data]\ntrain = [\"1:a\", 2]\n", {}, ""),
            kSrc + ": data.train[1]: expected a string, got integer 2");
  EXPECT_EQ(error_of("[data]\ntrain = 3\n", {}, ""),
            kSrc + ": data.train: expected a string or an array of strings, got integer 3");
}

// ---------------------------------------------------------------------------------------------
// Relations between keys

TEST(ConfigReject, WidthNotDivisibleByHeads) {
  EXPECT_ERROR("[model]\nwidth = 100\nheads = 3\n",
               "model.width (100) must be divisible by model.heads (3)");
}

TEST(ConfigReject, KvHeadsMustDivideHeads) {
  EXPECT_ERROR("[model]\nheads = 4\nkv_heads = 3\n",
               "model.kv_heads (3) must divide model.heads (4): each key/value head serves a "
               "whole group of query heads");
  EXPECT_ERROR("[model]\nheads = 4\nkv_heads = 8\n",
               "model.kv_heads (8) must divide model.heads (4): each key/value head serves a "
               "whole group of query heads");
  for (int kv : {1, 2, 4}) {
    SCOPED_TRACE(kv);
    const Config c = parse("[model]\nheads = 4\nkv_heads = " + std::to_string(kv) + "\n");
    EXPECT_EQ(c.model.kv_head_count(), kv);
  }
}

TEST(ConfigReject, LlamaHeadSizeMustBeEven) {
  EXPECT_ERROR("[model]\narch = \"llama\"\nwidth = 60\nheads = 4\n",
               "model.width / model.heads (60 / 4 = 15) must be even with model.arch = "
               "\"llama\" (RoPE rotates pairs)");
  // gpt2 has no rotary embedding: an odd head size is fine.
  EXPECT_EQ(parse("[model]\nwidth = 60\nheads = 4\n").model.head_size(), 15);
  EXPECT_EQ(parse("[model]\narch = \"llama\"\nwidth = 64\nheads = 4\n").model.head_size(),
            16);
}

TEST(ConfigReject, WidthTooLargeForTheDefaultMlp) {
  EXPECT_ERROR("[model]\nwidth = 4611686018427387904\nheads = 1\n",
               "model.width (4611686018427387904) is too large for the default MLP size "
               "(model.ffn_width = 0)");
  EXPECT_NO_THROW(parse("[model]\nwidth = 4611686018427387904\nheads = 1\nffn_width = 1\n"));
}

TEST(ConfigArch, FfnSizeDefaultsByArchitecture) {
  EXPECT_EQ(parse("[model]\nwidth = 768\nheads = 12\n").model.ffn_size(), 3072);
  // llama: 8/3 * width rounded up to a multiple of 256.
  EXPECT_EQ(parse("[model]\narch = \"llama\"\nwidth = 4096\nheads = 32\n").model.ffn_size(),
            11008);
  EXPECT_EQ(parse("[model]\narch = \"llama\"\nwidth = 64\n").model.ffn_size(), 256);
  EXPECT_EQ(parse("[model]\narch = \"llama\"\nffn_width = 100\n").model.ffn_size(), 100);
  EXPECT_EQ(parse("[model]\nffn_width = 100\n").model.ffn_size(), 100);
}

TEST(ConfigArch, TieEmbeddingsDefaultsByArchitecture) {
  EXPECT_TRUE(parse("").model.tie_embeddings);
  EXPECT_TRUE(parse("[model]\narch = \"gpt2\"\n").model.tie_embeddings);
  EXPECT_FALSE(parse("[model]\narch = \"llama\"\n").model.tie_embeddings);
  EXPECT_FALSE(parse("", {"model.arch=llama"}).model.tie_embeddings);
  // Given in the file or by an override, the value stands, whatever the architecture.
  EXPECT_TRUE(parse("[model]\narch = \"llama\"\ntie_embeddings = true\n").model.tie_embeddings);
  EXPECT_FALSE(parse("[model]\ntie_embeddings = false\n").model.tie_embeddings);
  EXPECT_TRUE(parse("[model]\narch = \"llama\"\n", {"model.tie_embeddings=true"})
                  .model.tie_embeddings);
  EXPECT_FALSE(parse("", {"model.tie_embeddings=false", "model.arch=gpt2"}).model.tie_embeddings);
  EXPECT_TRUE(parse_config("model = { arch = \"llama\", tie_embeddings = true }\n" + kBase, kSrc)
                  .model.tie_embeddings);
  // An override of the architecture re-derives an unset default from the final value.
  EXPECT_TRUE(parse("[model]\narch = \"llama\"\n", {"model.arch=gpt2"}).model.tie_embeddings);
}

TEST(ConfigArch, ResolvedTieEmbeddingsSurvivesTheRoundTrip) {
  for (const char* text : {"[model]\narch = \"llama\"\n",
                           "[model]\narch = \"llama\"\ntie_embeddings = true\n",
                           "[model]\ntie_embeddings = false\n", ""}) {
    SCOPED_TRACE(text);
    const Config a = parse(text);
    const std::string toml_text = a.to_toml();
    EXPECT_NE(toml_text.find(std::string("tie_embeddings = ") +
                             (a.model.tie_embeddings ? "true" : "false") + "\n"),
              std::string::npos)
        << toml_text;
    const Config b = parse_config(toml_text, "roundtrip");
    expect_same(a, b);
    EXPECT_EQ(toml_text, b.to_toml());
  }
}

TEST(ConfigArch, LlamaAcceptsKeysOnlyGpt2Uses) {
  // The position-table decay has no table to act on in llama; it is accepted (and unused),
  // as norm_eps and rope_theta are with gpt2.
  const Config llama = parse(
      "[model]\narch = \"llama\"\nvocab_multiple = 64\n"
      "[optim]\ndecay_position_embedding = true\n");
  EXPECT_TRUE(llama.optim.decay_position_embedding);
  const Config gpt2 = parse("[model]\nnorm_eps = 1e-6\nrope_theta = 500000.0\nkv_heads = 2\n");
  EXPECT_EQ(gpt2.model.norm_eps, 1e-6);
  EXPECT_EQ(gpt2.model.kv_head_count(), 2);
}

TEST(ConfigReject, GlobalBatchNotDivisible) {
  EXPECT_ERROR("[train]\nglobal_batch = 10\nmicro_batch = 4\n",
               "train.global_batch (10) must be divisible by train.micro_batch * parallel.data "
               "(4 * 1 = 4)");
  EXPECT_ERROR("[train]\nglobal_batch = 12\nmicro_batch = 4\n[parallel]\ndata = 2\n",
               "train.global_batch (12) must be divisible by train.micro_batch * parallel.data "
               "(4 * 2 = 8)");
  EXPECT_ERROR(
      "[train]\nglobal_batch = 8\nmicro_batch = 9223372036854775807\n[parallel]\ndata = 4\n",
      "train.global_batch (8) must be divisible by train.micro_batch * parallel.data "
      "(9223372036854775807 * 4 = 36893488147419103228)");
}

TEST(ConfigAccept, WarmupLongerThanTrainingIsAShortRunInsideTheWarmup) {
  EXPECT_NO_THROW(parse("[train]\nsteps = 10\n[optim]\nwarmup_steps = 11\n"));
}

TEST(ConfigReject, PipelineLayers) {
  EXPECT_ERROR("[parallel]\npipeline = 2\npipeline_layers = [2, 0]\n",
               "parallel.pipeline_layers[1] (0) must be >= 1");
  EXPECT_ERROR("[parallel]\npipeline = 2\npipeline_layers = [-1, 3]\n",
               "parallel.pipeline_layers[0] (-1) must be >= 1");
  EXPECT_ERROR("[parallel]\npipeline = 2\npipeline_layers = [1, 2]\n",
               "parallel.pipeline_layers ([1, 2]) must sum to model.layers (2), sums to 3");
  EXPECT_ERROR("[parallel]\npipeline = 3\npipeline_layers = [1, 1]\n",
               "parallel.pipeline_layers ([1, 1]) must have parallel.pipeline (3) entries, "
               "has 2");
  const Config c = parse("[model]\nlayers = 5\n[parallel]\npipeline = 2\npipeline_layers = [2, 3]\n");
  EXPECT_EQ(c.parallel.pipeline_layers, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(parse("[parallel]\npipeline_layers = []\n").parallel.pipeline_layers.empty());
}

TEST(ConfigReject, TraceSteps) {
  EXPECT_ERROR("[log]\ntrace_steps = [3, 2]\n",
               "log.trace_steps ([3, 2]) must be [first, last] with first <= last (1-based steps)");
  EXPECT_ERROR("[log]\ntrace_steps = [4]\n",
               "log.trace_steps ([4]) must be [first, last] with first <= last (1-based steps)");
  EXPECT_ERROR("[log]\ntrace_steps = []\n",
               "log.trace_steps ([]) must be [first, last] with first <= last (1-based steps)");
  EXPECT_ERROR("[log]\ntrace_steps = [0, 2]\n", "log.trace_steps[0] (0) must be >= 1");
  const Config c = parse("[log]\ntrace = true\ntrace_steps = [5, 5]\n");
  EXPECT_TRUE(c.log.trace);
  EXPECT_EQ(c.log.trace_steps, (std::vector<int64_t>{5, 5}));
  EXPECT_FALSE(parse("").log.trace);
  EXPECT_EQ(parse("").log.trace_steps, (std::vector<int64_t>{2, 3}));
}

// ---------------------------------------------------------------------------------------------
// Overrides

TEST(ConfigOverride, SetsEveryKind) {
  const Config c = parse("[model]\nlayers = 3\n",
                         {"model.layers=4", "optim.lr=1e-3", "optim.min_lr=0", "data.shuffle=true",
                          "train.device=\"cuda\"", "parallel.pipeline=2",
                          "parallel.pipeline_layers=[1, 3]", "parallel.dp_bucket_mb=7"});
  EXPECT_EQ(c.model.layers, 4);
  EXPECT_EQ(c.optim.lr, 1e-3);
  EXPECT_EQ(c.optim.min_lr, 0.0);
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_EQ(c.train.device, "cuda");
  EXPECT_EQ(c.parallel.pipeline_layers, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(c.parallel.dp_bucket_mb, 7.0);
}

TEST(ConfigOverride, UnquotedStrings) {
  const Config c = parse("", {"data.train=data/x_*.bin", "train.device=cuda",
                              "checkpoint.dir=/tmp/ck pt", "log.dir = runs/a#1 ",
                              "data.val=2024-01-02", "parallel.schedule=gpipe"});
  EXPECT_EQ(c.data.train, std::vector<std::string>{"data/x_*.bin"});
  EXPECT_EQ(c.train.device, "cuda");
  EXPECT_EQ(c.checkpoint.dir, "/tmp/ck pt");
  EXPECT_EQ(c.log.dir, "runs/a#1");
  // a string key takes the text, not a TOML date
  EXPECT_EQ(c.data.val, std::vector<std::string>{"2024-01-02"});
  EXPECT_EQ(c.parallel.schedule, "gpipe");
  EXPECT_TRUE(parse_config(set_key("data.val", "\"v.bin\""), kSrc, {"data.val="}).data.val.empty());
  EXPECT_EQ(parse("", {"data.val=a=b"}).data.val, std::vector<std::string>{"a=b"});
  EXPECT_EQ(parse("", {"data.val=\"quoted \\\"x\\\"\""}).data.val,
            std::vector<std::string>{"quoted \"x\""});
}

TEST(ConfigOverride, WrongTypes) {
  EXPECT_OVERRIDE_ERROR(std::vector<std::string>{"model.layers=abc"},
                        "model.layers: expected an integer, got string \"abc\" "
                        "(from --set model.layers=abc)");
  EXPECT_OVERRIDE_ERROR(std::vector<std::string>{"model.layers=2.5"},
                        "model.layers: expected an integer, got float 2.5 "
                        "(from --set model.layers=2.5)");
  EXPECT_OVERRIDE_ERROR(std::vector<std::string>{"data.shuffle=1"},
                        "data.shuffle: expected a boolean, got integer 1 "
                        "(from --set data.shuffle=1)");
  EXPECT_OVERRIDE_ERROR(std::vector<std::string>{"model.layers="},
                        "model.layers: expected an integer, got string \"\" "
                        "(from --set model.layers=)");
  EXPECT_OVERRIDE_ERROR(std::vector<std::string>{"model.layers=1\nmodel.heads=2"},
                        "model.layers: expected an integer, got string \"1\\nmodel.heads=2\" "
                        "(from --set model.layers=1\\nmodel.heads=2)");
}

TEST(ConfigOverride, UnknownKeys) {
  EXPECT_OVERRIDE_ERROR(std::vector<std::string>{"model.widht=3"},
                        "unknown key 'model.widht' (from --set model.widht=3)");
  EXPECT_OVERRIDE_ERROR(std::vector<std::string>{"modle.width=3"},
                        "unknown section 'modle' (from --set modle.width=3)");
}

TEST(ConfigOverride, Malformed) {
  for (const char* bad : {"model.layers", "layers=3", "=3", ".layers=3", "model.=3",
                          "model.layers.x=3", "model layers=3", ""}) {
    SCOPED_TRACE(bad);
    EXPECT_OVERRIDE_ERROR(std::vector<std::string>{bad},
                          "malformed override '" + std::string(bad) +
                              "': expected section.key=value");
  }
}

TEST(ConfigOverride, AppliesAfterFileBeforeValidation) {
  // The file alone is invalid; the override repairs it.
  const Config c = parse("[model]\nwidth = 100\nheads = 3\n", {"model.width=96"});
  EXPECT_EQ(c.model.width, 96);
  // The file alone is valid; the override breaks it, and validation names the key.
  EXPECT_EQ(error_of("[model]\nheads = 4\n", {"model.width=30"}),
            kSrc + ": model.width (30) must be divisible by model.heads (4)");
  // An override may set a key the file does not mention; the last one wins.
  EXPECT_EQ(parse("", {"eval.interval=5", "eval.interval=7"}).eval.interval, 7);
  // data.train may come from an override alone.
  EXPECT_EQ(parse_config("", kSrc, {"data.train=t.bin"}).data.train,
            std::vector<std::string>{"t.bin"});
}

// ---------------------------------------------------------------------------------------------
// to_toml

TEST(ConfigToToml, RoundTripDefaults) {
  const Config a = parse("");
  const Config b = parse_config(a.to_toml(), "roundtrip");
  expect_same(a, b);
  EXPECT_EQ(a.to_toml(), b.to_toml());
}

TEST(ConfigToToml, RoundTripEverythingChanged) {
  const Config a = everything_changed();
  const std::string text = a.to_toml();
  Config b;
  try {
    b = parse_config(text, "roundtrip");
  } catch (const Error& e) {
    FAIL() << e.what() << "\n" << text;
  }
  expect_same(a, b);
  EXPECT_EQ(text, b.to_toml());
  EXPECT_EQ(b.source, "roundtrip");
}

TEST(ConfigToToml, EmitsEverySectionAndKey) {
  const std::string text = parse("").to_toml();
  const toml::table t = toml::parse(text);
  size_t keys = 0;
  for (auto&& [section, node] : t) keys += node.as_table()->size();
  EXPECT_EQ(keys, config::key_reference().size());
  EXPECT_EQ(t.size(), 8u);
  for (const config::KeyReference& k : config::key_reference()) {
    SCOPED_TRACE(k.name);
    EXPECT_TRUE(t.at_path(k.name)) << text;
  }
  EXPECT_NE(text.find("[model]\narch = \"gpt2\"\nlayers = 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tie_embeddings = true\nnorm_eps = 1e-5\nrope_theta = 10000.0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("lr = 0.0006\n"), std::string::npos) << text;
  EXPECT_NE(text.find("min_lr = 6e-5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("eps = 1e-8\n"), std::string::npos) << text;
  EXPECT_NE(text.find("pipeline_layers = []\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dp_bucket_mb = 25.0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("schedule = \"1f1b\"\n"), std::string::npos) << text;
}

TEST(ConfigToToml, FloatFormatting) {
  EXPECT_EQ(config::toml_float(6e-4), "0.0006");
  EXPECT_EQ(config::toml_float(6e-5), "6e-5");
  EXPECT_EQ(config::toml_float(1e-8), "1e-8");
  EXPECT_EQ(config::toml_float(0.95), "0.95");
  EXPECT_EQ(config::toml_float(0.1), "0.1");
  EXPECT_EQ(config::toml_float(25.0), "25.0");
  EXPECT_EQ(config::toml_float(0.0), "0.0");
  EXPECT_EQ(config::toml_float(-0.0), "-0.0");
  EXPECT_EQ(config::toml_float(-2.5), "-2.5");
  EXPECT_EQ(config::toml_float(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(config::toml_float(1e15), "1000000000000000.0");
  EXPECT_EQ(config::toml_float(1e16), "1e16");
  EXPECT_EQ(config::toml_float(1.5e300), "1.5e300");
  EXPECT_EQ(config::toml_float(5e-324), "5e-324");
}

TEST(ConfigToToml, FloatsReadBackBitExact) {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> exponent(-300, 300);
  for (int i = 0; i < 20000; ++i) {
    double v;
    if (i % 2) {
      uint64_t bits = rng();
      std::memcpy(&v, &bits, sizeof v);
      if (!std::isfinite(v)) continue;
    } else {
      v = std::pow(10.0, exponent(rng)) * (rng() % 2 ? 1 : -1);
    }
    const std::string text = "v = " + config::toml_float(v);
    const toml::table t = toml::parse(text);
    const auto* f = t["v"].as_floating_point();
    ASSERT_NE(f, nullptr) << text;
    ASSERT_TRUE(bits_equal(f->get(), v)) << text;
  }
}

TEST(ConfigToToml, StringEscaping) {
  for (const std::string& s : {std::string("plain"), std::string("a \"q\" \\ b"),
                              std::string("\t\n\r\b\f\x01\x1f\x7f"), std::string("ünï € 😀"),
                              std::string("'''\"\"\"")}) {
    const std::string text = "v = " + config::toml_string(s);
    EXPECT_EQ(text.find('\n'), std::string::npos);
    const toml::table t = toml::parse(text);
    ASSERT_TRUE(t["v"].is_string()) << text;
    EXPECT_EQ(t["v"].as_string()->get(), s) << text;
  }
}

// ---------------------------------------------------------------------------------------------
// Files

TEST(ConfigFile, Missing) {
  const std::string path = temp_path("does_not_exist.toml");
  try {
    load_config(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": cannot open file: No such file or directory");
  }
}

TEST(ConfigFile, Directory) {
  try {
    load_config(testing::TempDir());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              testing::TempDir() + ": not a regular file (a directory): --config needs a TOML file");
  }
}

// Issue 22 items 3 and 12: a FIFO as --config used to block in open forever (ignoring
// SIGTERM), /dev/zero was read until the memory ran out. Both are refused before reading, and
// a regular file is read up to 16 MiB. Each case runs in a child with an alarm and a memory
// limit, so that blocking or reading forever fails the test instead of hanging it.
void expect_refused_unread(const std::string& path, const std::string& message) {
  const auto load = [&] {
    ::alarm(5);
    // Under AddressSanitizer the cap cannot be set (its shadow memory); reading without end is
    // then still caught by the alarm, or by ASan's report when the memory runs out.
    const rlimit memory{1 << 30, 1 << 30};
    if (!test::kUnderAddressSanitizer) setrlimit(RLIMIT_AS, &memory);
    try {
      load_config(path);
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      std::exit(std::string(e.what()) == message ? 0 : 2);
    }
    std::exit(1);
  };
  EXPECT_EXIT(load(), testing::ExitedWithCode(0), "") << message;
}

TEST(ConfigFile, FifoDeviceAndHugeFileAreRefusedUnread) {
  const std::string fifo = temp_path("fifo.toml");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  expect_refused_unread(fifo, fifo + ": not a regular file (a FIFO): --config needs a TOML file");
  std::filesystem::remove(fifo);
  expect_refused_unread(
      "/dev/zero", "/dev/zero: not a regular file (a character device): --config needs a TOML file");
  const std::string huge = temp_path("huge.toml");
  {
    std::ofstream(huge) << "[model]\nlayers = 4\n";
  }
  std::filesystem::resize_file(huge, (16 << 20) + 1);  // sparse: costs nothing
  expect_refused_unread(huge, huge + ": config file is 16777217 bytes, more than the 16 MiB a "
                                     "config may have: --config needs a TOML file");
  std::filesystem::remove(huge);
}

TEST(ConfigFile, LoadsWithOverridesAndNamesFileInErrors) {
  const std::string path = temp_path("run.toml");
  {
    std::ofstream f(path);
    f << "# a run\n[model]\nlayers = 4\n[data]\ntrain = \"d.bin\"\n";
  }
  const Config c = load_config(path, {"model.heads=2"});
  EXPECT_EQ(c.source, path);
  EXPECT_EQ(c.model.layers, 4);
  EXPECT_EQ(c.model.heads, 2);
  try {
    load_config(path, {"model.heads=3"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": model.width (64) must be divisible by model.heads (3)");
  }
  {
    std::ofstream f(path);
    f << "[model]\nlayers = 4\n[data]\ntrain = \"d.bin\n";
  }
  try {
    load_config(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ":4:", 0), 0u) << e.what();
  }
  std::filesystem::remove(path);
}

// toml++ recurses once per nesting level: a table header of 50,000 dotted parts (100 KB)
// overflowed its stack, a segfault (a hostile-input sweep found it). toml_nesting_past bounds
// a text's dotted key parts per line and its open brackets and braces before it is parsed.
namespace {
std::string repeat(const std::string& part, int n, const std::string& sep) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? sep : "") + part;
  return s;
}
}  // namespace

TEST(TomlNesting, DottedPartsAndBracketsPastTheBoundAreFoundOutsideStringsAndComments) {
  const int k = kMaxTomlNesting;
  // A key of k + 1 parts has k dots: within; k + 2 parts, k + 1 dots: past, on its line.
  EXPECT_EQ(toml_nesting_past("[" + repeat("a", k + 1, ".") + "]\n").line, 0);
  const TomlNesting header = toml_nesting_past("x = 1\n\n[" + repeat("a", k + 2, ".") + "]\n");
  EXPECT_EQ(header.line, 3);
  EXPECT_NE(header.what.find("dotted parts"), std::string::npos) << header.what;
  EXPECT_EQ(toml_nesting_past(repeat("a", k + 2, " . ") + " = 1").line, 1);
  EXPECT_EQ(toml_nesting_past("t = {" + repeat("\"q\"", k + 2, ".") + " = 1}").line, 1);
  EXPECT_EQ(toml_nesting_past(repeat("1", k + 2, ".") + " = 1").line, 1);  // bare digit parts
  // Numbers' decimal points and dates' fractions are not key parts: 1,000 floats on one line.
  EXPECT_EQ(
      toml_nesting_past("v = [" + repeat("0.5", 1000, ", ") + "]\nd = 1979-05-27T07:32:00.999\n")
          .line,
      0);
  // Dots inside strings and comments are not counted, and lines are counted through them.
  const std::string dots = repeat("a", 1000, ".");
  EXPECT_EQ(toml_nesting_past("s = \"" + dots + "\"\nl = '" + dots + "'\n# " + dots + "\n").line,
            0);
  // Multi-line strings (an escaped quote, closing quotes with two more before them), lines 1-7;
  // valid TOML, as toml++ agrees.
  const std::string multi = "m = \"\"\"\n" + dots + "\n\\\"\"\"\n\"\"\"\"\"\nn = '''\n" + dots +
                            "\n'''''\n";
  EXPECT_NO_THROW(toml::parse(multi));
  EXPECT_EQ(toml_nesting_past(multi).line, 0);
  EXPECT_EQ(toml_nesting_past(multi + repeat("b", k + 2, ".") + " = 1\n").line, 8);
  // Brackets and braces: k deep is within, k + 1 past, counted across lines.
  EXPECT_EQ(toml_nesting_past("v = " + std::string(k, '[') + std::string(k, ']')).line, 0);
  const TomlNesting arrays =
      toml_nesting_past("v = [\n" + std::string(k, '[') + std::string(k + 1, ']'));
  EXPECT_EQ(arrays.line, 2);
  EXPECT_NE(arrays.what.find("nested"), std::string::npos) << arrays.what;
  EXPECT_EQ(
      toml_nesting_past("v = " + repeat("{a = ", k + 1, "") + "1" + std::string(k + 1, '}')).line,
      1);
  // Every shipped config and hardware file is well within it.
  int scanned = 0;
  for (const char* dir : {"/configs", "/configs/hardware", "/configs/plan"})
    for (const auto& entry :
         std::filesystem::directory_iterator(std::string(TRIDENT_SOURCE_DIR) + dir)) {
      if (entry.path().extension() != ".toml") continue;
      std::ifstream f(entry.path());
      std::stringstream text;
      text << f.rdbuf();
      EXPECT_EQ(toml_nesting_past(text.str()).line, 0) << entry.path();
      ++scanned;
    }
  EXPECT_GE(scanned, 10);
}

TEST(ConfigFile, NestingPastTheParsersDepthIsOneErrorLine) {
  const std::string path = temp_path("deep.toml");
  {
    std::ofstream(path) << "[model]\nlayers = 4\n[" << repeat("a", 50000, ".") << "]\n";
  }
  try {
    load_config(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ":3: a key of more than 128 dotted parts (the parser "
                                            "recurses once per level)");
  }
  // The same in an override's value.
  {
    std::ofstream(path) << "[model]\nlayers = 4\n";
  }
  try {
    load_config(path, {"model.layers=" + std::string(100000, '[')});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("override 'model.layers': arrays and tables nested more "
                                         "than 128 deep"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
  std::filesystem::remove(path);
}

// Every config shipped in configs/ is valid.
TEST(ConfigFile, RepositoryConfigsAreValid) {
  size_t n = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(TRIDENT_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW(load_config(entry.path().string()));
    ++n;
  }
  EXPECT_GE(n, 3u);
}

TEST(ConfigFile, LlamaConfigsHaveThePublishedShapes) {
  const std::string dir = std::string(TRIDENT_SOURCE_DIR) + "/configs/";
  const ModelConfig small = load_config(dir + "llama_3.2_1b.toml").model;
  EXPECT_EQ(small.arch, "llama");
  EXPECT_EQ(small.layers, 16);
  EXPECT_EQ(small.width, 2048);
  EXPECT_EQ(small.heads, 32);
  EXPECT_EQ(small.kv_head_count(), 8);
  EXPECT_EQ(small.ffn_size(), 8192);
  EXPECT_EQ(small.vocab_size, 128256);
  EXPECT_TRUE(small.tie_embeddings);
  EXPECT_EQ(small.rope_theta, 500000.0);
  EXPECT_EQ(small.norm_eps, 1e-5);
  const ModelConfig big = load_config(dir + "llama_3.1_8b.toml").model;
  EXPECT_EQ(big.arch, "llama");
  EXPECT_EQ(big.layers, 32);
  EXPECT_EQ(big.width, 4096);
  EXPECT_EQ(big.heads, 32);
  EXPECT_EQ(big.kv_head_count(), 8);
  EXPECT_EQ(big.ffn_size(), 14336);
  EXPECT_EQ(big.vocab_size, 128256);
  EXPECT_FALSE(big.tie_embeddings);
  EXPECT_EQ(big.rope_theta, 500000.0);
  EXPECT_EQ(big.norm_eps, 1e-5);
  const ModelConfig tiny = load_config(dir + "llama_tiny.toml").model;
  EXPECT_EQ(tiny.arch, "llama");
  EXPECT_FALSE(tiny.tie_embeddings);
  EXPECT_LT(tiny.kv_head_count(), tiny.heads);
}

// ---------------------------------------------------------------------------------------------
// Documentation

TEST(ConfigDocs, KeyTableMatchesSchema) {
  const std::string path = std::string(TRIDENT_SOURCE_DIR) + "/docs/config.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const std::string begin = "<!-- keys:begin (generated: TRIDENT_UPDATE_DOCS=1 test_config) -->\n";
  const std::string end = "<!-- keys:end -->";
  const size_t b = doc.find(begin), e = doc.find(end);
  ASSERT_NE(b, std::string::npos) << path;
  ASSERT_NE(e, std::string::npos) << path;
  const std::string table = doc.substr(b + begin.size(), e - b - begin.size());
  const std::string expected = config::reference_markdown();
  if (table != expected && std::getenv("TRIDENT_UPDATE_DOCS")) {
    std::ofstream(path) << doc.substr(0, b + begin.size()) + expected + doc.substr(e);
    GTEST_SKIP() << "rewrote " << path;
  }
  EXPECT_EQ(table, expected) << "docs/config.md is out of date: rerun with TRIDENT_UPDATE_DOCS=1";
}

TEST(ConfigDefaults, CudaPadsTheVocabularyTo128UnlessVocabMultipleIsGiven) {
  const std::string base = "[model]\nvocab_size = 50257\n[data]\ntrain = \"x.bin\"\n";
  EXPECT_EQ(parse_config(base, "t.toml").model.vocab_multiple, 1);
  EXPECT_EQ(parse_config(base, "t.toml", {"train.device=cuda"}).model.vocab_multiple, 128);
  EXPECT_EQ(parse_config(base + "[train]\ndevice = \"cuda\"\n", "t.toml").model.vocab_multiple,
            128);
  EXPECT_EQ(parse_config(base, "t.toml", {"train.device=cuda", "model.vocab_multiple=8"})
                .model.vocab_multiple,
            8);
  const Config c = parse_config(base + "[train]\ndevice = \"cuda\"\n", "t.toml");
  // The resolved value survives the round trip through to_toml (checkpoints store it).
  EXPECT_EQ(parse_config(c.to_toml(), "again.toml").model.vocab_multiple, 128);
}

// Mixture of experts (docs/moe.md): defaults, the cross-key checks, one line each.
TEST(ConfigMoe, DefaultsAreDenseAndLayerIntervalSelectsLayers) {
  const Config dense = parse("");
  EXPECT_EQ(dense.model.moe_experts, 0);
  EXPECT_EQ(dense.parallel.expert, 1);
  EXPECT_FALSE(dense.model.is_moe_layer(0));
  const Config c = parse("[model]\nlayers = 4\nmoe_experts = 4\nmoe_layer_interval = 2\n");
  EXPECT_EQ(c.model.moe_top_k, 2);
  EXPECT_EQ(c.model.moe_aux_loss_coeff, 0.01);
  EXPECT_EQ(c.model.moe_z_loss_coeff, 0.0);
  EXPECT_EQ(c.model.moe_capacity_factor, 0.0);
  EXPECT_TRUE(c.model.is_moe_layer(0));
  EXPECT_FALSE(c.model.is_moe_layer(1));
  EXPECT_TRUE(c.model.is_moe_layer(2));
  EXPECT_FALSE(c.model.is_moe_layer(3));
  // The resolved config reads back the same.
  const Config again = parse_config(c.to_toml(), "again.toml");
  EXPECT_EQ(again.model.moe_experts, 4);
  EXPECT_EQ(again.model.moe_layer_interval, 2);
}

TEST(ConfigMoe, RejectsImpossibleRouting) {
  EXPECT_ERROR("[model]\nmoe_experts = 4\nmoe_top_k = 5\n",
               "model.moe_top_k (5) must be <= model.moe_experts (4)");
  EXPECT_ERROR("[model]\nmoe_experts = 6\n[parallel]\nexpert = 4\ndata = 4\n"
               "[train]\nglobal_batch = 16\n",
               "model.moe_experts (6) must be divisible by parallel.expert (4)");
  EXPECT_ERROR("[model]\nmoe_experts = 4\n[parallel]\nexpert = 4\ndata = 2\n",
               "parallel.expert (4) must divide parallel.data (2): the expert-parallel ranks "
               "are taken from the data-parallel ones");
  EXPECT_ERROR("[parallel]\nexpert = 2\ndata = 2\n",
               "parallel.expert (2) > 1 needs a mixture of experts (model.moe_experts > 0, it "
               "is 0)");
  // Accepted on the CPU: 4 experts over 2 of the 4 data-parallel ranks.
  const Config ep = parse_config(kBase + "[model]\nmoe_experts = 4\n[parallel]\nexpert = 2\n"
                                 "data = 4\n[train]\nglobal_batch = 16\n",
                                 kSrc);
  EXPECT_EQ(ep.parallel.expert, 2);
  // The GPU has fp32 MoE kernels (kernels/cuda/moe.cu) and no bf16 ones.
  EXPECT_EQ(parse("[model]\nmoe_experts = 4\n[train]\ndevice = \"cuda\"\n").model.moe_experts, 4);
  EXPECT_ERROR("[model]\nmoe_experts = 4\n[train]\ndevice = \"cuda\"\nprecision = \"bf16\"\n",
               "model.moe_experts (4) > 0 with train.device = \"cuda\" needs train.precision = "
               "\"fp32\" (the GPU's mixture-of-experts kernels are fp32 only)");
  EXPECT_EQ(parse("[model]\nmoe_experts = 4\n[parallel]\nexpert = 2\ndata = 2\n[train]\n"
                  "device = \"cuda\"\n")
                .parallel.expert,
            2);
  EXPECT_ERROR("[model]\nmoe_experts = -1\n", "model.moe_experts (-1) must be in [0, 65536]");
  // A million experts took the plan 30 s (each expert's tensors are listed one by one).
  EXPECT_ERROR("[model]\nmoe_experts = 65537\n",
               "model.moe_experts (65537) must be in [0, 65536]");
  EXPECT_ERROR("[model]\nmoe_layer_interval = 0\n", "model.moe_layer_interval (0) must be >= 1");
  EXPECT_ERROR("[model]\nmoe_capacity_factor = -0.5\n",
               "model.moe_capacity_factor (-0.5) must be >= 0");
}

}  // namespace
}  // namespace trident

namespace trident {
namespace {

TEST(ConfigContext, ChunkLayoutAndUnsupportedFeatures) {
  const Config ok = parse("[parallel]\ncontext = 4\ntensor = 2\n");  // seq_len 64: chunks of 8
  EXPECT_EQ(ok.parallel.context, 4);
  EXPECT_EQ(ok.parallel.world_size(), 8);
  EXPECT_EQ(parse_config(ok.to_toml(), "again.toml").parallel.context, 4);
  EXPECT_ERROR("[model]\nseq_len = 60\n[parallel]\ncontext = 4\n",
               "model.seq_len (60) must be divisible by 2 * parallel.context (4): each sequence "
               "is cut into 2 * context equal chunks");
  EXPECT_ERROR("[model]\nseq_len = 24\n[parallel]\ncontext = 2\ntensor = 5\n"
               "sequence_parallel = true\n[train]\nmicro_batch = 1\nglobal_batch = 1\n",
               "train.micro_batch * model.seq_len / parallel.context (2) = 1 * 12 must be "
               "divisible by parallel.tensor (5) under parallel.sequence_parallel: each tensor "
               "rank holds a slice of a context rank's tokens");
  // A dropless mixture of experts runs (model/moe.hpp), with expert parallelism too; token
  // dropping does not yet.
  EXPECT_EQ(parse("[model]\nmoe_experts = 4\n[parallel]\ncontext = 2\n").parallel.context, 2);
  EXPECT_ERROR("[model]\nmoe_experts = 4\nmoe_capacity_factor = 1.5\n[parallel]\ncontext = 2\n",
               "parallel.context (2) > 1 with model.moe_capacity_factor (1.5) > 0: token "
               "dropping decides per sequence, in order, and a context rank holds a part of "
               "each; use a dropless mixture of experts (model.moe_capacity_factor = 0)");
  EXPECT_EQ(parse("[model]\nmoe_experts = 4\n[parallel]\ncontext = 2\nexpert = 2\ndata = 2\n"
                  "[train]\nglobal_batch = 8\n")
                .parallel.expert,
            2);
  EXPECT_ERROR("[parallel]\ncontext = 2\n[eval]\nsample_interval = 10\n",
               "parallel.context (2) > 1 with eval.sample_interval (10) > 0: sampling decodes "
               "the whole sequence on one rank, which context parallelism does not hold (set "
               "eval.sample_interval = 0; `trident generate` decodes from the checkpoint)");
  EXPECT_ERROR("[parallel]\ncontext = 2\n[train]\ndevice = \"cuda\"\n",
               "parallel.context (2) > 1 with train.device = \"cuda\": the GPU kernels of the "
               "context ring have not yet been checked on a GPU (use train.device = \"cpu\")");
  EXPECT_NE(error_of("", {"parallel.context=0"}).find("parallel.context"), std::string::npos);
  // 2 * context would overflow: still the chunk rule's line (it passed as -2 before).
  EXPECT_ERROR("[parallel]\ncontext = 9223372036854775807\n",
               "model.seq_len (64) must be divisible by 2 * parallel.context "
               "(9223372036854775807): each sequence is cut into 2 * context equal chunks");
}

}  // namespace
}  // namespace trident
