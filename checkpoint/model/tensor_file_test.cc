#include "checkpoint/model/tensor_file.h"
#include "checkpoint/model/test_files.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <ATen/ATen.h>

#include "gtest/gtest.h"

namespace pp {
namespace {

namespace fs = std::filesystem;
using checkpoint::FileInfo;
using checkpoint::test_files::FreshDir;
using checkpoint::test_files::Slurp;
using checkpoint::test_files::Spit;

TEST(TensorFileTest, RoundTripKeepsOrderDtypesShapesAndValues) {
  std::string dir = FreshDir("roundtrip");
  at::Tensor big = at::randn({10, 10});
  TensorDict dict = {{"w", at::randn({3, 5})},
                     {"steps", at::scalar_tensor(7, at::kLong)},
                     {"mask", at::ones({2, 2}, at::kByte)},
                     {"half", at::randn({4}).to(at::kDouble)},
                     {"empty", at::empty({0, 3})},
                     {"view", big.slice(0, 2, 3)}};
  auto info = WriteTensorFile(dir, "f.pt", dict);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->tensors_size(), 6);
  EXPECT_EQ(info->tensors(0).dtype(), "Float");
  EXPECT_EQ(info->tensors(1).dtype(), "Long");
  EXPECT_EQ(info->tensors(1).shape_size(), 0);
  EXPECT_EQ(info->size_bytes(), static_cast<int64_t>(fs::file_size(fs::path(dir) / "f.pt")));
  // The view was saved on its own, not with the 100-float storage behind it.
  EXPECT_LT(info->size_bytes(), 4000);
  auto back = ReadTensorFile(dir, *info);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), dict.size());
  for (size_t i = 0; i < dict.size(); ++i) {
    EXPECT_EQ((*back)[i].first, dict[i].first);
    EXPECT_TRUE(at::equal((*back)[i].second, dict[i].second)) << dict[i].first;
  }
  // Loaded tensors alias a copy-on-write mapping: writing them is safe and
  // leaves the file as it was (it still passes its checksum).
  (*back)[0].second.add_(1.0);
  auto again = ReadTensorFile(dir, *info);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(at::equal((*again)[0].second, dict[0].second));
  EXPECT_TRUE(at::equal((*back)[0].second, dict[0].second + 1.0));
  back->clear();
  EXPECT_TRUE(
      at::equal((*again)[5].second, dict[5].second));  // still mapped after the others are gone
  auto unchecked = ReadTensorFileUnchecked((fs::path(dir) / "f.pt").string());
  ASSERT_TRUE(unchecked.ok());
  EXPECT_EQ(unchecked->size(), dict.size());
}

// Issue 29: a checkpoint save on a full disk aborted the process (an
// uncaught LibTorch error when the zip writer, destroyed after the failed
// write, wrote its end of file once more). /dev/full fails every write with
// ENOSPC, no root needed: the error names the file and says so.
TEST(TensorFileTest, FullDiskIsAnErrorNamingTheFileNotAnAbort) {
  std::string dir = FreshDir("full");
  ASSERT_TRUE(fs::exists("/dev/full"));
  fs::create_symlink("/dev/full", fs::path(dir) / "f.pt");
  auto info = WriteTensorFile(dir, "f.pt", {{"w", at::randn({64, 64})}});
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kResourceExhausted) << info.status();
  const std::string msg(info.status().message());
  EXPECT_NE(msg.find("cannot write checkpoint file " + dir + "/f.pt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
}

TEST(TensorFileTest, RejectsDuplicateAndUndefinedTensors) {
  std::string dir = FreshDir("dups");
  auto dup = WriteTensorFile(dir, "d.pt", {{"a", at::ones(1)}, {"a", at::ones(1)}});
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("'a'"), std::string::npos);
  auto undef = WriteTensorFile(dir, "u.pt", {{"b", at::Tensor()}});
  EXPECT_EQ(undef.status().code(), absl::StatusCode::kInvalidArgument);
}

// One tensor file, then damaged in each test.
class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshDir("corrupt");
    TensorDict dict = {{"weight", at::full({4, 3}, 2.0f)}, {"bias", at::arange(3)}};
    auto info = WriteTensorFile(dir_, "layer_01-model_states.pt", dict);
    ASSERT_TRUE(info.ok()) << info.status();
    file_ = *info;
    path_ = (fs::path(dir_) / file_.path()).string();
  }
  std::string dir_, path_;
  FileInfo file_;
};

TEST_F(CorruptionTest, FlippedByteIsReportedWithFileName) {
  std::string data = Slurp(path_);
  // Flip a byte inside the tensor data (near the end of the zip is metadata;
  // anywhere must be caught by the checksum).
  for (size_t pos : {data.size() / 2, size_t{10}, data.size() - 3}) {
    std::string bad = data;
    bad[pos] ^= 0x01;
    Spit(path_, bad);
    auto r = ReadTensorFile(dir_, file_);
    ASSERT_FALSE(r.ok()) << "flip at " << pos << " was loaded silently";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find(path_), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("checksum"), std::string::npos) << r.status();
  }
}

TEST_F(CorruptionTest, TruncatedFileIsReportedWithFileName) {
  std::string data = Slurp(path_);
  Spit(path_, data.substr(0, data.size() - 100));
  auto r = ReadTensorFile(dir_, file_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find(path_), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status();
}

TEST_F(CorruptionTest, MissingFileIsReportedWithFileName) {
  fs::remove(path_);
  auto r = ReadTensorFile(dir_, file_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(path_), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("missing"), std::string::npos) << r.status();
}

TEST_F(CorruptionTest, ManifestShapeDisagreementIsReported) {
  FileInfo wrong = file_;
  wrong.mutable_tensors(0)->set_shape(0, 5);
  auto r = ReadTensorFile(dir_, wrong);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("[4, 3]"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("[5, 3]"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace pp
