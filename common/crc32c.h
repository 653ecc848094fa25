// CRC32C (Castagnoli polynomial), the checksum of checkpoint files and of
// TensorBoard's record framing. Hardware (SSE4.2) when the CPU has it, a
// slicing-by-8 table otherwise; both give the same value.
#ifndef COMMON_CRC32C_H_
#define COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace pp {

// CRC32C of `size` bytes at `data`, continuing from `crc` (0 to start):
// Crc32c(b, nb, Crc32c(a, na)) == Crc32c(a || b).
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);

namespace internal_crc32c {
// Exposed for tests: the portable table-driven CRC32C.
uint32_t Crc32cPortable(const void* data, size_t size, uint32_t crc);
}  // namespace internal_crc32c

}  // namespace pp

#endif  // COMMON_CRC32C_H_
