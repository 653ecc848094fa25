#include "observability/tfrecord.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace pp {
namespace {

// Reference bytes below were produced by TensorBoard 2.21's own Python writer
// (tensorboard.summary.writer.record_writer.RecordWriter) and its
// masked_crc32c, not by this code.
std::string Hex(const std::string& bytes) { return absl::BytesToHexString(bytes); }

TEST(TfRecordTest, MaskMatchesTensorBoard) {
  EXPECT_EQ(MaskCrc32c(0), 0xa282ead8u);
  EXPECT_EQ(MaskedCrc32c("", 0), 0xa282ead8u);
  EXPECT_EQ(MaskedCrc32c("123456789", 9), 0xc78ab0e5u);  // CRC32C 0xe3069283
  const std::string zeros(32, '\0');
  EXPECT_EQ(MaskedCrc32c(zeros.data(), zeros.size()), 0x0fd7fffau);  // CRC32C 0x8a9136aa
}

TEST(TfRecordTest, UnmaskInvertsMask) {
  for (uint32_t crc : {0u, 1u, 0xe3069283u, 0x8a9136aau, 0xffffffffu, 0x80000000u}) {
    EXPECT_EQ(UnmaskCrc32c(MaskCrc32c(crc)), crc) << crc;
    EXPECT_NE(MaskCrc32c(crc), crc) << crc;
  }
}

TEST(TfRecordTest, FramingMatchesTensorBoardBytes) {
  EXPECT_EQ(Hex(FrameRecord("")), "000000000000000029039807d8ea82a2");
  EXPECT_EQ(Hex(FrameRecord("hello")), "0500000000000000eab2043e68656c6c6fbb1f1c19");
  EXPECT_EQ(Hex(FrameRecord("brain.Event:2")),
            "0d000000000000003c37b834627261696e2e4576656e743a32ee01067c");
}

TEST(TfRecordTest, ParsesWhatItFrames) {
  std::string binary("a\0b\xff", 4);
  std::string big(100000, 'x');
  std::string bytes =
      FrameRecord("first") + FrameRecord("") + FrameRecord(binary) + FrameRecord(big);
  auto records = ParseRecords(bytes);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 4u);
  EXPECT_EQ((*records)[0], "first");
  EXPECT_EQ((*records)[1], "");
  EXPECT_EQ((*records)[2], binary);
  EXPECT_EQ((*records)[3], big);
}

TEST(TfRecordTest, RejectsTruncatedAndCorruptRecords) {
  const std::string good = FrameRecord("payload");
  auto truncated = ParseRecords(good + good.substr(0, good.size() - 1));
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(truncated.status().message().find("byte 23"), std::string::npos) << truncated.status();

  auto short_header = ParseRecords(good.substr(0, 5));
  EXPECT_EQ(short_header.status().code(), absl::StatusCode::kDataLoss);

  std::string bad_payload = good;
  bad_payload[13] ^= 1;
  auto payload = ParseRecords(bad_payload);
  EXPECT_EQ(payload.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(payload.status().message().find("payload"), std::string::npos) << payload.status();

  std::string bad_length = good;
  bad_length[0] ^= 1;
  auto length = ParseRecords(bad_length);
  EXPECT_EQ(length.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(length.status().message().find("length"), std::string::npos) << length.status();
}

TEST(TfRecordTest, ReadsAFileAndNamesAMissingOne) {
  const std::string path = ::testing::TempDir() + "/records";
  {
    std::ofstream out(path, std::ios::binary);
    out << FrameRecord("one") << FrameRecord("two");
  }
  auto records = ReadRecords(path);
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ(*records, (std::vector<std::string>{"one", "two"}));

  auto missing = ReadRecords(path + ".missing");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("records.missing"), std::string::npos);
}

}  // namespace
}  // namespace pp
