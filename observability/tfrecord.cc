#include "observability/tfrecord.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace pp {
namespace {

constexpr uint32_t kMaskDelta = 0xa282ead8u;
constexpr size_t kHeaderBytes = sizeof(uint64_t) + sizeof(uint32_t);
constexpr size_t kFooterBytes = sizeof(uint32_t);

// The format is little-endian whatever the host; spell the bytes out rather
// than memcpy an integer.
void AppendLittleEndian(uint64_t value, int bytes, std::string& out) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t LoadLittleEndian(const char* data, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(data[i])) << (8 * i);
  }
  return value;
}

}  // namespace

uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }

uint32_t UnmaskCrc32c(uint32_t masked) {
  const uint32_t rotated = masked - kMaskDelta;
  return (rotated >> 17) | (rotated << 15);
}

uint32_t MaskedCrc32c(const void* data, size_t size) { return MaskCrc32c(Crc32c(data, size)); }

std::string FrameRecord(absl::string_view payload) {
  std::string out;
  out.reserve(kHeaderBytes + payload.size() + kFooterBytes);
  AppendLittleEndian(payload.size(), 8, out);
  AppendLittleEndian(MaskedCrc32c(out.data(), 8), 4, out);
  out.append(payload.data(), payload.size());
  AppendLittleEndian(MaskedCrc32c(payload.data(), payload.size()), 4, out);
  return out;
}

absl::StatusOr<std::vector<std::string>> ParseRecords(absl::string_view bytes) {
  std::vector<std::string> records;
  size_t offset = 0;
  while (offset < bytes.size()) {
    if (bytes.size() - offset < kHeaderBytes) {
      return absl::DataLossError(absl::StrCat("truncated record header at byte ", offset, ": ",
                                              bytes.size() - offset, " bytes left, need ",
                                              kHeaderBytes));
    }
    const char* header = bytes.data() + offset;
    const uint64_t length = LoadLittleEndian(header, 8);
    const uint32_t length_crc = static_cast<uint32_t>(LoadLittleEndian(header + 8, 4));
    if (length_crc != MaskedCrc32c(header, 8)) {
      return absl::DataLossError(
          absl::StrCat("corrupt record length at byte ", offset, " (checksum mismatch)"));
    }
    const size_t left = bytes.size() - offset - kHeaderBytes;
    if (length > left || left - length < kFooterBytes) {
      return absl::DataLossError(absl::StrCat("truncated record at byte ", offset, ": length ",
                                              length, ", only ", left, " bytes follow"));
    }
    absl::string_view payload = bytes.substr(offset + kHeaderBytes, length);
    const uint32_t payload_crc =
        static_cast<uint32_t>(LoadLittleEndian(payload.data() + payload.size(), 4));
    if (payload_crc != MaskedCrc32c(payload.data(), payload.size())) {
      return absl::DataLossError(
          absl::StrCat("corrupt record payload at byte ", offset, " (checksum mismatch)"));
    }
    records.emplace_back(payload);
    offset += kHeaderBytes + length + kFooterBytes;
  }
  return records;
}

absl::StatusOr<std::vector<std::string>> ReadRecords(absl::string_view path) {
  std::ifstream in{std::string(path), std::ios::binary};
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open record file \"", path, "\""));
  std::stringstream contents;
  contents << in.rdbuf();
  absl::StatusOr<std::vector<std::string>> records = ParseRecords(contents.str());
  if (!records.ok()) {
    return absl::DataLossError(absl::StrCat("\"", path, "\": ", records.status().message()));
  }
  return records;
}

}  // namespace pp
