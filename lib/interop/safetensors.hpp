#pragma once
// The safetensors file format (https://github.com/huggingface/safetensors), as its reference
// implementation writes it: an 8-byte little-endian header length N, N bytes of JSON
// {"__metadata__": {...}, "<name>": {"dtype", "shape", "data_offsets": [begin, end]}, ...}
// padded with spaces to a multiple of 8, then the tensors' bytes back to back (offsets relative
// to the end of the header), in the order the reference writes them: by name (bytes), all our
// tensors having one dtype. Only what Trident's Hugging Face export and import need: F32, F16
// and BF16 tensors.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace trident {

enum class TensorDType { F32, F16, BF16 };

// "F32", "F16", "BF16" (safetensors' names) and back; parse returns false for any other name.
std::string dtype_name(TensorDType dtype);
bool parse_dtype_name(const std::string& name, TensorDType& dtype);
int64_t dtype_bytes(TensorDType dtype);

// Conversions of n elements between float32 and `dtype` (little-endian bytes): to bf16 and f16
// with round to nearest even (what torch's .to() does); from them exactly.
void convert_from_float32(TensorDType dtype, const float* src, int64_t n, std::byte* dst);
void convert_to_float32(TensorDType dtype, const std::byte* src, int64_t n, float* dst);

struct SafetensorsEntry {
  std::string name;
  TensorDType dtype = TensorDType::F32;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // data_offsets: bytes after the header
};

// A file to write: its header bytes (length prefix included) and where each tensor goes.
struct SafetensorsLayout {
  std::string header;                       // the first data_start bytes of the file
  std::vector<SafetensorsEntry> entries;    // in data order (names sorted by bytes)
  int64_t data_start = 0;                   // 8 + the padded JSON's length
  int64_t file_size = 0;
  const SafetensorsEntry& entry(const std::string& name) const;
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};
// The layout of a file holding `tensors` (any order; names must be unique), all of `dtype`,
// with __metadata__ {"format": "pt"} as transformers writes it.
SafetensorsLayout plan_safetensors(std::vector<TensorSpec> tensors, TensorDType dtype);

// A file to read: its tensors by name with absolute byte offsets in the file. Throws one line
// naming the file when it is not a safetensors file (too short, a header length past the
// file, JSON that does not parse, an entry without dtype / shape / data_offsets, offsets that
// do not match the shape or run past the file, sizes or offsets past 64 bits, tensors whose
// bytes do not tile the data as the reference requires (in offset order, from 0 to the end of
// the file, no gap, no overlap); a tensor name
// is printed with control characters escaped, so the message stays one line); an unsupported
// dtype is kept as dtype_text (with supported = false) for the caller to reject naming the
// tensor.
struct SafetensorsTensor {
  std::string dtype_text;  // for messages: control characters escaped as in JSON (one line)
  bool supported = false;
  TensorDType dtype = TensorDType::F32;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // absolute, in the file
  int64_t bytes = 0;
};
std::map<std::string, SafetensorsTensor> read_safetensors_header(const std::string& path);

}  // namespace trident
