#include "checkpoint/model/checkpoint_dir.h"
#include "checkpoint/model/test_files.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "checkpoint/model/tensor_file.h"
#include "gtest/gtest.h"

namespace pp {
namespace {

namespace fs = std::filesystem;
using checkpoint::FileInfo;
using checkpoint::Manifest;
using checkpoint::test_files::FreshDir;
using checkpoint::test_files::Slurp;
using checkpoint::test_files::Spit;

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

// Issue 29: changing `step: 8` to `step: 9` in a manifest made resume=auto
// continue at a step never trained. The manifest's last line is a CRC32C of
// the text above it: an edited manifest is refused naming the file, and
// resume=auto does not pick it.
TEST(ManifestTest, AnEditedManifestIsRefusedNamingTheFile) {
  const std::string root = FreshDir("edited");
  std::string dir = SaveSimple(root, 8, 1);
  std::string manifest_path = (fs::path(dir) / kManifestFileName).string();
  std::string text = Slurp(manifest_path);
  ASSERT_NE(text.find("step: 8"), std::string::npos) << text;
  ASSERT_TRUE(ReadManifest(dir).ok());
  text.replace(text.find("step: 8"), 7, "step: 9");
  Spit(manifest_path, text);
  auto r = ReadManifest(dir);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find(manifest_path), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("edited"), std::string::npos) << r.status();
  EXPECT_EQ(VerifyCheckpointFiles(dir).code(), absl::StatusCode::kDataLoss);
  auto choice = ChooseResumeCheckpoint(root);
  EXPECT_EQ(choice.status().code(), absl::StatusCode::kFailedPrecondition) << choice.status();
  EXPECT_NE(choice.status().message().find(manifest_path), std::string::npos) << choice.status();
}

// Issue 29: two runs sharing a checkpoint dir collided in one temporary
// folder (one emptied the other's). Each writer prepares its own; committing
// one leaves the other's alone.
TEST(CheckpointDirTest, TemporaryFoldersAreUniquePerWriter) {
  const std::string root = FreshDir("two_writers");
  const std::string name = CheckpointName(4);
  int hold_a = -1, hold_b = -1;
  auto a = PrepareTempCheckpointDir(root, name, "aaaa", &hold_a);
  auto b = PrepareTempCheckpointDir(root, name, "bbbb", &hold_b);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_GE(hold_a, 0);
  ASSERT_GE(hold_b, 0);
  EXPECT_NE(*a, *b);
  for (const std::string* tmp : {&*a, &*b}) {
    auto info = WriteTensorFile(*tmp, "layer_0-model_states.pt", {{"w", at::ones({2})}});
    ASSERT_TRUE(info.ok()) << info.status();
    info->set_kind("model");
    ASSERT_TRUE(WritePartialManifest(*tmp, 0, {*info}).ok());
  }
  EXPECT_TRUE(fs::exists(fs::path(*a) / "layer_0-model_states.pt"));
  Manifest header;
  header.mutable_trainer()->set_step(4);
  auto dir = CommitCheckpoint(root, name, header, 0, "aaaa");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(VerifyCheckpointFiles(*dir).ok());
  EXPECT_FALSE(fs::exists(*a));
  // Writer b's save is in progress (held): the commit's pruning leaves it.
  EXPECT_TRUE(fs::exists(fs::path(*b) / "layer_0-model_states.pt"));
  ::close(hold_a);
  ::close(hold_b);
  // Released (its writer gone), it is a leftover the next prune removes.
  ASSERT_TRUE(PruneCheckpoints(root, 0).ok());
  EXPECT_FALSE(fs::exists(*b));
}

// Issue 29: a resume fell back to another run's checkpoint with only a
// warning. The manifest names its owner; another owner's checkpoint is
// refused unless allowed explicitly; unknown owners (older checkpoints, a
// caller that names none) are not checked.
TEST(ResumeChoiceTest, ACheckpointOfAnotherRunIsRefusedUnlessAllowed) {
  Manifest manifest;
  manifest.set_owner("runs/b");
  EXPECT_TRUE(CheckCheckpointOwner("/c/step_2", manifest, "runs/b", false).ok());
  absl::Status refused = CheckCheckpointOwner("/c/step_2", manifest, "runs/a", false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(),
            "checkpoint /c/step_2 was written by run 'runs/b', not by this run ('runs/a'): two "
            "runs share this checkpoint dir. Refusing to continue from another run's checkpoint; "
            "give each run its own checkpoint dir, or allow it explicitly "
            "(CheckpointPolicy.resume_other_runs; train_gpt and train_bert: "
            "--set=checkpoint.resume_other_runs=true)");
  EXPECT_TRUE(CheckCheckpointOwner("/c/step_2", manifest, "runs/a", true).ok());
  EXPECT_TRUE(CheckCheckpointOwner("/c/step_2", manifest, "", false).ok());
  EXPECT_TRUE(CheckCheckpointOwner("/c/step_2", Manifest(), "runs/a", false).ok());
  // The owner survives the commit.
  const std::string root = FreshDir("owner");
  auto tmp = PrepareTempCheckpointDir(root, CheckpointName(2));
  ASSERT_TRUE(tmp.ok());
  ASSERT_TRUE(WritePartialManifest(*tmp, 0, {}).ok());
  auto dir = CommitCheckpoint(root, CheckpointName(2), manifest, 0);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(ReadManifest(*dir)->owner(), "runs/b");
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
  // Re-saving an existing step puts the new one in place and keeps the old
  // one under another name: nothing a run did not write is deleted.
  SaveSimple(root, 40, 1, 2, 5.0f);
  auto again = ReadManifest((fs::path(root) / CheckpointName(40)).string());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->files_size(), 1);
  const std::string kept = (fs::path(root) / (CheckpointName(40) + ".replaced-1")).string();
  auto old = ReadManifest(kept);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->files_size(), 2);
  EXPECT_TRUE(VerifyCheckpointFiles(kept).ok());
  SaveSimple(root, 40, 3, 2);
  EXPECT_TRUE(fs::exists(kept));
  EXPECT_TRUE(fs::exists(fs::path(root) / (CheckpointName(40) + ".replaced-2")));
  // Pruning leaves the kept ones alone.
  SaveSimple(root, 50, 1, 1);
  EXPECT_TRUE(fs::exists(kept));
}

TEST(CheckpointDirTest, VerifyNamesTruncatedAndCorruptedFiles) {
  std::string root = FreshDir("verify");
  std::string dir = SaveSimple(root, 7, 2);
  EXPECT_TRUE(VerifyCheckpointFiles(dir).ok());
  const std::string file = (fs::path(dir) / "layer_1-model_states.pt").string();
  const std::string bytes = Slurp(file);
  std::string flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x40;
  Spit(file, flipped);
  absl::Status s = VerifyCheckpointFiles(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("layer_1-model_states.pt has CRC32C"), std::string::npos) << s;
  Spit(file, bytes.substr(0, 10));
  s = VerifyCheckpointFiles(dir);
  EXPECT_NE(s.message().find("has 10 bytes, the manifest says"), std::string::npos) << s;
  fs::remove(file);
  s = VerifyCheckpointFiles(dir);
  EXPECT_NE(s.message().find("layer_1-model_states.pt"), std::string::npos) << s;
}

// Issue #14: a `latest` that is missing, empty, garbage, names a missing or
// `..` directory, or names a checkpoint whose manifest is gone used to make
// resume=auto start over (and then overwrite the valid checkpoints). Now the
// newest checkpoint whose files verify is chosen, with a warning saying why.
TEST(ResumeChoiceTest, UnusableLatestFallsBackToTheNewestVerifiedCheckpoint) {
  struct Case {
    std::string name;
    std::function<void(const std::string& root)> damage;
    std::string why;  // in the warning
  };
  const std::vector<Case> cases = {
      {"missing", [](const std::string& r) { fs::remove(fs::path(r) / kLatestFileName); },
       "is missing"},
      {"empty", [](const std::string& r) { Spit((fs::path(r) / kLatestFileName).string(), ""); },
       "found ''"},
      {"garbage",
       [](const std::string& r) { Spit((fs::path(r) / kLatestFileName).string(), "\x01zz"); },
       "should hold a checkpoint directory name"},
      {"dotdot", [](const std::string& r) { Spit((fs::path(r) / kLatestFileName).string(), ".."); },
       "found '..'"},
      {"absent",
       [](const std::string& r) {
         Spit((fs::path(r) / kLatestFileName).string(), CheckpointName(99));
       },
       "names step_00000099, which is unusable"},
      {"no_manifest",
       [](const std::string& r) {
         fs::remove(fs::path(r) / CheckpointName(30) / kManifestFileName);
       },
       "names step_00000030, which is unusable"},
  };
  for (const Case& c : cases) {
    const std::string root = FreshDir("resume_" + c.name);
    SaveSimple(root, 10, 1);
    const std::string second = SaveSimple(root, 20, 2);
    SaveSimple(root, 30, 1);
    // The newest complete checkpoint is corrupted, so it must be skipped;
    // with its manifest gone it is not complete at all.
    const std::string corrupt = (fs::path(root) / CheckpointName(30) / "layer_0-model_states.pt");
    Spit(corrupt, Slurp(corrupt).substr(0, 20));
    c.damage(root);
    auto choice = ChooseResumeCheckpoint(root);
    ASSERT_TRUE(choice.ok()) << c.name << ": " << choice.status();
    EXPECT_EQ(choice->dir, second) << c.name;
    EXPECT_NE(choice->warning.find(c.why), std::string::npos) << c.name << ": " << choice->warning;
    EXPECT_NE(choice->warning.find("resuming from " + second), std::string::npos)
        << choice->warning;
  }
}

// Issue #42: a bit flipped in a file of the checkpoint `latest` names (its
// manifest intact) used to be trusted by resume=auto; the load then failed and
// the older checkpoint that verifies was never tried, so every restart failed.
TEST(ResumeChoiceTest, BitFlippedLatestFallsBackToTheOlderVerifiedCheckpoint) {
  const std::string root = FreshDir("resume_bitflip");
  const std::string older = SaveSimple(root, 10, 2);
  const std::string newest = SaveSimple(root, 20, 2);
  const std::string file = (fs::path(newest) / "layer_1-model_states.pt").string();
  std::string bytes = Slurp(file);
  bytes[bytes.size() / 2] ^= 0x10;  // same size: only the CRC32C can tell
  Spit(file, bytes);
  auto choice = ChooseResumeCheckpoint(root);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->dir, older);
  EXPECT_NE(choice->warning.find("names step_00000020, which is unusable"), std::string::npos)
      << choice->warning;
  EXPECT_NE(choice->warning.find("layer_1-model_states.pt has CRC32C"), std::string::npos)
      << choice->warning;
}

TEST(ResumeChoiceTest, UsableLatestEmptyRootAndNothingUsable) {
  // A good `latest` is taken as it is, without a warning.
  const std::string root = FreshDir("resume_good");
  SaveSimple(root, 10, 1);
  const std::string newest = SaveSimple(root, 20, 1);
  auto choice = ChooseResumeCheckpoint(root);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->dir, newest);
  EXPECT_EQ(choice->warning, "");
  // Nothing there (or no root at all): start fresh.
  for (const std::string& empty : {FreshDir("resume_empty"), FreshDir("resume_none") + "/no"}) {
    choice = ChooseResumeCheckpoint(empty);
    ASSERT_TRUE(choice.ok()) << choice.status();
    EXPECT_EQ(choice->dir, "");
    EXPECT_TRUE(CheckRootHoldsNoCheckpoints(empty).ok());
  }
  // Checkpoints that are all unusable: an error naming each, never a fresh start.
  const std::string bad = FreshDir("resume_bad");
  const std::string only = SaveSimple(bad, 10, 1);
  Spit((fs::path(only) / "layer_0-model_states.pt").string(), "x");
  Spit((fs::path(bad) / kLatestFileName).string(), "garbage");
  choice = ChooseResumeCheckpoint(bad);
  EXPECT_EQ(choice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(choice.status().message().find("holds no usable checkpoint"), std::string::npos)
      << choice.status();
  EXPECT_NE(choice.status().message().find("step_00000010: checkpoint file"), std::string::npos)
      << choice.status();
  // A `latest` alone (its checkpoint gone) is no fresh start either.
  const std::string orphan = FreshDir("resume_orphan");
  Spit((fs::path(orphan) / kLatestFileName).string(), CheckpointName(5));
  EXPECT_EQ(ChooseResumeCheckpoint(orphan).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ResumeChoiceTest, FreshRunRefusesARootHoldingCheckpoints) {
  const std::string root = FreshDir("fresh_refused");
  SaveSimple(root, 10, 1);
  SaveSimple(root, 20, 1);
  absl::Status s = CheckRootHoldsNoCheckpoints(root);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("already holds 2 checkpoint(s), the newest step_00000020"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("resume=auto"), std::string::npos) << s;
  // An incomplete step directory counts too (it is someone's).
  const std::string partial = FreshDir("fresh_partial");
  fs::create_directories(fs::path(partial) / CheckpointName(3));
  EXPECT_FALSE(CheckRootHoldsNoCheckpoints(partial).ok());
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
