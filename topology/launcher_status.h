// A launched worker's place and current action, for the launcher's verdict.
//
// When a worker dies or stops, the launcher can name it by global rank only:
// it does not know the grid, and a stopped or SIGKILLed process says nothing.
// So the launcher gives each worker a small shared-memory page (a memfd whose
// number is in PP_WORKER_STATUS_FD); the worker writes its pipeline stage and
// data-parallel index once (ParallelGrid does) and the name of every action
// as it starts (the driver's action observer, experiments/
// worker_status_observer.h: a copy into the page, no system call), and
// the launcher reads the page after the worker has died or stopped:
//
//   FAILED: rank 2 (pipeline stage 0, data-parallel index 1; last action
//   train step 54 1B2) (pid 4242) was stopped by signal 19 ...
//
// Outside a launched worker (tests, torchrun) the Report* calls do nothing.
// Thread-safe: Report* may be called from any thread (the last writer wins).
#ifndef TOPOLOGY_LAUNCHER_STATUS_H_
#define TOPOLOGY_LAUNCHER_STATUS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pp {

// The environment variable that carries the page's file descriptor.
inline constexpr char kWorkerStatusFdVariable[] = "PP_WORKER_STATUS_FD";

// Worker side. True when this process was given a status page (and could map
// it); the first call maps it.
bool WorkerStatusEnabled();
// This worker's place in the grid.
void ReportWorkerPlace(int stage, int data_index);
// What this worker starts now ("train step 54 1B2"); at most 255 bytes kept.
void ReportWorkerAction(absl::string_view action);
// The training step this worker is on: the launcher compares the furthest
// step of a failed attempt with the previous one's to see whether restarting
// makes progress (launcher.h, --max_restarts).
void ReportWorkerStep(int64_t step);

// Launcher side: one page per worker, created before the worker is forked.
class WorkerStatusPage {
 public:
  // A memfd (close-on-exec: SpawnWorker lets only its own worker inherit it)
  // mapped shared.
  static absl::StatusOr<std::unique_ptr<WorkerStatusPage>> Create();
  ~WorkerStatusPage();
  WorkerStatusPage(const WorkerStatusPage&) = delete;
  WorkerStatusPage& operator=(const WorkerStatusPage&) = delete;

  int fd() const { return fd_; }

  // What the worker reported; -1 / empty for what it did not.
  struct Snapshot {
    int stage = -1;
    int data_index = -1;
    int64_t step = -1;
    std::string action;
  };
  Snapshot Read() const;

  // "pipeline stage 0, data-parallel index 1; last action train step 54 1B2",
  // with only what is known; empty when nothing is.
  static std::string Describe(const Snapshot& snapshot);

 private:
  WorkerStatusPage(int fd, void* page) : fd_(fd), page_(page) {}
  int fd_;
  void* page_;
};

}  // namespace pp

#endif  // TOPOLOGY_LAUNCHER_STATUS_H_
