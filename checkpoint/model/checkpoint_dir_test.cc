#include "checkpoint/model/checkpoint_dir.h"

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

#include "checkpoint/model/tensor_file.h"
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

TEST(ManifestTest, NewerFormatAndForeignManifestsAreRefused) {
  std::string dir = SaveSimple(FreshDir("manifest"), 5, 1);
  std::string manifest_path = (fs::path(dir) / kManifestFileName).string();
  std::string text = Slurp(manifest_path);
  std::string newer = text;
  newer.replace(newer.find("format_version: 1"), 17, "format_version: 99");
  Spit(manifest_path, newer);
  auto r = ReadManifest(dir);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("99"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find(manifest_path), std::string::npos) << r.status();

  Spit(manifest_path, "this is { not a manifest");
  EXPECT_EQ(ReadManifest(dir).status().code(), absl::StatusCode::kInvalidArgument);
  Spit(manifest_path, "format_version: 1");
  auto foreign = ReadManifest(dir);
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
