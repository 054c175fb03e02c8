// The safetensors layer of the Hugging Face export/import (lib/interop/safetensors.hpp): the
// header bytes the reference implementation writes, dtype conversions, and one-line errors for
// files that are not safetensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "interop/safetensors.hpp"
#include "run_util.hpp"
#include "util/error.hpp"

using namespace trident;

namespace {

uint16_t to_f16(float f) {
  std::byte b[2];
  convert_from_float32(TensorDType::F16, &f, 1, b);
  uint16_t h;
  std::memcpy(&h, b, 2);
  return h;
}

float from_f16(uint16_t h) {
  float f;
  convert_to_float32(TensorDType::F16, reinterpret_cast<const std::byte*>(&h), 1, &f);
  return f;
}

}  // namespace

TEST(Safetensors, HeaderIsWhatTheReferenceWrites) {
  // safetensors.numpy.save_file({"b": zeros((2, 3), f32), "a": zeros(2, f32)},
  // metadata={"format": "pt"}) writes these bytes (names sorted, compact JSON, spaces to a
  // multiple of 8).
  const SafetensorsLayout l = plan_safetensors({{"b", {2, 3}}, {"a", {2}}}, TensorDType::F32);
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]}})";
  const size_t padded = (json.size() + 7) / 8 * 8;
  ASSERT_EQ(l.header.size(), 8 + padded);
  uint64_t n = 0;
  std::memcpy(&n, l.header.data(), 8);
  EXPECT_EQ(n, padded);
  EXPECT_EQ(l.header.substr(8), json + std::string(padded - json.size(), ' '));
  EXPECT_EQ(l.data_start, static_cast<int64_t>(8 + padded));
  EXPECT_EQ(l.file_size, l.data_start + 32);
  ASSERT_EQ(l.entries.size(), 2u);
  EXPECT_EQ(l.entries[0].name, "a");
  EXPECT_EQ(l.entry("b").begin, 8);
}

TEST(Safetensors, Float16ConversionRoundsToNearestEven) {
  EXPECT_EQ(to_f16(1.0f), 0x3C00);
  EXPECT_EQ(to_f16(-2.0f), 0xC000);
  EXPECT_EQ(to_f16(65504.0f), 0x7BFF);                   // largest half
  EXPECT_EQ(to_f16(65520.0f), 0x7C00);                   // rounds to inf
  EXPECT_EQ(to_f16(std::ldexp(1.0f, -24)), 0x0001);      // smallest subnormal
  EXPECT_EQ(to_f16(std::ldexp(1.0f, -25)), 0x0000);      // tie to even: 0
  EXPECT_EQ(to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie to even: down
  EXPECT_EQ(to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie to even: up
  EXPECT_EQ(to_f16(1.0f / 3.0f), 0x3555);
  EXPECT_TRUE(std::isnan(from_f16(to_f16(std::numeric_limits<float>::quiet_NaN()))));
  // Every half converts to float and back unchanged (NaNs stay NaNs).
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = from_f16(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(to_f16(f), h) << std::hex << h;
  }
  EXPECT_EQ(from_f16(0x3C00), 1.0f);
  EXPECT_EQ(from_f16(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(from_f16(0xFC00), -std::numeric_limits<float>::infinity());
}

TEST(Safetensors, Bfloat16IsTheUpperHalfRoundedToNearestEven) {
  const float values[] = {1.0f, -3.5f, 1.0f + std::ldexp(1.0f, -8), 1e-40f};
  std::byte bytes[8];
  convert_from_float32(TensorDType::BF16, values, 4, bytes);
  float back[4];
  convert_to_float32(TensorDType::BF16, bytes, 4, back);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -3.5f);
  EXPECT_EQ(back[2], 1.0f);  // the tie goes to the even neighbour
  uint16_t first;
  std::memcpy(&first, bytes, 2);
  EXPECT_EQ(first, 0x3F80);
}

TEST(Safetensors, ReadsItsOwnLayoutAndRejectsDamagedFiles) {
  const auto dir = trident::test::scratch_dir("safetensors");
  const SafetensorsLayout l = plan_safetensors({{"w", {3, 2}}, {"v", {4}}}, TensorDType::BF16);
  const auto path = (dir / "m.safetensors").string();
  {
    std::ofstream out(path, std::ios::binary);
    out << l.header << std::string(l.file_size - l.data_start, '\0');
  }
  const auto tensors = read_safetensors_header(path);
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors.at("w").shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(tensors.at("w").dtype_text, "BF16");
  EXPECT_EQ(tensors.at("w").offset, l.data_start + l.entry("w").begin);
  EXPECT_EQ(tensors.at("v").bytes, 8);

  auto expect_error = [&](const std::string& contents, const std::string& needle) {
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << contents;
    }
    try {
      read_safetensors_header(path);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("safetensors '" + path + "': "), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  };
  expect_error("abc", "not a safetensors file (3 bytes)");
  expect_error(l.header.substr(0, 20), "header length");
  expect_error(l.header + std::string(4, '\0'), "run past the file");  // truncated data
  std::string not_json = l.header;
  not_json[9] = '[';
  expect_error(not_json + std::string(l.file_size - l.data_start, '\0'), "not JSON");
  std::filesystem::remove_all(dir);
}

// Found with tests/fuzz/fuzz_safetensors (the seed huge_shape; offsets_wrap made by hand):
// sizes and offsets are JSON integers up to 2^64 - 1; a shape whose element count overflows
// int64, and offsets past INT64_MAX (which wrapped negative and were accepted for an
// unsupported dtype, pointing before the data), are refused naming the file.
TEST(Safetensors, SizesAndOffsetsPast64BitsAreRefused) {
  const auto dir = trident::test::scratch_dir("safetensors_hostile");
  const auto path = (dir / "m.safetensors").string();
  auto error_for = [&](std::string json, size_t data_bytes = 24) {
    json.append((8 - json.size() % 8) % 8, ' ');
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
    file += json + std::string(data_bytes, '\0');
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << file;
    }
    try {
      const auto tensors = read_safetensors_header(path);
      return std::string("accepted, offset ") + std::to_string(tensors.begin()->second.offset);
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  auto expect_refused = [&](const std::string& json, const std::string& needle) {
    const std::string what = error_for(json);
    EXPECT_NE(what.find("safetensors '" + path + "': "), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  };
  // 2^62 * 4 elements: the count overflows (it used to, silently: undefined behaviour).
  expect_refused(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,24]}})",
                 "has more elements than fit in 64 bits");
  // 2^63 in one dimension: not an int64.
  expect_refused(R"({"a":{"dtype":"F32","shape":[9223372036854775808,0],"data_offsets":[0,0]}})",
                 "has more elements than fit in 64 bits");
  // 2^61 F32 elements fit int64, their 2^63 bytes do not.
  expect_refused(R"({"a":{"dtype":"F32","shape":[2305843009213693952],"data_offsets":[0,24]}})",
                 "needs more bytes than fit in 64 bits");
  // Offsets 2^64 - 1 wrapped to -1 and passed begin <= end <= data bytes.
  expect_refused(
      R"({"i":{"dtype":"I64","shape":[1],"data_offsets":[18446744073709551615,18446744073709551615]}})",
      "run past the file");
  // A zero-size dimension makes any other dimension harmless (a file of no data bytes, which
  // the empty tensor covers).
  EXPECT_EQ(error_for(R"({"e":{"dtype":"F32","shape":[0,9223372036854775807],"data_offsets":[0,0]}})", 0),
            "accepted, offset 88");  // 8 + the 80-byte padded header
  // And in either order (fuzz_safetensors's harness once refused this one, the reader never).
  EXPECT_EQ(error_for(R"({"e":{"dtype":"F32","shape":[9223372036854775807,0],"data_offsets":[0,0]}})", 0),
            "accepted, offset 88");
  std::filesystem::remove_all(dir);
}

// Found with tests/fuzz/fuzz_safetensors (a hand-made input, corpus: newline_in_name): a
// tensor name or dtype from the file with a newline in it made the error (and the import's
// unsupported-dtype error, which prints dtype_text) several lines; both are JSON-escaped now.
TEST(Safetensors, NamesAndDtypesFromTheFileStayOnOneLine) {
  const auto dir = trident::test::scratch_dir("safetensors_newline");
  const auto path = (dir / "m.safetensors").string();
  auto write = [&](std::string json) {
    json.append((8 - json.size() % 8) % 8, ' ');
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << file << json << std::string(8, '\0');
  };
  write(R"({"a\nb":{"dtype":"F32","shape":[2],"data_offsets":[0,99]}})");
  try {
    read_safetensors_header(path);
    ADD_FAILURE() << "offsets past the file accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_NE(what.find(R"(tensor 'a\nb': data_offsets [0,99] run past the file)"), std::string::npos)
        << what;
  }
  write(R"({"x":{"dtype":"I\n8","shape":[8],"data_offsets":[0,8]}})");
  const auto tensors = read_safetensors_header(path);
  EXPECT_FALSE(tensors.at("x").supported);
  EXPECT_EQ(tensors.at("x").dtype_text, R"(I\n8)");
  std::filesystem::remove_all(dir);
}

// Issue 56: tensors whose data_offsets share bytes were read (the import wrote a bias equal to
// its weight). The reference refuses them, and gaps and bytes past the last tensor too: in the
// order of their offsets, the tensors' bytes follow each other from 0 to the end of the file.
// Each case is also given to the reference (the safetensors package in .venv) where it is
// installed: the verdicts agree.
TEST(Safetensors, TensorsTileTheDataAsTheReferenceRequires) {
  const auto dir = trident::test::scratch_dir("safetensors_tiling");
  struct Case {
    const char* name;
    std::string json;
    size_t data_bytes;
    std::string error;  // "" accepted
  };
  auto f32 = [](const char* name, int elements, int begin, int end) {
    return "\"" + std::string(name) + "\":{\"dtype\":\"F32\",\"shape\":[" +
           std::to_string(elements) + "],\"data_offsets\":[" + std::to_string(begin) + "," +
           std::to_string(end) + "]}";
  };
  const std::vector<Case> cases = {
      {"tiled", "{" + f32("a", 2, 0, 8) + "," + f32("b", 2, 8, 16) + "}", 16, ""},
      // Offsets in another order than the names: the reference sorts by offsets.
      {"reordered", "{" + f32("a", 2, 8, 16) + "," + f32("b", 2, 0, 8) + "}", 16, ""},
      {"empty_tensor", "{" + f32("a", 2, 0, 8) + "," + f32("e", 0, 0, 0) + "}", 8, ""},
      {"same_bytes", "{" + f32("w", 2, 0, 8) + "," + f32("w_alias", 2, 0, 8) + "}", 8,
       "data_offsets [0,8] overlap tensor '"},
      {"partial_overlap", "{" + f32("a", 2, 0, 8) + "," + f32("b", 2, 4, 12) + "}", 12,
       "tensor 'b': data_offsets [4,12] overlap tensor 'a' [0,8] (each byte belongs to one "
       "tensor)"},
      {"gap", "{" + f32("a", 2, 0, 8) + "," + f32("b", 2, 12, 20) + "}", 20,
       "tensor 'b': data_offsets [12,20] leave bytes 8 to 12 of the data to no tensor"},
      {"gap_first", "{" + f32("a", 2, 4, 12) + "}", 12,
       "tensor 'a': data_offsets [4,12] leave bytes 0 to 4 of the data to no tensor"},
      {"trailing", "{" + f32("a", 2, 0, 8) + "}", 12,
       "the tensors cover 8 of the file's 12 data bytes (they must end at its end)"},
  };
  const std::string python = std::string(TRIDENT_SOURCE_DIR) + "/.venv/bin/python";
  const bool reference =
      trident::test::run_command(python + " -c 'import safetensors'").exit_code == 0;
  for (const Case& c : cases) {
    std::string json = c.json;
    json.append((8 - json.size() % 8) % 8, ' ');
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
    const std::string path = (dir / (std::string(c.name) + ".safetensors")).string();
    std::ofstream(path, std::ios::binary) << file << json << std::string(c.data_bytes, '\0');
    std::string error;
    try {
      read_safetensors_header(path);
    } catch (const Error& e) {
      error = e.what();
    }
    if (c.error.empty()) {
      EXPECT_EQ(error, "") << c.name;
    } else {
      EXPECT_NE(error.find("safetensors '" + path + "': "), std::string::npos) << error;
      EXPECT_NE(error.find(c.error), std::string::npos) << c.name << ": " << error;
    }
    if (!reference) continue;
    const auto r = trident::test::run_command(
        python + " -c 'import sys; from safetensors import safe_open; safe_open(sys.argv[1], "
                 "\"np\")' " + path);
    EXPECT_EQ(r.exit_code == 0, c.error.empty()) << c.name << ": the reference says " << r.output;
  }
  std::filesystem::remove_all(dir);
  if (!reference) GTEST_SKIP() << "no safetensors in " << python << ": the reference not asked";
}
