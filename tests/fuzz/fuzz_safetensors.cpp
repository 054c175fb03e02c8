// Fuzz target: the safetensors reader (lib/interop/safetensors.hpp read_safetensors_header)
// and the tensor reads the Hugging Face import makes from what it returns. Input: the file.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz_util.hpp"
#include "interop/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using trident::fuzz::expect;
  const std::string path = trident::fuzz::scratch_dir() + "/model.safetensors";
  trident::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  std::map<std::string, trident::SafetensorsTensor> tensors;
  try {
    tensors = trident::read_safetensors_header(path);
  } catch (const trident::Error& e) {
    trident::fuzz::expect_one_line_naming(e, path);
    return 0;
  }
  // The reference's rule (issue 56: tensors sharing bytes were accepted): in offset order the
  // tensors' bytes follow each other from the end of the header, no gap and no overlap, to
  // the end of the file.
  std::vector<std::pair<int64_t, int64_t>> extents;
  for (const auto& [name, t] : tensors) extents.push_back({t.offset, t.offset + t.bytes});
  std::sort(extents.begin(), extents.end());
  uint64_t header = 0;
  std::memcpy(&header, data, 8);  // accepted: at least 8 bytes, a header inside the file
  auto covered = static_cast<int64_t>(8 + header);
  for (const auto& [begin, end] : extents) {
    expect(begin == covered, "accepted tensors that overlap or leave a gap");
    covered = end;
  }
  expect(covered == static_cast<int64_t>(size), "accepted tensors that do not reach the end");
  // What the header promises must hold: every tensor lies inside the file, and a supported
  // one holds exactly its shape's elements; then it is read and converted as the import does.
  for (const auto& [name, t] : tensors) {
    expect(t.offset >= 8 && t.bytes >= 0 && t.offset + t.bytes <= static_cast<int64_t>(size),
           "tensor '" + name + "' lies outside the file");
    if (!t.supported) continue;
    // The product is taken left to right, as the reader and the reference take it: a running
    // product past 64 bits is refused even where a later size of 0 would make it 0, and a
    // size of 0 after a huge one is an empty tensor ([9999999999, 0] of 0 bytes aborted the
    // harness once, the likely cause of a CI failure whose input was not in the log).
    int64_t numel = 1;
    for (const int64_t d : t.shape) {
      expect(d >= 0, "tensor '" + name + "' has a negative size");
      expect(!__builtin_mul_overflow(numel, d, &numel),
             "tensor '" + name + "': element count past 64 bits was accepted");
    }
    int64_t needed = 0;
    expect(!__builtin_mul_overflow(numel, trident::dtype_bytes(t.dtype), &needed) &&
               needed == t.bytes,
           "tensor '" + name + "': shape does not match its bytes");
    std::vector<float> values(numel);
    trident::convert_to_float32(t.dtype, reinterpret_cast<const std::byte*>(data) + t.offset,
                                numel, values.data());
  }
  return 0;
}
