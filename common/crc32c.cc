#include "common/crc32c.h"

#include <array>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace pp {
namespace {

struct Crc32cTables {
  // Slicing-by-8 tables for the reflected Castagnoli polynomial.
  std::array<std::array<uint32_t, 256>, 8> t;
  Crc32cTables() {
    constexpr uint32_t kPoly = 0x82F63B78u;
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};

const Crc32cTables& Tables() {
  static const Crc32cTables* tables = new Crc32cTables();
  return *tables;
}

#if defined(__x86_64__)
// Column `bit` is the register 1<<bit advanced over `zeros` zero bytes.
__attribute__((target("sse4.2"))) std::array<uint32_t, 32>* ZerosShiftMatrix(size_t zeros) {
  auto* m = new std::array<uint32_t, 32>();
  for (int bit = 0; bit < 32; ++bit) {
    uint32_t r = 1u << bit;
    for (size_t i = 0; i < zeros; ++i) r = _mm_crc32_u8(r, 0);
    (*m)[bit] = r;
  }
  return m;
}

__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(const void* data, size_t size,
                                                       uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  while (size > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --size;
  }
  // Three independent streams hide the instruction's 3-cycle latency.
  constexpr size_t kBlock = 4096;
  while (size >= 3 * kBlock) {
    uint64_t c1 = 0, c2 = 0;
    const auto* p0 = reinterpret_cast<const uint64_t*>(p);
    const auto* p1 = reinterpret_cast<const uint64_t*>(p + kBlock);
    const auto* p2 = reinterpret_cast<const uint64_t*>(p + 2 * kBlock);
    for (size_t i = 0; i < kBlock / 8; ++i) {
      c = _mm_crc32_u64(c, p0[i]);
      c1 = _mm_crc32_u64(c1, p1[i]);
      c2 = _mm_crc32_u64(c2, p2[i]);
    }
    // Combine the streams: the register after A||B is Z(reg_A) ^ reg_B,
    // where reg_B started from 0 and Z advances a register over |B| zero
    // bytes. Z is linear over GF(2), so it is a 32x32 bit matrix.
    uint32_t a = static_cast<uint32_t>(c);
    uint32_t b = static_cast<uint32_t>(c1);
    uint32_t d = static_cast<uint32_t>(c2);
    static const std::array<uint32_t, 32>* shift = ZerosShiftMatrix(kBlock);
    auto apply = [&](uint32_t v) {
      uint32_t out = 0;
      for (int bit = 0; v != 0; ++bit, v >>= 1) {
        if (v & 1) out ^= (*shift)[bit];
      }
      return out;
    };
    a = apply(a) ^ b;
    a = apply(a) ^ d;
    c = a;
    p += 3 * kBlock;
    size -= 3 * kBlock;
  }
  while (size >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    size -= 8;
  }
  while (size > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --size;
  }
  return ~static_cast<uint32_t>(c);
}
#endif

}  // namespace

namespace internal_crc32c {

uint32_t Crc32cPortable(const void* data, size_t size, uint32_t crc) {
  const auto& t = Tables().t;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (size >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return ~c;
}

}  // namespace internal_crc32c

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return Crc32cSse42(data, size, crc);
#endif
  return internal_crc32c::Crc32cPortable(data, size, crc);
}

}  // namespace pp
