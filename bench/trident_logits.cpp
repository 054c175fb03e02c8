// By-hand check, not part of the tests: the logits Trident's CPU model computes for a batch of
// tokens, from any model checkpoint, to compare with another implementation
// (bench/hf_interop_check.py runs it beside Hugging Face transformers).
//
//   trident_logits CKPT.h5 TOKENS.bin LOGITS.bin
//     TOKENS.bin: int32 little-endian, B * model.seq_len tokens (B sequences)
//     LOGITS.bin: float32 little-endian [B, seq_len, vocab_size] (vocabulary padding dropped)
//
// One process, float32, the same forward pass training runs (no tensor parallelism).
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "checkpoint/h5_file.hpp"
#include "comm/comm.hpp"
#include "model/architecture.hpp"
#include "model/cpu_model.hpp"
#include "train/checkpointing.hpp"
#include "util/error.hpp"

using namespace trident;

namespace {

std::vector<char> read_bytes(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(std::string("'") + path + "': cannot open");
  return {std::istreambuf_iterator<char>(in), {}};
}

int run(const char* checkpoint, const char* tokens_path, const char* logits_path) {
  CheckpointReader reader(checkpoint, MPI_COMM_SELF, checkpoint_reader_options());
  const CheckpointMeta meta = check_checkpoint(reader);
  const ModelConfig& m = meta.config.model;
  auto comm = make_self_communicator("tensor");
  CpuModel<float> model(m, ModelShard::whole(m), *comm);
  const std::span<float> weights(model.weights(), static_cast<size_t>(model.flat_size()));
  // The whole model: every tensor is this rank's.
  for_each_checkpoint_tensor(m, model.params(), [&](const CheckpointTensor& t) {
    reader.read_tensor(t.dataset(kWeightsRoot), t.global.global_shape,
                       param_runs(*t.local, 0, t.local->numel(), t.local->offset), weights);
  });
  reader.close();
  model.weights_changed();

  const std::vector<char> raw = read_bytes(tokens_path);
  const int64_t T = m.seq_len, n = static_cast<int64_t>(raw.size() / 4);
  if (n == 0 || n % T != 0)
    throw Error(std::string("'") + tokens_path + "': " + std::to_string(n) +
                " tokens, not a multiple of model.seq_len = " + std::to_string(T));
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  std::memcpy(tokens.data(), raw.data(), raw.size());
  const int64_t B = n / T, V = m.vocab_size, padded = padded_vocab_size(m, 1);
  auto acts = model.make_activations(B);
  model.forward(acts, tokens.data(), tokens.data(), nullptr, 0.0f);  // targets: any valid ids
  std::vector<float> logits(static_cast<size_t>(n * padded));
  model.logits(acts, logits.data());
  std::ofstream out(logits_path, std::ios::binary);
  for (int64_t row = 0; row < n; ++row)
    out.write(reinterpret_cast<const char*>(logits.data() + row * padded), V * 4);
  if (!out) throw Error(std::string("'") + logits_path + "': cannot write");
  std::printf("%s: logits of %lld x %lld tokens, vocabulary %lld (model %s)\n", logits_path,
              static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(V),
              m.arch.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 2;
  if (argc != 4) {
    std::fprintf(stderr, "usage: trident_logits CKPT.h5 TOKENS.bin LOGITS.bin\n");
  } else {
    try {
      code = run(argv[1], argv[2], argv[3]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "trident_logits: error: %s\n", e.what());
      code = 1;
    }
  }
  MPI_Finalize();
  return code;
}
