// The safetensors reader and writer (safetensors.h): a round trip, and the
// corrupt files it refuses naming what is wrong.
#include "checkpoint/hf/safetensors.h"

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "checkpoint/hf/hf_test_support.h"

namespace pp {
namespace {

using hf_testing::TempPath;

TEST(SafetensorsTest, RoundTripAndCorruptFiles) {
  SafetensorsFile file;
  file.metadata["format"] = "pt";
  file.tensors = {{"a", torch::randn({3, 4})},
                  {"b", torch::arange(5, torch::kLong)},
                  {"c", torch::randn({2}).to(torch::kBFloat16)},
                  {"empty", torch::zeros({0, 3})}};
  const std::string path = TempPath("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, file).ok());
  absl::StatusOr<SafetensorsFile> read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->metadata, file.metadata);
  ASSERT_EQ(read->tensors.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(read->tensors[i].first, file.tensors[i].first);
    EXPECT_TRUE(torch::equal(read->tensors[i].second, file.tensors[i].second));
  }
  // The data starts 8-byte aligned.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(static_cast<uint8_t>(bytes[0]) % 8, 0);
  // Truncated data, a broken header, a too-long header length.
  std::ofstream(TempPath("short.safetensors"), std::ios::binary)
      << bytes.substr(0, bytes.size() - 4);
  EXPECT_NE(ReadSafetensors(TempPath("short.safetensors")).status().message().find("do not hold"),
            std::string::npos);
  std::string broken = bytes;
  broken[8] = '[';
  std::ofstream(TempPath("broken.safetensors"), std::ios::binary) << broken;
  EXPECT_NE(
      ReadSafetensors(TempPath("broken.safetensors")).status().message().find("not a JSON object"),
      std::string::npos);
  std::string huge = bytes;
  huge[6] = 1;
  std::ofstream(TempPath("huge.safetensors"), std::ios::binary) << huge;
  EXPECT_NE(
      ReadSafetensors(TempPath("huge.safetensors")).status().message().find("exceeds the file"),
      std::string::npos);
  SafetensorsFile twice;
  twice.tensors = {{"a", torch::zeros({1})}, {"a", torch::zeros({1})}};
  EXPECT_EQ(WriteSafetensors(TempPath("twice.safetensors"), twice).code(),
            absl::StatusCode::kInvalidArgument);
}

// Issue #42 class 3: a safetensors header is file contents, checked like a
// config field: an element count beyond int64 and two tensors sharing bytes
// are refused, not aborted on or read silently.
TEST(SafetensorsTest, RefusesOverflowingShapesAndOverlappingOffsets) {
  auto write = [](const std::string& name, const std::string& header, int data_bytes) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    bytes += header + std::string(data_bytes, '\0');
    std::ofstream(TempPath(name), std::ios::binary) << bytes;
    return std::string(ReadSafetensors(TempPath(name)).status().message());
  };
  EXPECT_NE(
      write("huge_shape.safetensors",
            R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8)
          .find("tensor a: shape [4294967296,4294967296] has more elements than any file"),
      std::string::npos);
  EXPECT_NE(write("huge_bytes.safetensors",
                  R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8)
                .find("has more bytes than any file can hold"),
            std::string::npos);
  EXPECT_NE(write("overlap.safetensors",
                  R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  12)
                .find("tensor b: data_offsets [4, 12] overlap those of tensor a [0, 8]"),
            std::string::npos);
  // Adjacent and empty tensors do not overlap.
  EXPECT_EQ(write("adjacent.safetensors",
                  R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                  12),
            "");
}

}  // namespace
}  // namespace pp
