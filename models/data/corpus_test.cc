#include "models/data/corpus.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace pp {
namespace {

namespace fs = std::filesystem;

class CorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "sub");
  }
  void Write(const fs::path& relative, const std::string& contents) {
    std::ofstream(dir_ / relative, std::ios::binary) << contents;
  }
  fs::path dir_;
};

TEST_F(CorpusTest, ReadsAFile) {
  Write("a.txt", "hello world");
  absl::StatusOr<Corpus> corpus = LoadCorpus((dir_ / "a.txt").string());
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_EQ(corpus->text, "hello world\n\n");
  EXPECT_EQ(corpus->files.size(), 1u);
}

TEST_F(CorpusTest, ReadsADirectoryInSortedOrderOnceSkippingBinaryAndEmpty) {
  Write("b.txt", "second");
  Write("a.txt", "first");
  Write("sub/c.txt", "third");
  Write("empty.txt", "");
  Write("blob.bin", std::string("x\0y", 3));
  fs::create_symlink(dir_ / "a.txt", dir_ / "z_link_to_a");
  absl::StatusOr<Corpus> corpus = LoadCorpus(dir_.string());
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_EQ(corpus->text, "first\n\nsecond\n\nthird\n\n");
  EXPECT_EQ(corpus->files.size(), 3u);
}

TEST_F(CorpusTest, MissingPathIsNotFoundAndNamesIt) {
  absl::StatusOr<Corpus> corpus = LoadCorpus((dir_ / "nope").string());
  EXPECT_EQ(corpus.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(corpus.status().message().find("nope"), std::string::npos);
  EXPECT_NE(corpus.status().message().find("--data"), std::string::npos);
}

TEST_F(CorpusTest, FolderWithoutTextIsInvalid) {
  Write("empty.txt", "");
  EXPECT_EQ(LoadCorpus(dir_.string()).status().code(), absl::StatusCode::kInvalidArgument);
}

// `ln -s . d/s1; ln -s . d/s2`: a recursive walk following links would visit
// 2^depth paths (issue 29, finding 3). Each folder is entered once.
TEST_F(CorpusTest, FolderLinkedToItselfIsWalkedOnce) {
  Write("a.txt", "first");
  Write("sub/c.txt", "third");
  fs::create_directory_symlink(".", dir_ / "s1");
  fs::create_directory_symlink(".", dir_ / "s2");
  fs::create_directory_symlink("..", dir_ / "sub" / "up");
  absl::StatusOr<CorpusListing> listing = ListCorpusFiles(dir_.string());
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(listing->files.size(), 2u);
  EXPECT_EQ(listing->repeated_folders, 3);
  absl::StatusOr<Corpus> corpus = LoadCorpus(dir_.string());
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_EQ(corpus->text, "first\n\nthird\n\n");
}

TEST_F(CorpusTest, TooManyEntriesAreRefusedNamingTheFolder) {
  for (int i = 0; i < 5; ++i) Write("f" + std::to_string(i), "x");
  absl::StatusOr<CorpusListing> listing = ListCorpusFiles(dir_.string(), /*max_entries=*/4);
  EXPECT_EQ(listing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(listing.status().message().find(dir_.string()), std::string::npos);
  EXPECT_NE(listing.status().message().find("more than 4 entries"), std::string::npos);
}

TEST(SplitTrainEvalTest, TakesTheTail) {
  auto [train, eval] = SplitTrainEval({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 0.2);
  EXPECT_EQ(train, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(eval, (std::vector<int64_t>{8, 9}));
  EXPECT_TRUE(SplitTrainEval({1, 2}, 0.0).second.empty());
}

TEST(DefaultCorpusTest, DebianCommonLicensesArePresent) {
  // base-files is Essential on Debian: the default corpus must always load.
  absl::StatusOr<Corpus> corpus = LoadCorpus(kDefaultCorpusPath);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_GT(corpus->text.size(), 100000u);
  EXPECT_NE(corpus->text.find("GNU GENERAL PUBLIC LICENSE"), std::string::npos);
}

TEST(SplitParagraphsTest, BlankLinesSeparateParagraphs) {
  EXPECT_EQ(SplitParagraphs("a b\nc\n\n  \nd\n\n\ne"),
            (std::vector<std::string>{"a b\nc\n", "d\n", "e"}));
  EXPECT_TRUE(SplitParagraphs("\n \n").empty());
}

}  // namespace
}  // namespace pp
