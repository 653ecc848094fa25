// What a training run shows researchers in the tools they already use
// (issue 15), wired into RunExperiment (run_experiment.cc):
//
//   <run>/tb/events.out.tfevents.*   TensorBoard scalars of every metrics.jsonl
//                                    line (written by rank 0) and the sample text
//   <run>/logs/rank_<N>.log          rank N's glog (LOG, VLOG; `--v=1` adds every
//                                    executed action), "rank=N stage=S data=D" in
//                                    each line's prefix
//   <run>/profile/rank_<N>.json      --profile_steps=A:B: rank N's LibTorch operators
//   <run>/profile/actions.json       pipe's actions of those steps, all ranks
//   <run>/profile/merged.json        both: one process lane per rank, pipe's
//                                    actions above the operators they ran
//   metrics.jsonl                    + per-rank CPU memory (current, step peak)
//                                    on the steps that log, evaluate or trace,
//                                    and every line's wall time
//
// Step numbers are metrics.jsonl's: the first step is 1.
#ifndef DRIVER_RUN_OBSERVABILITY_H_
#define DRIVER_RUN_OBSERVABILITY_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "driver/experiment_config.h"
#include "nlohmann/json.hpp"
#include "observability/operator_profiler.h"
#include "observability/tensorboard_writer.h"
#include "pipeline/runtime/trainer.h"
#include "pipeline/schedule/ir/chrome_trace.h"
#include "topology/parallel_grid.h"

namespace pp {

// --v and --profile_steps (observability_flags.cc).
int VerbosityFlag();
std::string ProfileStepsFlag();

// In every worker before the model is built: the CPU memory tracker, glog
// routed to the rank's (not yet opened) log file with only warnings and errors
// on the console, and glog's verbosity from --v.
absl::Status StartWorkerObservability();

// The profile range of --profile_steps for this config ("" = none); bad
// syntax, step 0 or a step past config.steps() is InvalidArgument naming the
// value. The launcher calls it before any worker starts.
absl::StatusOr<std::optional<StepRange>> ProfileStepsFor(const ExperimentConfig& config);

// Per global rank, after a step.
struct StepMemory {
  std::vector<int> stage;              // the rank's pipeline stage
  std::vector<int64_t> start_bytes;    // live CPU tensor bytes when the step began
  std::vector<int64_t> current_bytes;  // ... when it ended
  std::vector<int64_t> peak_bytes;     // the maximum during the step
  // The optimizer's state (moments, fp32 masters), from the tensors' storage.
  std::vector<int64_t> optimizer_state_bytes;
  // p2p messages and activation/gradient payload bytes sent since the
  // process started (P2PStats::tensor_messages, payload_bytes_sent).
  std::vector<int64_t> p2p_messages_sent;
  std::vector<int64_t> p2p_bytes_sent;
};

// The run directory's machine-readable end-of-run figures, per global rank:
//   {"machine": {"libtorch", "blas", "blas_kernel", "cpu", "cpu_features"},
//    "schedule": "1f1b", "steps": 12, "ranks": [{"rank": 0, "stage": 0,
//    "peak_bytes", "current_bytes", "optimizer_state_bytes",
//    "planner_peak_bytes" (the byte planner's prediction; null where it has
//    none, e.g. tp > 1), "p2p_messages_sent", "p2p_bytes_sent"}, ...]}
// (the p2p counts and memory of the last step that logged: the last step).
inline constexpr char kRunSummaryFile[] = "summary.json";

class RunObservability {
 public:
  // Collective over the world group: every rank learns rank 0's run
  // directory (`run_dir` on rank 0; ignored elsewhere), opens its log there,
  // and with --profile_steps makes its operator profiler; rank 0 opens the
  // TensorBoard writer.
  static absl::StatusOr<std::unique_ptr<RunObservability>> Create(
      const ExperimentConfig& config, const ParallelGrid& grid, const std::string& run_dir,
      std::chrono::milliseconds timeout);

  const std::string& run_dir() const { return run_dir_; }

  // Around Trainer::Step(); `step` is 1-based. With `gather` (the same on
  // every rank: a step that logs, evaluates or traces) AfterStep is
  // collective and the memory figures of all ranks reach every rank;
  // otherwise it returns none.
  absl::Status BeforeStep(int64_t step, const Trainer& trainer);
  absl::StatusOr<StepMemory> AfterStep(int64_t step, const Trainer& trainer, bool gather);
  // Whether --profile_steps covers `step`: the Trainer must trace it (the
  // profile keeps its actions' times).
  bool Profiles(int64_t step) const { return profile_.has_value() && profile_->Contains(step); }

  // Rank 0: adds the memory and wall time to a metrics.jsonl line, then
  // writes every number of the line to TensorBoard at its step:
  //   loss -> train/loss, lr -> train/lr, grad_norm -> train/grad_norm,
  //   tokens_per_s -> train/tokens_per_s, step_s -> train/step_time_s,
  //   eval_loss -> eval/loss, bubble[i] -> rank_<i>/bubble_fraction,
  //   mem_peak_bytes[i] -> rank_<i>/peak_memory_bytes,
  //   mem_current_bytes[i] -> rank_<i>/current_memory_bytes.
  absl::Status Metrics(nlohmann::json& line, const StepMemory& memory);
  // Rank 0: text in TensorBoard's Text dashboard.
  absl::Status Text(const std::string& tag, int64_t step, const std::string& text);

  // Collective: writes the profiles and the merged trace (rank 0 merges once
  // every rank has written its own), closes TensorBoard, and returns rank 0's
  // end-of-run memory summary (empty elsewhere): per rank the largest step
  // peak and the last current figure, beside the simulator's predicted peak
  // activations for the schedule. Rank 0 also writes the same per rank as
  // summary.json in the run directory (kRunSummaryFile).
  absl::StatusOr<std::string> Finish(const Trainer& trainer);

 private:
  RunObservability() = default;
  absl::Status Barrier(const char* what);

  const ParallelGrid* grid_ = nullptr;
  ExperimentConfig config_;  // for the predicted memory in the summary
  std::chrono::milliseconds timeout_{0};
  std::string run_dir_;
  bool rank0_ = false;
  std::unique_ptr<TensorBoardWriter> tb_;
  std::unique_ptr<OperatorProfiler> profiler_;
  std::optional<StepRange> profile_;
  std::vector<TraceEvent> profiled_actions_;  // this rank's, absolute steady_clock us
  int64_t step_start_bytes_ = 0;
  std::chrono::steady_clock::time_point step_start_;
  // This rank's largest step peak, of every step (gathered or not).
  int64_t local_max_peak_ = 0;
  // Rank 0: per global rank, the largest step peak seen and the last memory.
  std::vector<int64_t> max_peak_;
  std::optional<StepMemory> last_memory_;
};

}  // namespace pp

#endif  // DRIVER_RUN_OBSERVABILITY_H_
