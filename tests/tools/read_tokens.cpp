// Prints tokens as Trident's own readers see them, for tests/tools/test_prepare_text.py, which
// compares them with what it computes independently (so the Python tools are checked against
// the C++ reader that training uses, not against a Python reader of the same format).
//   read_tokens indexed PREFIX            Megatron .bin/.idx through trident::IndexedDataset:
//                                         "dtype D", "sequences S", "documents N",
//                                         "tokens T", then "doc i: t t t" per document
//   read_tokens shard PATH                an llm.c uint16 shard through trident::TokenShard:
//                                         "tokens T", then "shard: t t t"
//   read_tokens windows PATTERN T VOCAB   trident::TokenDataset (what data.train = PATTERN
//                                         trains on): "windows W", then "window 0: inputs"
//                                         and "targets 0: targets" of window 0
// Exit status 1 with "error: MESSAGE" on a trident::Error (the readers' one-line errors).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "data/dataset.hpp"
#include "data/indexed_dataset.hpp"
#include "util/error.hpp"

namespace {

template <typename T>
void print_list(const char* label, const std::vector<T>& tokens) {
  std::printf("%s:", label);
  for (const T& t : tokens) std::printf(" %lld", static_cast<long long>(t));
  std::printf("\n");
}

int usage() {
  std::fprintf(stderr,
               "usage: read_tokens indexed PREFIX | shard PATH | windows PATTERN T VOCAB\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string mode = argv[1];
  try {
    if (mode == "indexed" && argc == 3) {
      trident::IndexedDataset ds(argv[2]);
      std::printf("dtype %d\nsequences %lld\ndocuments %lld\ntokens %lld\n",
                  static_cast<int>(ds.dtype_code()), static_cast<long long>(ds.num_sequences()),
                  static_cast<long long>(ds.num_documents()),
                  static_cast<long long>(ds.num_tokens()));
      for (int64_t d = 0; d < ds.num_documents(); ++d) {
        const std::string label = "doc " + std::to_string(d);
        print_list(label.c_str(), ds.document(d));
      }
    } else if (mode == "shard" && argc == 3) {
      trident::TokenShard shard(argv[2]);
      std::vector<uint16_t> tokens(static_cast<size_t>(shard.num_tokens()));
      if (!tokens.empty()) shard.read(0, shard.num_tokens(), tokens.data());
      std::printf("tokens %lld\n", static_cast<long long>(shard.num_tokens()));
      print_list("shard", tokens);
    } else if (mode == "windows" && argc == 5) {
      const int64_t seq_len = std::stoll(argv[3]);
      trident::TokenDataset ds(argv[2], seq_len, std::stoll(argv[4]));
      std::printf("windows %lld\n", static_cast<long long>(ds.num_windows()));
      std::vector<int32_t> inputs(static_cast<size_t>(seq_len)), targets(inputs.size());
      ds.window(0, inputs.data(), targets.data());
      print_list("window 0", inputs);
      print_list("targets 0", targets);
    } else {
      return usage();
    }
  } catch (const trident::Error& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
  return 0;
}
