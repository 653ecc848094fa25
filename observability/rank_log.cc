#include "observability/rank_log.h"

#include <cstdio>
#include <deque>
#include <filesystem>
#include <string>
#include <system_error>

#include <glog/logging.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace pp {
namespace {

class RankLogSink : public google::LogSink {
 public:
  void send(google::LogSeverity severity, const char* /*full_filename*/, const char* base_filename,
            int line, const google::LogMessageTime& time, const char* message,
            size_t message_len) override {
    const char kLetters[] = "IWEF";
    const char letter = severity >= 0 && severity < 4 ? kLetters[severity] : '?';
    // glog's own prefix (severity, date, time with microseconds) with the
    // rank's label in place of the thread id, then file:line.
    std::string body = absl::StrFormat("%02d%02d %02d:%02d:%02d.%06d", time.month() + 1, time.day(),
                                       time.hour(), time.min(), time.sec(), time.usec());
    absl::MutexLock lock(&mu_);
    std::string text =
        absl::StrCat(std::string(1, letter), body, " ", label_, label_.empty() ? "" : " ",
                     base_filename, ":", line, "] ", absl::string_view(message, message_len), "\n");
    if (file_ == nullptr) {
      held_.push_back(std::move(text));
      while (held_.size() > max_held_) {
        held_.pop_front();
        ++dropped_;
      }
      return;
    }
    std::fwrite(text.data(), 1, text.size(), file_);
    // To the OS at once: a killed or hung rank's file ends with its last message.
    std::fflush(file_);
  }

  void set_max_held(size_t n) {
    absl::MutexLock lock(&mu_);
    max_held_ = n;
  }

  absl::Status Open(const std::string& path, const std::string& label) {
    absl::MutexLock lock(&mu_);
    if (file_ != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("OpenRankLog(", path, "): ", path_, " is already open"));
    }
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    std::FILE* file = std::fopen(path.c_str(), "w");
    if (file == nullptr) {
      return absl::InternalError(absl::StrCat("cannot create the rank log ", path,
                                              ec ? absl::StrCat(": ", ec.message()) : ""));
    }
    file_ = file;
    path_ = path;
    if (dropped_ > 0) {
      const std::string note =
          absl::StrCat("(", dropped_, " earlier messages were dropped before the log opened)\n");
      std::fwrite(note.data(), 1, note.size(), file_);
    }
    // Lines held before the label was known get it now.
    for (const std::string& text : held_) {
      // text = <letter><date time> <rest>: insert the label after the time.
      const size_t space = text.find(' ', text.find(' ') + 1);
      const std::string labelled =
          label.empty() || space == std::string::npos
              ? text
              : absl::StrCat(text.substr(0, space + 1), label, " ", text.substr(space + 1));
      std::fwrite(labelled.data(), 1, labelled.size(), file_);
    }
    held_.clear();
    dropped_ = 0;
    label_ = label;
    std::fflush(file_);
    return absl::OkStatus();
  }

  void Close() {
    absl::MutexLock lock(&mu_);
    if (file_ != nullptr) std::fclose(file_);
    file_ = nullptr;
    path_.clear();
    label_.clear();
    held_.clear();
    dropped_ = 0;
  }

  std::string path() {
    absl::MutexLock lock(&mu_);
    return path_;
  }

 private:
  absl::Mutex mu_;
  std::FILE* file_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string path_ ABSL_GUARDED_BY(mu_);
  std::string label_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> held_ ABSL_GUARDED_BY(mu_);
  size_t max_held_ ABSL_GUARDED_BY(mu_) = 10000;
  size_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::Mutex registry_mu(absl::kConstInit);
RankLogSink* sink ABSL_GUARDED_BY(registry_mu) = nullptr;  // installed, never freed

}  // namespace

void StartRankLogging(const RankLoggingOptions& options) {
  absl::MutexLock lock(&registry_mu);
  FLAGS_logtostderr = false;
  FLAGS_alsologtostderr = false;
  FLAGS_stderrthreshold = options.stderr_threshold;
  // No glog-named files in /tmp: the rank's file is ours.
  for (int severity = 0; severity < google::NUM_SEVERITIES; ++severity) {
    google::SetLogDestination(severity, "");
  }
  if (sink == nullptr) {
    sink = new RankLogSink();
    google::AddLogSink(sink);
  }
  sink->set_max_held(options.max_held);
}

absl::Status OpenRankLog(const std::string& path, const std::string& label) {
  absl::MutexLock lock(&registry_mu);
  if (sink == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("OpenRankLog(", path, ") before StartRankLogging()"));
  }
  return sink->Open(path, label);
}

void StopRankLogging() {
  absl::MutexLock lock(&registry_mu);
  if (sink == nullptr) return;
  google::RemoveLogSink(sink);
  sink->Close();
  delete sink;
  sink = nullptr;
  FLAGS_logtostderr = true;
}

void LogErrorToRankLogOnly(const std::string& message, const char* file, int line) {
  absl::MutexLock lock(&registry_mu);
  if (sink == nullptr) return;
  const int threshold = FLAGS_stderrthreshold;
  FLAGS_stderrthreshold = google::NUM_SEVERITIES;
  google::LogMessage(file, line, google::GLOG_ERROR).stream() << message;
  FLAGS_stderrthreshold = threshold;
}

std::string RankLogPath() {
  absl::MutexLock lock(&registry_mu);
  return sink == nullptr ? "" : sink->path();
}

void SetLogVerbosity(int level) { FLAGS_v = level; }

}  // namespace pp
