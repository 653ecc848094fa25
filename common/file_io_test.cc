#include "common/file_io.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace pp {
namespace {

namespace fs = std::filesystem;

// An empty directory `name` under $TEST_TMPDIR (or /tmp).
std::string FreshDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(root != nullptr ? root : "/tmp") / ("file_io_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

TEST(FileIoTest, WriteSyncedThenReadWholeFileRoundTrips) {
  std::string path = FreshDir("roundtrip") + "/f.bin";
  std::string data("a\0b\nc", 5);
  ASSERT_TRUE(WriteFileSynced(path, data).ok());
  auto back = ReadWholeFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, data);
  // Overwrites (truncates) an existing file.
  ASSERT_TRUE(WriteFileSynced(path, "x").ok());
  EXPECT_EQ(*ReadWholeFile(path), "x");
  ASSERT_TRUE(WriteFileSynced(path, "").ok());
  EXPECT_EQ(*ReadWholeFile(path), "");
}

TEST(FileIoTest, MissingPathsAreNotFoundNamingThePath) {
  std::string dir = FreshDir("missing");
  std::string path = dir + "/nope/f.bin";
  auto read = ReadWholeFile(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(read.status().message().find(path), std::string::npos) << read.status();
  absl::Status write = WriteFileSynced(path, "x");
  EXPECT_EQ(write.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(write.message().find(path), std::string::npos) << write;
  absl::Status sync = SyncFile(path);
  EXPECT_EQ(sync.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(sync.message().find(path), std::string::npos) << sync;
  auto mapped = MappedFile::Open(path);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(mapped.status().message().find(path), std::string::npos) << mapped.status();
  EXPECT_TRUE(RemoveTree(path).ok());
}

TEST(FileIoTest, WriteFileDurablyReplacesAndLeavesNoTemporary) {
  std::string dir = FreshDir("durable");
  std::string path = dir + "/latest";
  ASSERT_TRUE(WriteFileDurably(path, "step_1\n").ok());
  ASSERT_TRUE(WriteFileDurably(path, "step_2\n").ok());
  EXPECT_EQ(*ReadWholeFile(path), "step_2\n");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_TRUE(SyncFile(dir).ok());
}

TEST(FileIoTest, RemoveTreeRemovesNestedDirectories) {
  std::string dir = FreshDir("tree");
  fs::create_directories(dir + "/a/b");
  ASSERT_TRUE(WriteFileSynced(dir + "/a/b/f", "x").ok());
  ASSERT_TRUE(RemoveTree(dir + "/a").ok());
  EXPECT_FALSE(fs::exists(dir + "/a"));
}

TEST(FileIoTest, MappedFileIsCopyOnWrite) {
  std::string path = FreshDir("mapped") + "/f.bin";
  ASSERT_TRUE(WriteFileSynced(path, "hello").ok());
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->size(), 5u);
  EXPECT_EQ(std::string((*file)->data(), 5), "hello");
  // Writing the mapping (as zero-copy tensors may) does not reach the file.
  const_cast<char*>((*file)->data())[0] = 'J';
  EXPECT_EQ(std::string((*file)->data(), 5), "Jello");
  EXPECT_EQ(*ReadWholeFile(path), "hello");

  std::string empty = path + ".empty";
  ASSERT_TRUE(WriteFileSynced(empty, "").ok());
  auto none = MappedFile::Open(empty);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ((*none)->size(), 0u);
  EXPECT_EQ((*none)->data(), nullptr);
}

}  // namespace
}  // namespace pp
