// Save-on-signal (checkpoint.save_on_signal): a SIGTERM (a scheduler's
// preemption, or the launcher stopping its workers) lets the current step
// finish, then every rank saves a checkpoint of it and the worker exits with
// 128 + SIGTERM; the next start with resume=auto, or a launcher restart
// (--max_restarts), continues from it, so preemption loses no progress.
//
// The signal reaches one process or all; ranks agree after each step with a
// one-number all-reduce over the world group (only with save_on_signal on), so
// they save the same step together. A second SIGTERM exits at once.
//
// Next: driver/run_experiment.cc (TrainLoop calls it), checkpoint/model/
// trainer_checkpoint.h (the save).
#ifndef DRIVER_SAVE_ON_SIGNAL_H_
#define DRIVER_SAVE_ON_SIGNAL_H_

#include <chrono>
#include <cstdint>
#include <string>

#include <c10/core/Device.h>
#include "absl/status/status.h"

#include "absl/status/statusor.h"
#include "topology/parallel_grid.h"

namespace pp {

// Installs the SIGTERM handler (SA_RESTART, so no system call of the
// transport sees EINTR). Idempotent.
void InstallSaveOnSignal();

// Collective over the world group: whether any rank received SIGTERM since
// InstallSaveOnSignal. `device`: where the world group's tensors live.
absl::StatusOr<bool> AnyRankSignalled(const ParallelGrid& grid, const c10::Device& device,
                                      std::chrono::milliseconds timeout);

// The status a worker returns after saving on a signal, and the test for it
// (the experiment's main exits 128 + SIGTERM for it).
absl::Status StoppedBySignal(int64_t step, const std::string& saved);
bool IsStoppedBySignal(const absl::Status& status);

}  // namespace pp

#endif  // DRIVER_SAVE_ON_SIGNAL_H_
