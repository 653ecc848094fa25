// Per-rank log files through glog: every message a rank logs (LOG, VLOG, any
// thread) goes to its own file, each line prefixed with the rank's label:
//
//   I1123 22:51:03.123456 rank=1 stage=1 data=0 stage_executor.cc:340] step 3 start 1RECV_F2
//
// and only warnings and errors reach the console (stderr), so a run's console
// keeps its progress display while each rank's full story is in its file.
//
//   StartRankLogging();                       // first thing in a worker
//   ...                                       // messages are held in memory
//   PP_RETURN_IF_ERROR(OpenRankLog(run + "/logs/rank_1.log", "rank=1 stage=1 data=0"));
//   ...                                       // held messages written, then each as it comes
//   StopRankLogging();                        // at exit (also flushes)
//
// One per process: ranks run as threads of one process share it.
#ifndef OBSERVABILITY_RANK_LOG_H_
#define OBSERVABILITY_RANK_LOG_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"

namespace pp {

struct RankLoggingOptions {
  // Messages at or above this glog severity also go to stderr (0 INFO,
  // 1 WARNING, 2 ERROR, 3 FATAL).
  int stderr_threshold = 1;
  // Messages held before OpenRankLog; beyond this the oldest are dropped (and
  // the file says how many).
  size_t max_held = 10000;
};

// Routes glog into this module: glog's own log files off, console only at or
// above `stderr_threshold`, everything (VLOG included, per --v) kept for the
// rank's file. Idempotent (a second call only updates the options).
void StartRankLogging(const RankLoggingOptions& options = {});

// Creates `path`'s directory if needed, opens `path` (truncating), writes the
// held messages and from then on every message, prefixed with `label`.
// FailedPrecondition before StartRankLogging or when a log is already open;
// Internal if the file cannot be created.
absl::Status OpenRankLog(const std::string& path, const std::string& label);

// Flushes and closes the file and gives glog back its console output
// (logtostderr). Idempotent.
void StopRankLogging();

// An ERROR line in the rank's file (or held for it) but not on the console:
// for an error the caller prints itself.
// The line names the caller's file and line.
void LogErrorToRankLogOnly(const std::string& message, const char* file = __builtin_FILE(),
                           int line = __builtin_LINE());

// The open log's path ("" when none).
std::string RankLogPath();

// Sets glog's verbosity (--v): VLOG(n) with n <= level is logged.
void SetLogVerbosity(int level);

}  // namespace pp

#endif  // OBSERVABILITY_RANK_LOG_H_
