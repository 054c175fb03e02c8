#include "interop/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <nlohmann/json.hpp>

#include "util/bf16.hpp"
#include "util/error.hpp"

namespace trident {
namespace {

// IEEE half from float, round to nearest even, overflow to inf, NaN kept (quiet).
uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): value / 2^-24, rounded to nearest even by the FPU.
    float a;
    std::memcpy(&a, &abs, sizeof a);
    const float scaled = std::nearbyint(a * 16777216.0f);  // 2^24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(scaled));
  }
  uint32_t mant = abs + 0xc8000fffu + ((abs >> 13) & 1u);  // rebias exponent (-112 << 23), round
  return static_cast<uint16_t>(sign | (mant >> 13));
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    std::memcpy(&u, &v, sizeof u);
    u |= sign;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("safetensors '" + path + "': " + what);
}

// A string of the file as it goes into a one-line message: control characters (a newline in
// a tensor name) escaped as in JSON, e.g. a\nb; quotes and backslashes escaped likewise.
std::string printable(const std::string& text) {
  const std::string quoted = nlohmann::json(text).dump();
  return quoted.substr(1, quoted.size() - 2);
}

// A tensor's data_offsets, relative to the data.
struct Extent {
  int64_t begin = 0, end = 0;
  std::string name;
};

// The reference's rule (safetensors' Metadata::validate and read_metadata): in the order of
// their offsets, the tensors' bytes follow each other from 0 with no gap and no overlap and end
// at the end of the file. Two tensors sharing bytes would import one's values as the other's.
void check_tiling(const std::string& path, std::vector<Extent> extents, int64_t data_bytes) {
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  const Extent* previous = nullptr;
  int64_t covered = 0;
  auto offsets = [](const Extent& e) {
    return nlohmann::json::array({e.begin, e.end}).dump();  // as the header writes them
  };
  for (const Extent& e : extents) {
    const std::string where = "tensor '" + printable(e.name) + "': data_offsets " + offsets(e);
    if (e.begin < covered)
      fail(path, where + " overlap tensor '" + printable(previous->name) + "' " +
                     offsets(*previous) + " (each byte belongs to one tensor)");
    if (e.begin > covered)
      fail(path, where + " leave bytes " + std::to_string(covered) + " to " +
                     std::to_string(e.begin) + " of the data to no tensor (the tensors follow "
                     "each other with no gap)");
    covered = e.end;
    previous = &e;
  }
  if (covered != data_bytes)
    fail(path, "the tensors cover " + std::to_string(covered) + " of the file's " +
                   std::to_string(data_bytes) + " data bytes (they must end at its end)");
}

}  // namespace

std::string dtype_name(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::F32: return "F32";
    case TensorDType::F16: return "F16";
    case TensorDType::BF16: return "BF16";
  }
  return "?";
}

bool parse_dtype_name(const std::string& name, TensorDType& dtype) {
  for (TensorDType d : {TensorDType::F32, TensorDType::F16, TensorDType::BF16})
    if (dtype_name(d) == name) {
      dtype = d;
      return true;
    }
  return false;
}

int64_t dtype_bytes(TensorDType dtype) { return dtype == TensorDType::F32 ? 4 : 2; }

void convert_from_float32(TensorDType dtype, const float* src, int64_t n, std::byte* dst) {
  // The files are little-endian, like every machine Trident runs on. n = 0 comes with the
  // data() of empty vectors, null pointers memcpy must not get (an empty tensor: shape [0]).
  if (dtype == TensorDType::F32) {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = dtype == TensorDType::BF16 ? float_to_bf16(src[i]) : float_to_f16(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

void convert_to_float32(TensorDType dtype, const std::byte* src, int64_t n, float* dst) {
  if (dtype == TensorDType::F32) {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = dtype == TensorDType::BF16 ? bf16_to_float(h) : f16_to_float(h);
  }
}

const SafetensorsEntry& SafetensorsLayout::entry(const std::string& name) const {
  for (const SafetensorsEntry& e : entries)
    if (e.name == name) return e;
  throw Error("internal: no tensor '" + name + "' in the safetensors layout");
}

SafetensorsLayout plan_safetensors(std::vector<TensorSpec> tensors, TensorDType dtype) {
  // The reference implementation orders the data by (dtype alignment, name); with one dtype,
  // by name, compared as bytes (std::string's order).
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  SafetensorsLayout layout;
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  int64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    SafetensorsEntry e{t.name, dtype, t.shape, offset, offset + numel * dtype_bytes(dtype)};
    offset = e.end;
    nlohmann::ordered_json info;
    info["dtype"] = dtype_name(dtype);
    info["shape"] = t.shape;
    info["data_offsets"] = {e.begin, e.end};
    header[t.name] = std::move(info);
    layout.entries.push_back(std::move(e));
  }
  std::string json = header.dump();  // compact, like serde_json
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t n = json.size();
  layout.header.resize(8);
  for (int i = 0; i < 8; ++i) layout.header[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  layout.header += json;
  layout.data_start = static_cast<int64_t>(layout.header.size());
  layout.file_size = layout.data_start + offset;
  return layout;
}

std::map<std::string, SafetensorsTensor> read_safetensors_header(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer; it is refused below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const int64_t size = st.st_size;
  unsigned char prefix[8];
  if (size < 8 || ::pread(fd, prefix, 8, 0) != 8)
    fail(path, "not a safetensors file (" + std::to_string(size) + " bytes)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(prefix[i]) << (8 * i);
  // The reference refuses headers over 100 MB.
  if (n > 100'000'000 || static_cast<int64_t>(n) > size - 8)
    fail(path, "not a safetensors file (header length " + std::to_string(n) + ", file " +
                   std::to_string(size) + " bytes)");
  std::string text(n, '\0');
  if (::pread(fd, text.data(), n, 8) != static_cast<ssize_t>(n))
    fail(path, "cannot read the header: " + std::string(std::strerror(errno)));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, "the header is not JSON (" + std::string(e.what()) + ")");
  }
  if (!header.is_object()) fail(path, "the header is not a JSON object");
  const int64_t data_start = 8 + static_cast<int64_t>(n), data_bytes = size - data_start;
  std::map<std::string, SafetensorsTensor> out;
  std::vector<Extent> extents;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = "tensor '" + printable(name) + "': ";
    if (!info.is_object() || !info.contains("dtype") || !info["dtype"].is_string() ||
        !info.contains("shape") || !info["shape"].is_array() ||
        !info.contains("data_offsets") || !info["data_offsets"].is_array() ||
        info["data_offsets"].size() != 2)
      fail(path, where + "needs dtype, shape and data_offsets [begin, end]");
    SafetensorsTensor t;
    t.supported = parse_dtype_name(info["dtype"].get<std::string>(), t.dtype);
    t.dtype_text = printable(info["dtype"].get<std::string>());
    // Sizes and offsets are JSON unsigned integers up to 2^64 - 1: each is checked before it
    // becomes an int64_t, and the element count for overflow (a hostile shape would wrap it).
    int64_t numel = 1;
    for (const auto& d : info["shape"]) {
      if (!d.is_number_unsigned()) fail(path, where + "shape " + info["shape"].dump() + " is not a list of sizes");
      const uint64_t size = d.get<uint64_t>();
      if (size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(numel, static_cast<int64_t>(size), &numel))
        fail(path, where + "shape " + info["shape"].dump() + " has more elements than fit in 64 bits");
      t.shape.push_back(static_cast<int64_t>(size));
    }
    const auto& offsets = info["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      fail(path, where + "data_offsets " + offsets.dump() + " are not byte offsets");
    const uint64_t begin_u = offsets[0].get<uint64_t>(), end_u = offsets[1].get<uint64_t>();
    if (begin_u > end_u || end_u > static_cast<uint64_t>(data_bytes))
      fail(path, where + "data_offsets " + offsets.dump() + " run past the file's " +
                     std::to_string(data_bytes) + " data bytes (truncated?)");
    const auto begin = static_cast<int64_t>(begin_u), end = static_cast<int64_t>(end_u);
    int64_t needed = 0;
    if (t.supported && __builtin_mul_overflow(numel, dtype_bytes(t.dtype), &needed))
      fail(path, where + "shape " + info["shape"].dump() + " of " + t.dtype_text +
                     " needs more bytes than fit in 64 bits");
    if (t.supported && end - begin != needed)
      fail(path, where + "data_offsets " + offsets.dump() + " hold " +
                     std::to_string(end - begin) + " bytes, shape " + info["shape"].dump() +
                     " of " + t.dtype_text + " needs " + std::to_string(needed));
    t.offset = data_start + begin;
    t.bytes = end - begin;
    out.emplace(name, std::move(t));
    extents.push_back({begin, end, name});
  }
  check_tiling(path, std::move(extents), data_bytes);
  return out;
}

}  // namespace trident
