// TensorBoard event files without TensorFlow: `tensorboard --logdir <dir>`
// shows the scalars and texts written here. The file holds TFRecord-framed
// (tfrecord.h) `Event` protos (tensorboard.proto), first a file_version event,
// like TensorFlow's and TensorBoard's own writers.
//
//   PP_ASSIGN_OR_RETURN(auto writer, TensorBoardWriter::Create("runs/x/tb"));
//   PP_RETURN_IF_ERROR(writer->AddScalar("train/loss", step, loss));
//   PP_RETURN_IF_ERROR(writer->AddText("sample", step, text));
//   PP_RETURN_IF_ERROR(writer->Close());
//
// How the run directory uses it: docs/observability.md.
#ifndef OBSERVABILITY_TENSORBOARD_WRITER_H_
#define OBSERVABILITY_TENSORBOARD_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace pp {

namespace tensorboard {
class Event;
}  // namespace tensorboard

struct TensorBoardWriterOptions {
  // Appended to the file name, e.g. ".rank0" when several processes write
  // into one directory in the same second.
  std::string filename_suffix;
  // Flush to the OS after every event, so a crashed run keeps everything it
  // logged and a live TensorBoard sees each point at once. Off: Flush/Close
  // (and the C library's buffer filling up) decide.
  bool flush_every_event = true;
};

// One event file. Thread-safe: calls are serialized by an internal mutex.
// Not copyable or movable (it owns the open file).
class TensorBoardWriter {
 public:
  // Creates `log_dir` (and parents) if missing and opens
  // `<log_dir>/events.out.tfevents.<unix seconds, 10 digits>.<hostname><suffix>`,
  // then writes the file_version event. AlreadyExists if that file exists
  // (never appends to or truncates another writer's file); InvalidArgument
  // for an empty `log_dir`; Internal if the directory or file cannot be made.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Create(
      absl::string_view log_dir, const TensorBoardWriterOptions& options = {});

  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  // Closes the file if Close was not called; an error then goes to the log.
  ~TensorBoardWriter();

  // One point of the scalar series `tag` (TensorBoard's Scalars dashboard;
  // stored as float32, like every TensorBoard scalar). `wall_time` in seconds
  // since the Unix epoch; the overload without it uses now.
  // InvalidArgument for an empty tag or a negative step; FailedPrecondition
  // after Close; Internal on a write error.
  absl::Status AddScalar(absl::string_view tag, int64_t step, double value, double wall_time);
  absl::Status AddScalar(absl::string_view tag, int64_t step, double value);

  // `text` at `step` under `tag` in TensorBoard's Text dashboard (the text
  // plugin's form: a DT_STRING scalar tensor; the dashboard renders Markdown).
  // Errors as AddScalar.
  absl::Status AddText(absl::string_view tag, int64_t step, absl::string_view text,
                       double wall_time);
  absl::Status AddText(absl::string_view tag, int64_t step, absl::string_view text);

  // Hands everything written so far to the OS. Internal on error.
  absl::Status Flush();
  // Flushes and closes the file; later Add* calls fail. Idempotent.
  absl::Status Close();

  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, std::FILE* file, bool flush_every_event);
  absl::Status Write(const tensorboard::Event& event);
  absl::Status FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const bool flush_every_event_;
  absl::Mutex mu_;
  std::FILE* file_ ABSL_GUARDED_BY(mu_);
};

// Seconds since the Unix epoch, the `wall_time` of TensorBoard events.
double NowWallTimeSeconds();

}  // namespace pp

#endif  // OBSERVABILITY_TENSORBOARD_WRITER_H_
