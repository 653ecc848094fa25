#include "common/regular_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace pp {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

TEST(RegularFileTest, ReadsARegularFileWhole) {
  const std::string path = TempDir() + "/plain.txt";
  std::ofstream(path) << "abc";
  absl::StatusOr<std::string> text = ReadRegularFile("token file", path);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "abc");
  // A link to a regular file is followed.
  const std::string link = TempDir() + "/link.txt";
  ::unlink(link.c_str());
  ASSERT_EQ(::symlink(path.c_str(), link.c_str()), 0);
  EXPECT_EQ(*ReadRegularFile("token file", link), "abc");
}

// Issue #42 class 4: a FIFO blocked every reader but data.path's. Refused
// without waiting for a writer (the test would hang otherwise), as are a
// device and a directory.
TEST(RegularFileTest, RefusesFifosDevicesAndDirectoriesWithoutBlocking) {
  const std::string fifo = TempDir() + "/fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::string> read = ReadRegularFile("tokenizer", fifo);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(read.status().message(),
            "tokenizer '" + fifo +
                "' is a FIFO; give a regular file (a FIFO or device would block or never end)");
  EXPECT_NE(OpenRegularFile("x", "/dev/zero").status().message().find("is a device"),
            std::string::npos);
  EXPECT_NE(OpenRegularFile("x", TempDir()).status().message().find("is a directory"),
            std::string::npos);
  EXPECT_EQ(OpenRegularFile("x", TempDir() + "/missing").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pp
