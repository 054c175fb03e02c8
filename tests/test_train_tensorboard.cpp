// train/tensorboard.hpp's encoders against published constants: CRC-32C's check value, the
// TFRecord framing, and the protobuf bytes of a scalar Event. (tools_tensorboard_events reads
// a whole run's files back with TensorBoard's own reader.)
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "train/tensorboard.hpp"

namespace trident::tensorboard {
namespace {

uint32_t u32_at(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}

TEST(TensorBoard, Crc32cCheckValue) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC-32C catalogue's check value
  EXPECT_EQ(crc32c(""), 0u);
  const uint32_t crc = crc32c("123456789");
  EXPECT_EQ(masked_crc32c("123456789"), ((crc >> 15) | (crc << 17)) + 0xA282EAD8u);
}

TEST(TensorBoard, RecordFraming) {
  const std::string data = "hello";
  const std::string record = tfrecord(data);
  ASSERT_EQ(record.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(u32_at(record, 0), data.size());  // little-endian uint64 length
  EXPECT_EQ(u32_at(record, 4), 0u);
  EXPECT_EQ(u32_at(record, 8), masked_crc32c(record.substr(0, 8)));
  EXPECT_EQ(record.substr(12, data.size()), data);
  EXPECT_EQ(u32_at(record, 12 + data.size()), masked_crc32c(data));
}

TEST(TensorBoard, ScalarEventBytes) {
  const std::string e = scalars_event(0.0, 300, {{"loss", 1.5f}});
  // wall_time (field 1, fixed64) 0.0; step (field 2, varint) 300 = 0xAC 0x02; summary (field
  // 5, 13 bytes): value (field 1, 11 bytes): tag (field 1) "loss", simple_value (field 2,
  // fixed32) 1.5f = 0x3FC00000.
  const std::string expected = std::string("\x09\0\0\0\0\0\0\0\0", 9) + "\x10\xAC\x02" +
                               "\x2A\x0D" + "\x0A\x0B" + "\x0A\x04loss" +
                               std::string("\x15\x00\x00\xC0\x3F", 5);
  EXPECT_EQ(e, expected);
}

}  // namespace
}  // namespace trident::tensorboard
