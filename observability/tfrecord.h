// TFRecord framing, the container of TensorBoard event files: each record is
//   uint64 length (little-endian)   uint32 masked CRC32C of those 8 bytes
//   payload (length bytes)          uint32 masked CRC32C of the payload
// Writing is FrameRecord; reading (ParseRecords / ReadRecords) verifies both
// checksums, so tests and tools can read back what pipe wrote without Python.
// The event writer on top is tensorboard_writer.h.
#ifndef OBSERVABILITY_TFRECORD_H_
#define OBSERVABILITY_TFRECORD_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pp {

// TensorFlow's CRC mask: a CRC stored next to the data it covers is rotated and
// offset, so that a CRC computed over a string that itself contains CRCs stays
// strong.
uint32_t MaskCrc32c(uint32_t crc);
uint32_t UnmaskCrc32c(uint32_t masked);

// MaskCrc32c(Crc32c(data)).
uint32_t MaskedCrc32c(const void* data, size_t size);

// The bytes of one record holding `payload`.
std::string FrameRecord(absl::string_view payload);

// The payloads of the records in `bytes`, in order. DataLoss, naming the byte
// offset, if a record is truncated or a checksum does not match.
absl::StatusOr<std::vector<std::string>> ParseRecords(absl::string_view bytes);

// ParseRecords over the whole file at `path`; NotFound if it cannot be opened.
absl::StatusOr<std::vector<std::string>> ReadRecords(absl::string_view path);

}  // namespace pp

#endif  // OBSERVABILITY_TFRECORD_H_
