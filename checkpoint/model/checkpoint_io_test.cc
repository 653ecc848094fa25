#include "checkpoint/model/checkpoint_io.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "gtest/gtest.h"

namespace pp {
namespace {

namespace fs = std::filesystem;
using checkpoint::FileInfo;
using checkpoint::Manifest;

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(tmp ? tmp : "/tmp") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Spit(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

// Writes a one-writer checkpoint of `step` with `num_files` layer files.
std::string SaveSimple(const std::string& root, int64_t step, int num_files, int keep_last = 0,
                       float value = 1.0f) {
  std::string name = CheckpointName(step);
  auto tmp = PrepareTempCheckpointDir(root, name);
  EXPECT_TRUE(tmp.ok()) << tmp.status();
  std::vector<FileInfo> files;
  for (int i = 0; i < num_files; ++i) {
    TensorDict dict = {{"weight", at::full({4, 3}, value + i)}, {"bias", at::arange(3)}};
    auto info = WriteTensorFile(*tmp, "layer_" + std::to_string(i) + "-model_states.pt", dict);
    EXPECT_TRUE(info.ok()) << info.status();
    info->set_kind("model");
    info->set_layer(i);
    files.push_back(*info);
  }
  EXPECT_TRUE(WritePartialManifest(*tmp, 0, files).ok());
  Manifest header;
  header.mutable_trainer()->set_step(step);
  auto dir = CommitCheckpoint(root, name, header, keep_last);
  EXPECT_TRUE(dir.ok()) << dir.status();
  return dir.ok() ? *dir : "";
}

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

TEST(TensorFileTest, RejectsDuplicateAndUndefinedTensors) {
  std::string dir = FreshDir("dups");
  auto dup = WriteTensorFile(dir, "d.pt", {{"a", at::ones(1)}, {"a", at::ones(1)}});
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("'a'"), std::string::npos);
  auto undef = WriteTensorFile(dir, "u.pt", {{"b", at::Tensor()}});
  EXPECT_EQ(undef.status().code(), absl::StatusCode::kInvalidArgument);
}

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = FreshDir("corrupt");
    dir_ = SaveSimple(root_, 5, 3);
    auto m = ReadManifest(dir_);
    ASSERT_TRUE(m.ok()) << m.status();
    manifest_ = *m;
    file_ = manifest_.files(1);
    path_ = (fs::path(dir_) / file_.path()).string();
  }
  std::string root_, dir_, path_;
  Manifest manifest_;
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

TEST_F(CorruptionTest, NewerFormatAndForeignManifestsAreRefused) {
  std::string manifest_path = (fs::path(dir_) / kManifestFileName).string();
  std::string text = Slurp(manifest_path);
  std::string newer = text;
  newer.replace(newer.find("format_version: 1"), 17, "format_version: 99");
  Spit(manifest_path, newer);
  auto r = ReadManifest(dir_);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("99"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find(manifest_path), std::string::npos) << r.status();

  Spit(manifest_path, "this is { not a manifest");
  EXPECT_EQ(ReadManifest(dir_).status().code(), absl::StatusCode::kInvalidArgument);
  Spit(manifest_path, "format_version: 1");
  auto foreign = ReadManifest(dir_);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(foreign.status().message().find("magic"), std::string::npos);
}

TEST(CheckpointDirTest, NotACheckpointIsNamed) {
  std::string dir = FreshDir("plain");
  Spit(dir + "/notes.txt", "hello");
  auto r = ResolveCheckpointDir(dir);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("is not a checkpoint"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find(dir), std::string::npos);
  EXPECT_FALSE(ReadManifest(dir).ok());
  EXPECT_FALSE(ResolveCheckpointDir(dir + "/nope").ok());
}

TEST(CheckpointDirTest, CommitWritesManifestLatestAndPrunes) {
  std::string root = FreshDir("prune");
  for (int step : {10, 20, 30, 40}) SaveSimple(root, step, 2, /*keep_last=*/2);
  auto names = ListCheckpoints(root);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{CheckpointName(30), CheckpointName(40)}));
  auto latest = ResolveCheckpointDir(root);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(fs::path(*latest).filename(), CheckpointName(40));
  auto m = ReadManifest(*latest);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->format_version(), kCheckpointFormatVersion);
  EXPECT_EQ(m->trainer().step(), 40);
  ASSERT_EQ(m->files_size(), 2);
  for (const FileInfo& f : m->files()) EXPECT_TRUE(ReadTensorFile(*latest, f).ok());
  // No partial manifests or temporary directories are left behind.
  for (const auto& e : fs::directory_iterator(*latest)) {
    EXPECT_EQ(e.path().filename().string().find("part-"), std::string::npos);
  }
  for (const auto& e : fs::directory_iterator(root)) {
    EXPECT_NE(e.path().filename().string()[0], '.') << e.path();
  }
  // Re-saving an existing step replaces it.
  SaveSimple(root, 40, 1, 2, 5.0f);
  auto again = ReadManifest((fs::path(root) / CheckpointName(40)).string());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->files_size(), 1);
}

TEST(CheckpointDirTest, TwoWritersOfOneFileAreRefused) {
  std::string root = FreshDir("twowriters");
  auto tmp = PrepareTempCheckpointDir(root, CheckpointName(1));
  ASSERT_TRUE(tmp.ok());
  auto info = WriteTensorFile(*tmp, "layer_00-model_states.pt", {{"w", at::ones(2)}});
  ASSERT_TRUE(info.ok());
  FileInfo a = *info, b = *info;
  a.set_writer_rank(0);
  b.set_writer_rank(1);
  ASSERT_TRUE(WritePartialManifest(*tmp, 0, {a}).ok());
  ASSERT_TRUE(WritePartialManifest(*tmp, 1, {b}).ok());
  auto r = CommitCheckpoint(root, CheckpointName(1), Manifest(), 0);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("both rank 0 and rank 1"), std::string::npos) << r.status();
  EXPECT_FALSE(fs::exists(fs::path(root) / kLatestFileName));
}

// A writer killed in the middle of a save leaves the previous checkpoint
// loadable and `latest` pointing at it.
TEST(CheckpointDirTest, KilledWriterLeavesPreviousCheckpointLatest) {
  at::set_num_threads(1);
  std::string root = FreshDir("killed");
  std::string first = SaveSimple(root, 100, 3);
  std::string tmp = TempCheckpointDir(root, CheckpointName(200));
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: a save of many large files that would take a long while.
    auto dir = PrepareTempCheckpointDir(root, CheckpointName(200));
    if (!dir.ok()) _exit(3);
    std::vector<FileInfo> files;
    for (int i = 0; i < 100000; ++i) {
      auto info = WriteTensorFile(*dir, "layer_" + std::to_string(i) + "-model_states.pt",
                                  {{"w", at::full({256, 1024}, static_cast<float>(i))}});
      if (!info.ok()) _exit(4);
      files.push_back(*info);
    }
    (void)WritePartialManifest(*dir, 0, files);
    (void)CommitCheckpoint(root, CheckpointName(200), Manifest(), 0);
    _exit(0);
  }
  // Parent: wait until the child has written a few files, then kill it.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int seen = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    seen = 0;
    std::error_code ec;
    for (auto it = fs::directory_iterator(tmp, ec); !ec && it != fs::directory_iterator(); ++it)
      ++seen;
    if (seen >= 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(wstatus))
      << "the writer finished before it was killed (saw " << seen << " files)";
  ASSERT_GE(seen, 3);

  auto resolved = ResolveCheckpointDir(root);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, first);
  EXPECT_FALSE(fs::exists(fs::path(root) / CheckpointName(200)));
  auto m = ReadManifest(*resolved);
  ASSERT_TRUE(m.ok());
  for (const FileInfo& f : m->files()) EXPECT_TRUE(ReadTensorFile(*resolved, f).ok()) << f.path();
  auto names = ListCheckpoints(root);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{CheckpointName(100)});
  // The next save cleans the leftover up.
  SaveSimple(root, 300, 1);
  EXPECT_FALSE(fs::exists(tmp));
}

}  // namespace
}  // namespace pp
