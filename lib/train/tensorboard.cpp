#include "train/tensorboard.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "util/append_whole.hpp"
#include "util/error.hpp"

namespace trident::tensorboard {
namespace {

// Protocol buffer wire format: a field key is (field number << 3) | wire type.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | type);
}

template <typename T>
void put_little_endian(std::string& out, T bits) {
  for (size_t i = 0; i < sizeof(T); ++i) out += static_cast<char>((bits >> (8 * i)) & 0xFF);
}

void put_double(std::string& out, uint32_t field, double v) {
  put_key(out, field, kFixed64);
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_little_endian(out, bits);
}

void put_float(std::string& out, uint32_t field, float v) {
  put_key(out, field, kFixed32);
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_little_endian(out, bits);
}

void put_int(std::string& out, uint32_t field, int64_t v) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(v));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// Field numbers of event.proto / summary.proto / tensor.proto.
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2, kValueTensor = 8, kValueMetadata = 9;
constexpr uint32_t kMetadataPluginData = 1, kPluginDataName = 1;
constexpr uint32_t kTensorDtype = 1, kTensorShape = 2, kTensorStringVal = 8;
constexpr int64_t kDtypeString = 7;  // types.proto DT_STRING

std::string event_with_summary(double wall_time, int64_t step, const std::string& summary) {
  std::string event;
  put_double(event, kEventWallTime, wall_time);
  put_int(event, kEventStep, step);
  put_bytes(event, kEventSummary, summary);
  return event;
}

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0);
    table[i] = crc;
  }
  return table;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  uint32_t crc = 0xFFFFFFFFu;
  for (char ch : data) crc = table[(crc ^ static_cast<uint8_t>(ch)) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

std::string tfrecord(std::string_view data) {
  std::string record;
  put_little_endian(record, static_cast<uint64_t>(data.size()));
  put_little_endian(record, masked_crc32c(record));
  record += data;
  put_little_endian(record, masked_crc32c(data));
  return record;
}

std::string file_version_event(double wall_time) {
  std::string event;
  put_double(event, kEventWallTime, wall_time);
  put_bytes(event, kEventFileVersion, "brain.Event:2");
  return event;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<Scalar>& scalars) {
  std::string summary;
  for (const Scalar& s : scalars) {
    std::string value;
    put_bytes(value, kValueTag, s.tag);
    put_float(value, kValueSimpleValue, s.value);
    put_bytes(summary, kSummaryValue, value);
  }
  return event_with_summary(wall_time, step, summary);
}

std::string text_event(double wall_time, int64_t step, const std::string& tag,
                       const std::string& text) {
  std::string plugin_data, metadata, tensor, value, summary;
  put_bytes(plugin_data, kPluginDataName, "text");
  put_bytes(metadata, kMetadataPluginData, plugin_data);
  put_int(tensor, kTensorDtype, kDtypeString);
  put_bytes(tensor, kTensorShape, "");  // no dimensions: a scalar string
  put_bytes(tensor, kTensorStringVal, text);
  put_bytes(value, kValueTag, tag);
  put_bytes(value, kValueTensor, tensor);
  put_bytes(value, kValueMetadata, metadata);
  put_bytes(summary, kSummaryValue, value);
  return event_with_summary(wall_time, step, summary);
}

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("log.dir '" + dir + "': cannot create directory: " + ec.message());
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  // The pid tells apart two starts within one second (a quick requeue on the same node).
  path_ = dir + "/events.out.tfevents." +
          std::to_string(static_cast<int64_t>(wall_time_now())) + "." + host + "." +
          std::to_string(::getpid());
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open '" + path_ + "' for writing: " + std::strerror(errno));
  if (const int err = write_event(file_version_event(wall_time_now())); err != 0) {
    ::close(fd_);
    throw Error("cannot write '" + path_ + "': " + std::strerror(err));
  }
}

EventWriter::~EventWriter() {
  if (fd_ >= 0) ::close(fd_);
}

int EventWriter::write_event(const std::string& event) {
  // A reader stops at a broken record: append_whole cuts a partial one off so later ones are
  // read.
  return append_whole(fd_, tfrecord(event));
}

}  // namespace trident::tensorboard
