#include "common/crc32c.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pp {
namespace {

TEST(Crc32cTest, KnownVectorAndHardwareMatchesPortable) {
  const std::string check = "123456789";
  EXPECT_EQ(Crc32c(check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(internal_crc32c::Crc32cPortable(check.data(), check.size(), 0), 0xE3069283u);
  // Incremental equals one-shot.
  EXPECT_EQ(Crc32c(check.data() + 4, 5, Crc32c(check.data(), 4)), 0xE3069283u);
  std::vector<unsigned char> data(3 * 4096 * 3 + 123);
  uint32_t x = 12345;
  for (auto& b : data) b = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 24);
  for (size_t size : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{3 * 4096},
                      size_t{3 * 4096 + 9}, data.size() - 1, data.size()}) {
    for (size_t offset : {size_t{0}, size_t{1}}) {
      if (offset + size > data.size()) continue;
      EXPECT_EQ(Crc32c(data.data() + offset, size),
                internal_crc32c::Crc32cPortable(data.data() + offset, size, 0))
          << "size " << size << " offset " << offset;
    }
  }
}

}  // namespace
}  // namespace pp
