#include "observability/tensorboard_writer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "observability/tensorboard.pb.h"
#include "observability/tfrecord.h"

namespace pp {
namespace {

// TensorBoard recognizes an event file by this version in its first record.
constexpr char kFileVersion[] = "brain.Event:2";
constexpr char kTextPluginName[] = "text";

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

absl::Status CheckPoint(absl::string_view tag, int64_t step) {
  if (tag.empty()) return absl::InvalidArgumentError("TensorBoard tag must not be empty");
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TensorBoard step for tag \"", tag, "\" is ", step, "; must be >= 0"));
  }
  return absl::OkStatus();
}

}  // namespace

double NowWallTimeSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Create(
    absl::string_view log_dir, const TensorBoardWriterOptions& options) {
  if (log_dir.empty()) {
    return absl::InvalidArgumentError("TensorBoard log directory must not be empty");
  }
  std::error_code error;
  std::filesystem::create_directories(std::string(log_dir), error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create TensorBoard log directory \"", log_dir,
                                            "\": ", error.message()));
  }
  const double now = NowWallTimeSeconds();
  const std::string path =
      absl::StrFormat("%s/events.out.tfevents.%010d.%s%s", log_dir, static_cast<int64_t>(now),
                      HostName(), options.filename_suffix);
  // "x": fail rather than clobber an event file another writer owns.
  std::FILE* file = std::fopen(path.c_str(), "wbx");
  if (file == nullptr) {
    const int err = errno;
    const std::string why = std::strerror(err);
    if (err == EEXIST) {
      return absl::AlreadyExistsError(absl::StrCat(
          "TensorBoard event file \"", path,
          "\" already exists (another writer in this second?); use a distinct filename_suffix"));
    }
    return absl::InternalError(
        absl::StrCat("cannot create TensorBoard event file \"", path, "\": ", why));
  }
  std::unique_ptr<TensorBoardWriter> writer(
      new TensorBoardWriter(path, file, options.flush_every_event));
  tensorboard::Event version;
  version.set_wall_time(now);
  version.set_file_version(kFileVersion);
  PP_RETURN_IF_ERROR(writer->Write(version));
  PP_RETURN_IF_ERROR(writer->Flush());
  return writer;
}

TensorBoardWriter::TensorBoardWriter(std::string path, std::FILE* file, bool flush_every_event)
    : path_(std::move(path)), flush_every_event_(flush_every_event), file_(file) {}

TensorBoardWriter::~TensorBoardWriter() {
  absl::MutexLock lock(&mu_);
  absl::Status status = CloseLocked();
  LOG_IF(ERROR, !status.ok()) << status;
}

absl::Status TensorBoardWriter::AddScalar(absl::string_view tag, int64_t step, double value,
                                          double wall_time) {
  PP_RETURN_IF_ERROR(CheckPoint(tag, step));
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(static_cast<float>(value));
  return Write(event);
}

absl::Status TensorBoardWriter::AddScalar(absl::string_view tag, int64_t step, double value) {
  return AddScalar(tag, step, value, NowWallTimeSeconds());
}

absl::Status TensorBoardWriter::AddText(absl::string_view tag, int64_t step, absl::string_view text,
                                        double wall_time) {
  PP_RETURN_IF_ERROR(CheckPoint(tag, step));
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  // What tensorboard.plugins.text.summary_v2.text_pb writes: plugin "text"
  // with TextPluginData version 0 as content, and a rank-0 DT_STRING tensor
  // (an empty but present shape).
  tensorboard::SummaryMetadata::PluginData* plugin = v->mutable_metadata()->mutable_plugin_data();
  plugin->set_plugin_name(kTextPluginName);
  plugin->set_content(tensorboard::TextPluginData().SerializeAsString());
  tensorboard::TensorProto* tensor = v->mutable_tensor();
  tensor->set_dtype(tensorboard::DT_STRING);
  tensor->mutable_tensor_shape();
  tensor->add_string_val(std::string(text));
  return Write(event);
}

absl::Status TensorBoardWriter::AddText(absl::string_view tag, int64_t step,
                                        absl::string_view text) {
  return AddText(tag, step, text, NowWallTimeSeconds());
}

absl::Status TensorBoardWriter::Write(const tensorboard::Event& event) {
  const std::string record = FrameRecord(event.SerializeAsString());
  absl::MutexLock lock(&mu_);
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("TensorBoard event file \"", path_, "\" is already closed"));
  }
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    return absl::InternalError(absl::StrCat("cannot write TensorBoard event file \"", path_,
                                            "\": ", std::strerror(errno)));
  }
  if (flush_every_event_) return FlushLocked();
  return absl::OkStatus();
}

absl::Status TensorBoardWriter::Flush() {
  absl::MutexLock lock(&mu_);
  return FlushLocked();
}

absl::Status TensorBoardWriter::FlushLocked() {
  if (file_ == nullptr) return absl::OkStatus();
  if (std::fflush(file_) != 0) {
    return absl::InternalError(absl::StrCat("cannot flush TensorBoard event file \"", path_,
                                            "\": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status TensorBoardWriter::Close() {
  absl::MutexLock lock(&mu_);
  return CloseLocked();
}

absl::Status TensorBoardWriter::CloseLocked() {
  if (file_ == nullptr) return absl::OkStatus();
  const int result = std::fclose(file_);
  file_ = nullptr;
  if (result != 0) {
    return absl::InternalError(absl::StrCat("cannot close TensorBoard event file \"", path_,
                                            "\": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace pp
