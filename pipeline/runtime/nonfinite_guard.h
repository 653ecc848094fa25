// Non-finite training detection (issue #14): after every step, a NaN or
// infinite loss or gradient norm stops the run with an error naming the step,
// the value and the first pipeline stage holding a non-finite gradient or
// weight (rank, data-parallel id, tensor), or, with policy "skip", the
// step's update is not applied (TrainerOptions::skip_nonfinite_updates) and
// counted, failing after max_skipped_steps such steps in a row. Called before
// the step's checkpoint is saved, so a non-finite state is never saved and
// keep_last never prunes the newest finite checkpoint in favour of one.
//
//   NonFiniteGuard guard({.skip = ..., .max_skipped_steps = ...});
//   PP_ASSIGN_OR_RETURN(StepResult r, trainer.Step());
//   PP_RETURN_IF_ERROR(guard.AfterStep(r, grid, model, timeout));
//   ... checkpointer.AfterStep(...)
//
// Next: pipeline/runtime/trainer.h (StepResult, skip_nonfinite_updates).
#ifndef PIPELINE_RUNTIME_NONFINITE_GUARD_H_
#define PIPELINE_RUNTIME_NONFINITE_GUARD_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/trainer.h"
#include "topology/parallel_grid.h"

namespace pp {

// This rank's first parameter (global name) whose gradient holds a NaN or an
// infinity, as "<name> (gradient)" (not with `weights_only`), else the first
// whose value does, as "<name> (weight)"; "" when every one is finite.
std::string FirstNonFiniteTensor(const PipelineModel& model, bool weights_only = false);

// Collective over the world group (every rank calls it): OK when every
// rank's weights are finite, else FailedPrecondition naming `step` and the
// first stage, rank and tensor. The last check before a checkpoint is saved
// (an update with finite gradients can still overflow a weight).
absl::Status CheckWeightsFinite(const ParallelGrid& grid, const PipelineModel& model, int64_t step,
                                std::chrono::milliseconds timeout);

// What to do with a non-finite step (the driver fills it from the run's
// nonfinite section; its messages name those fields).
struct NonFiniteOptions {
  // false ("fail"): stop at the first non-finite step. true ("skip"): a step
  // whose update the Trainer skipped (TrainerOptions::skip_nonfinite_updates)
  // is counted, and max_skipped_steps of them in a row stop the run.
  bool skip = false;
  int64_t max_skipped_steps = 10;
};

// One per run and rank; not thread-safe.
class NonFiniteGuard {
 public:
  explicit NonFiniteGuard(const NonFiniteOptions& options) : options_(options) {}

  // Every rank calls it after each Trainer::Step with its result. The loss
  // and the gradient norm are reduced over all ranks, so every rank takes the
  // same branch; when either is not finite the ranks exchange what they find
  // (one all-gather on the world group, bounded by `timeout`). OK for a finite
  // step, or a skipped one under policy "skip" (fewer than max_skipped_steps
  // in a row); otherwise FailedPrecondition with the whole story.
  absl::Status AfterStep(const StepResult& result, const ParallelGrid& grid,
                         const PipelineModel& model, std::chrono::milliseconds timeout);

  // Steps whose update was skipped so far.
  int64_t skipped_steps() const { return skipped_; }

 private:
  NonFiniteOptions options_;
  int64_t skipped_ = 0;
  int64_t skipped_in_a_row_ = 0;
};

}  // namespace pp

#endif  // PIPELINE_RUNTIME_NONFINITE_GUARD_H_
