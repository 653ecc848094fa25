#include "driver/preflight.h"

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "models/gpt/gpt_config.pb.h"
#include "pipeline/schedule/formats/csv.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

namespace fs = std::filesystem;
using driver::ExperimentConfig;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

fs::path TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(base != nullptr ? base : "/tmp") / ("preflight_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void Write(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

ExperimentConfig SmallGpt() {
  ExperimentConfig c;
  c.mutable_model()->MutableExtension(gpt)->set_context_length(64);
  c.mutable_model()->MutableExtension(gpt)->set_width(128);
  c.mutable_model()->MutableExtension(gpt)->set_num_heads(4);
  c.mutable_model()->MutableExtension(gpt)->set_num_layers(4);
  c.mutable_model()->MutableExtension(gpt)->set_mlp_ratio(4);
  return c;
}

TEST(PreflightTest, EstimateCountsGptParametersAndAdamState) {
  ExperimentConfig c = SmallGpt();
  const MemoryEstimate e = EstimateMemory(c);
  // 4 blocks of 12 w^2 + 13 w, embeddings (260 + 64) x 128, final norm.
  const double want = 4 * (12.0 * 128 * 128 + 13 * 128) + (260 + 64) * 128 + 2 * 128;
  EXPECT_DOUBLE_EQ(e.parameters, want);
  EXPECT_DOUBLE_EQ(e.optimizer_bytes, 2 * e.parameter_bytes);  // adamw by default
  EXPECT_GT(e.activation_bytes, 0);
  EXPECT_LT(e.total_bytes(), 100e6);  // the shipped small GPT fits anywhere
  c.mutable_optimizer()->set_name("sgd");
  EXPECT_EQ(EstimateMemory(c).optimizer_bytes, 0);
}

TEST(PreflightTest, ActivationsGrowWithMicroBatchesOnlyForGPipeAndShrinkWithRecompute) {
  ExperimentConfig c = SmallGpt();
  c.mutable_parallelism()->set_num_microbatches(64);
  const double one_f_one_b = EstimateMemory(c).activation_bytes;
  c.mutable_parallelism()->set_schedule("gpipe");
  EXPECT_GT(EstimateMemory(c).activation_bytes, 10 * one_f_one_b);
  c.mutable_parallelism()->mutable_activation_checkpointing()->set_interval(1);
  c.mutable_model()->MutableExtension(gpt)->set_num_layers(32);
  const double recompute = EstimateMemory(c).activation_bytes;
  c.mutable_parallelism()->mutable_activation_checkpointing()->set_interval(0);
  EXPECT_LT(recompute, EstimateMemory(c).activation_bytes / 4);
}

// The micro-batches in flight come from the schedule's actions, not its
// name: looped_bfs runs every forward of a chunk before any backward, and
// GPipe written as a CSV file is GPipe (issue 29, finding 8: both were
// counted like 1F1B, and --microbatches=2048 --chunks=2
// --schedule=looped_bfs passed the check and ran out of memory).
TEST(PreflightTest, InFlightMicroBatchesComeFromTheScheduleItself) {
  ExperimentConfig c = SmallGpt();
  c.mutable_parallelism()->set_num_microbatches(64);
  const double one_f_one_b = EstimateMemory(c).activation_bytes;
  c.mutable_parallelism()->set_schedule("gpipe");
  const double gpipe = EstimateMemory(c).activation_bytes;
  EXPECT_GT(gpipe, 10 * one_f_one_b);
  // looped_bfs with 2 chunks: all 64 micro-batches of both chunks per rank,
  // each chunk half a stage: as much as GPipe.
  c.mutable_parallelism()->set_schedule("looped_bfs");
  c.mutable_parallelism()->set_chunks(2);
  EXPECT_NEAR(EstimateMemory(c).activation_bytes / gpipe, 1.0, 0.02);
  // interleaved 1F1B with the same chunks stays near 1F1B.
  c.mutable_parallelism()->set_schedule("interleaved_1f1b");
  EXPECT_LT(EstimateMemory(c).activation_bytes, 3 * one_f_one_b);

  // GPipe as a schedule file counts as GPipe.
  c = SmallGpt();
  c.mutable_parallelism()->set_num_microbatches(64);
  ScheduleOptions so;
  so.num_stages = 2;
  so.num_microbatches = 64;
  absl::StatusOr<Schedule> schedule = MakeSchedule("gpipe", so);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  const fs::path csv = TempDir("csv") / "gpipe.csv";
  Write(csv, ScheduleToCsv(*schedule));
  c.mutable_parallelism()->set_schedule("csv:" + csv.string());
  EXPECT_NEAR(EstimateMemory(c).activation_bytes / gpipe, 1.0, 1e-9);
}

// Recomputation counts only where checkpointable_types matches a layer; a
// regex matching none (or not compiling) recomputes nothing (issue 29, 8/13).
TEST(PreflightTest, CheckpointingCountsOnlyTheLayersItsTypesMatch) {
  ExperimentConfig c = SmallGpt();
  c.mutable_model()->MutableExtension(gpt)->set_num_layers(32);
  c.mutable_parallelism()->set_num_microbatches(16);
  c.mutable_parallelism()->set_schedule("gpipe");
  const double plain = EstimateMemory(c).activation_bytes;
  auto* ac = c.mutable_parallelism()->mutable_activation_checkpointing();
  ac->set_interval(1);
  const double any = EstimateMemory(c).activation_bytes;
  EXPECT_LT(any, plain / 4);
  ac->set_checkpointable_types("TransformerBlock");
  EXPECT_DOUBLE_EQ(EstimateMemory(c).activation_bytes, any);
  ac->set_checkpointable_types("NoSuchLayer");
  EXPECT_DOUBLE_EQ(EstimateMemory(c).activation_bytes, plain);
  ac->set_checkpointable_types("[");
  EXPECT_DOUBLE_EQ(EstimateMemory(c).activation_bytes, plain);
}

TEST(PreflightTest, RefusesWhatExceedsMemoryNamingTheEstimate) {
  ExperimentConfig c = SmallGpt();
  EXPECT_TRUE(CheckMemory(c, int64_t{1} << 30).ok());
  c.mutable_model()->MutableExtension(gpt)->set_num_layers(100000000);
  absl::Status s = CheckMemory(c, int64_t{16} << 30);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "the run needs an estimated ");
  EXPECT_HAS(s.message(), "parameters");
  EXPECT_HAS(s.message(), "but this machine has 16.0 GiB");
  // A million micro-batches: the schedule's action lists alone are too big.
  c = SmallGpt();
  c.mutable_parallelism()->set_num_microbatches(1000000000);
  s = CheckMemory(c, int64_t{16} << 30);
  EXPECT_HAS(s.message(), "num_microbatches=1000000000");
  EXPECT_HAS(s.message(), "schedule)");
}

TEST(PreflightTest, ReadsMemAvailable) {
  const int64_t bytes = AvailableMemoryBytes();
  EXPECT_GT(bytes, int64_t{1} << 20);  // Linux: /proc/meminfo has it
  EXPECT_GE(TotalMemoryBytes(), bytes);
}

TEST(PreflightTest, DataPathMustBeTextLongEnoughAndNeverAFifo) {
  const fs::path dir = TempDir("data");
  Write(dir / "text.txt", std::string(200, 'a'));
  EXPECT_TRUE(CheckDataPath((dir / "text.txt").string(), 64, 0.05).ok());
  EXPECT_TRUE(CheckDataPath(dir.string(), 64, 0.05).ok());

  absl::Status s = CheckDataPath((dir / "missing").string(), 64, 0.05);
  EXPECT_HAS(s.message(), "does not exist");

  const fs::path fifo = dir / "fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  s = CheckDataPath(fifo.string(), 64, 0.05);  // must not block
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "data.path '" + fifo.string() + "' is a FIFO");
  // Inside a folder a FIFO is skipped (as the loader does), not opened.
  EXPECT_TRUE(CheckDataPath(dir.string(), 64, 0.05).ok());

  const fs::path empty = TempDir("empty");
  s = CheckDataPath(empty.string(), 64, 0.05);
  EXPECT_HAS(s.message(), "data.path '" + empty.string() + "' is an empty folder");

  const fs::path binary = TempDir("binary");
  Write(binary / "a.bin", std::string("ab\0cd", 5) + std::string(500, 'x'));
  Write(binary / "empty.txt", "");
  s = CheckDataPath(binary.string(), 64, 0.05);
  EXPECT_HAS(s.message(), "data.path '" + binary.string() + "': none of its 2 file(s)");
  s = CheckDataPath((binary / "a.bin").string(), 64, 0.05);
  EXPECT_HAS(s.message(), "is non-empty text");

  const fs::path shorter = TempDir("short");
  Write(shorter / "s.txt", std::string(40, 'a'));
  s = CheckDataPath((shorter / "s.txt").string(), 64, 0.05);
  EXPECT_HAS(s.message(), "shorter than context_length (64) + 1");
  EXPECT_TRUE(CheckDataPath((shorter / "s.txt").string(), 16, 0.05).ok());

  s = CheckDataPath("/dev/null", 64, 0.05);
  EXPECT_HAS(s.message(), "data.path '/dev/null' is a character device");
}

// `ln -s . d/s1; ln -s . d/s2` walked 2^depth paths forever (issue 29, 3).
TEST(PreflightTest, DataFolderLinkedToItselfIsWalkedOnce) {
  const fs::path dir = TempDir("loop");
  Write(dir / "text.txt", std::string(200, 'a'));
  fs::create_directory_symlink(".", dir / "s1");
  fs::create_directory_symlink(".", dir / "s2");
  EXPECT_TRUE(CheckDataPath(dir.string(), 64, 0.05).ok());
  const fs::path empty_loop = TempDir("empty_loop");
  fs::create_directory_symlink(".", empty_loop / "s1");
  fs::create_directory_symlink(".", empty_loop / "s2");
  absl::Status s = CheckDataPath(empty_loop.string(), 64, 0.05);
  EXPECT_HAS(s.message(), "data.path '" + empty_loop.string() + "' is an empty folder");
}

// train_bert found no sentence only inside the workers (issue 29).
TEST(PreflightTest, WhitespaceOnlyDataIsRefused) {
  const fs::path dir = TempDir("blank");
  Write(dir / "a.txt", std::string(300, ' ') + "\n\n\t\n");
  Write(dir / "b.txt", "\n\n");
  absl::Status s = CheckDataPath(dir.string(), 64, 0.05);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(),
             "data.path '" + dir.string() + "': its 2 text file(s) hold only whitespace");
  Write(dir / "c.txt", std::string(100, ' ') + "x");
  EXPECT_TRUE(CheckDataPath(dir.string(), 16, 0.05).ok());
}

TEST(PreflightTest, OutputDirMustBeWritable) {
  const fs::path dir = TempDir("out");
  EXPECT_TRUE(CheckOutputDir((dir / "runs" / "nested").string()).ok());
  EXPECT_TRUE(fs::is_directory(dir / "runs" / "nested"));
  EXPECT_TRUE(fs::is_empty(dir / "runs" / "nested"));  // the probe is gone
  Write(dir / "file", "x");
  absl::Status s = CheckOutputDir((dir / "file" / "runs").string());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(),
             "output_dir '" + (dir / "file" / "runs").string() + "' cannot be created");
  if (geteuid() != 0) {  // root writes anywhere
    fs::create_directories(dir / "ro");
    fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    s = CheckOutputDir((dir / "ro").string());
    EXPECT_HAS(s.message(), "is not writable");
    fs::permissions(dir / "ro", fs::perms::owner_all);
  }
}

// An unwritable checkpoint dir was found at the first save, after launch.
TEST(PreflightTest, CheckpointDirOfARunThatSavesMustBeWritable) {
  const fs::path dir = TempDir("ckpt");
  ExperimentConfig c = SmallGpt();
  c.set_name("n");
  c.set_output_dir((dir / "runs").string());
  EXPECT_EQ(CheckpointDirOf(c), (dir / "runs" / "checkpoints" / "n").string());
  EXPECT_TRUE(CheckCheckpointDir(c).ok());  // saves nothing
  EXPECT_FALSE(fs::exists(dir / "runs" / "checkpoints"));
  c.mutable_checkpoint()->set_save_interval(2);
  EXPECT_TRUE(CheckCheckpointDir(c).ok());
  EXPECT_TRUE(fs::is_directory(dir / "runs" / "checkpoints" / "n"));
  Write(dir / "file", "x");
  c.mutable_checkpoint()->set_dir((dir / "file" / "ckpt").string());
  absl::Status s = CheckCheckpointDir(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(),
             "checkpoint.dir '" + (dir / "file" / "ckpt").string() + "' cannot be created");
  EXPECT_HAS(s.message(), "checkpoint.save_interval (2) saves there");
  if (geteuid() != 0) {
    fs::create_directories(dir / "ro");
    fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    c.mutable_checkpoint()->set_dir((dir / "ro").string());
    EXPECT_HAS(CheckCheckpointDir(c).message(), "is not writable");
    fs::permissions(dir / "ro", fs::perms::owner_all);
  }
}

TEST(PreflightTest, RepeatedFlagsAreRefusedNamingBoth) {
  EXPECT_TRUE(CheckNoRepeatedFlags({"train_gpt", "--set=steps=3,lr=1", "--pp=2", "x"}).ok());
  absl::Status s = CheckNoRepeatedFlags(
      {"train_gpt", "--set=steps=3", "--pp=2", "--set=lr_schedule.warmup_steps=1"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "flag --set is given 2 times");
  EXPECT_HAS(s.message(), "--set=steps=3,lr_schedule.warmup_steps=1");
  s = CheckNoRepeatedFlags({"train_gpt", "--lr=1", "-lr", "2"});
  EXPECT_HAS(s.message(), "flag --lr is given 2 times");
  // After "--" arguments are not flags.
  EXPECT_TRUE(CheckNoRepeatedFlags({"train_gpt", "--lr=1", "--", "--lr=2"}).ok());
}

TEST(PreflightTest, PreflightChecksTheWholeLaunch) {
  const fs::path dir = TempDir("whole");
  Write(dir / "text.txt", std::string(500, 'a'));
  ExperimentConfig c = SmallGpt();
  c.mutable_data()->set_path((dir / "text.txt").string());
  c.mutable_data()->set_eval_fraction(0.05);
  c.set_output_dir((dir / "runs").string());
  EXPECT_TRUE(Preflight(c, {"train_gpt"}).ok()) << Preflight(c, {"train_gpt"});
  EXPECT_HAS(Preflight(c, {"train_gpt", "--set=a=1", "--set=b=2"}).message(), "--set");
  c.mutable_data()->set_path(dir.string() + "/nothing");
  EXPECT_HAS(Preflight(c, {"train_gpt"}).message(), "does not exist");
}

}  // namespace
}  // namespace pp
