#include "observability/tensorboard_writer.h"

#include <unistd.h>

#include <filesystem>
#include <regex>
#include <string>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "observability/tensorboard.pb.h"
#include "observability/tfrecord.h"

namespace pp {
namespace {

namespace fs = std::filesystem;

std::string FreshDir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/" + name;
  fs::remove_all(dir);
  return dir;
}

std::vector<tensorboard::Event> ReadEvents(const std::string& path) {
  auto records = ReadRecords(path);
  EXPECT_TRUE(records.ok()) << records.status();
  std::vector<tensorboard::Event> events;
  if (!records.ok()) return events;
  for (const std::string& r : *records) {
    tensorboard::Event e;
    EXPECT_TRUE(e.ParseFromString(r));
    events.push_back(e);
  }
  return events;
}

TEST(TensorBoardWriterTest, NamesTheFileLikeTensorBoardAndStartsWithTheVersion) {
  const std::string dir = FreshDir("name") + "/nested/tb";
  const double before = NowWallTimeSeconds();
  TensorBoardWriterOptions options;
  options.filename_suffix = ".rank0";
  auto writer = TensorBoardWriter::Create(dir, options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  const std::string name = fs::path((*writer)->path()).filename().string();
  std::smatch match;
  ASSERT_TRUE(std::regex_match(name, match, std::regex(R"(events\.out\.tfevents\.(\d{10})\.(.+))")))
      << name;
  EXPECT_EQ(match[2].str(), std::string(host) + ".rank0");
  EXPECT_NEAR(std::stod(match[1].str()), before, 2.0);
  EXPECT_EQ(fs::path((*writer)->path()).parent_path(), fs::path(dir));

  ASSERT_TRUE((*writer)->Close().ok());
  std::vector<tensorboard::Event> events = ReadEvents((*writer)->path());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_NEAR(events[0].wall_time(), before, 2.0);
}

// The scalar and text records are byte for byte what TensorBoard 2.21's
// Python API writes for the same values (Event(wall_time=1.5, step=3,
// summary=Summary(value=[Value(tag="loss", simple_value=0.25)])) and
// Event(wall_time=1.5, step=7, summary=text_pb("sample", "hi")), framed by its
// RecordWriter), so any reader of TensorBoard's files reads ours.
TEST(TensorBoardWriterTest, RecordsMatchTensorBoardsOwnBytes) {
  auto writer = TensorBoardWriter::Create(FreshDir("bytes"));
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->AddScalar("loss", 3, 0.25, 1.5).ok());
  ASSERT_TRUE((*writer)->AddText("sample", 7, "hi", 1.5).ok());
  ASSERT_TRUE((*writer)->Close().ok());
  auto records = ReadRecords((*writer)->path());
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ(absl::BytesToHexString(FrameRecord((*records)[1])),
            "1a00000000000000129bd82d09000000000000f83f10032a0d0a0b0a046c6f7373150000803ed054b2"
            "55");
  EXPECT_EQ(absl::BytesToHexString(FrameRecord((*records)[2])),
            "2b00000000000000861bc34b09000000000000f83f10072a1e0a1c0a0673616d706c6542080807120042"
            "0268694a080a060a0474657874314f31c8");
}

TEST(TensorBoardWriterTest, ReadsBackEveryScalarAndText) {
  auto writer = TensorBoardWriter::Create(FreshDir("readback"));
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int step = 0; step < 50; ++step) {
    ASSERT_TRUE((*writer)->AddScalar("train/loss", step, 5.0 / (step + 1), 100.0 + step).ok());
    if (step % 10 == 0) {
      ASSERT_TRUE((*writer)->AddScalar("train/lr", step, 1e-3 * step).ok());
    }
  }
  const std::string text = "line one\n**bold** ünïcödé\n";
  ASSERT_TRUE((*writer)->AddText("sample", 49, text).ok());
  ASSERT_TRUE((*writer)->Close().ok());

  std::vector<tensorboard::Event> events = ReadEvents((*writer)->path());
  ASSERT_EQ(events.size(), 1u + 50 + 5 + 1);
  int loss = 0, lr = 0, texts = 0;
  for (size_t i = 1; i < events.size(); ++i) {
    const tensorboard::Event& e = events[i];
    ASSERT_TRUE(e.has_summary());
    ASSERT_EQ(e.summary().value_size(), 1);
    const tensorboard::Summary::Value& v = e.summary().value(0);
    if (v.tag() == "train/loss") {
      EXPECT_EQ(e.step(), loss);
      EXPECT_EQ(v.simple_value(), static_cast<float>(5.0 / (loss + 1)));
      EXPECT_DOUBLE_EQ(e.wall_time(), 100.0 + loss);
      ++loss;
    } else if (v.tag() == "train/lr") {
      EXPECT_EQ(e.step(), 10 * lr);
      EXPECT_EQ(v.simple_value(), static_cast<float>(1e-3 * 10 * lr));
      ++lr;
    } else {
      EXPECT_EQ(v.tag(), "sample");
      EXPECT_EQ(e.step(), 49);
      EXPECT_EQ(v.metadata().plugin_data().plugin_name(), "text");
      EXPECT_EQ(v.tensor().dtype(), tensorboard::DT_STRING);
      EXPECT_EQ(v.tensor().tensor_shape().dim_size(), 0);
      ASSERT_EQ(v.tensor().string_val_size(), 1);
      EXPECT_EQ(v.tensor().string_val(0), text);
      ++texts;
    }
  }
  EXPECT_EQ(loss, 50);
  EXPECT_EQ(lr, 5);
  EXPECT_EQ(texts, 1);
}

TEST(TensorBoardWriterTest, EachEventReachesTheFileBeforeClose) {
  auto writer = TensorBoardWriter::Create(FreshDir("live"));
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->AddScalar("x", 1, 2.0).ok());
  // A TensorBoard watching the run, or a run that crashes now, sees the point.
  EXPECT_EQ(ReadEvents((*writer)->path()).size(), 2u);
}

TEST(TensorBoardWriterTest, RejectsBadPointsAndUseAfterClose) {
  auto writer = TensorBoardWriter::Create(FreshDir("errors"));
  ASSERT_TRUE(writer.ok()) << writer.status();
  absl::Status empty_tag = (*writer)->AddScalar("", 0, 1.0);
  EXPECT_EQ(empty_tag.code(), absl::StatusCode::kInvalidArgument);
  absl::Status negative = (*writer)->AddText("t", -2, "x");
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(negative.message().find("-2"), std::string::npos) << negative;
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_TRUE((*writer)->Close().ok());
  absl::Status closed = (*writer)->AddScalar("x", 0, 1.0);
  EXPECT_EQ(closed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(closed.message().find((*writer)->path()), std::string::npos) << closed;
  // Nothing invalid reached the file.
  EXPECT_EQ(ReadEvents((*writer)->path()).size(), 1u);
}

TEST(TensorBoardWriterTest, NeverOverwritesAnotherWritersFile) {
  const std::string dir = FreshDir("collide");
  // Two writers with the same suffix in the same second want the same name;
  // retry if the clock ticked over between them.
  bool collided = false;
  for (int attempt = 0; attempt < 3 && !collided; ++attempt) {
    TensorBoardWriterOptions options;
    options.filename_suffix = ".try" + std::to_string(attempt);
    auto first = TensorBoardWriter::Create(dir, options);
    ASSERT_TRUE(first.ok()) << first.status();
    auto second = TensorBoardWriter::Create(dir, options);
    if (!second.ok()) {
      EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
      EXPECT_NE(second.status().message().find((*first)->path()), std::string::npos);
      collided = true;
    }
  }
  EXPECT_TRUE(collided);
}

TEST(TensorBoardWriterTest, ReportsADirectoryItCannotCreate) {
  auto empty = TensorBoardWriter::Create("");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = TensorBoardWriter::Create("/proc/pipe-no-such-dir/tb");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(bad.status().message().find("/proc/pipe-no-such-dir/tb"), std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace pp
