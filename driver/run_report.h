// Rank 0's outputs of a training run: the run directory
//
//   <output_dir>/<name>-<UTC time>[-N]/   created exclusively: a second run
//                      of the same name in the same second takes -2, -3, ...
//     config.textproto   the resolved config (every field, defaults included)
//     metrics.jsonl      one line per step: step, loss, eval_loss, lr,
//                        grad_norm, tokens_per_s, step_s, bubble, mem_peak_bytes,
//                        mem_current_bytes, mem_optimizer_state_bytes,
//                        p2p_bytes_sent (per rank), time; on a restart's first line, restart
//                        (Restarted)
//     loss.svg           loss curve, written at the end
//     trace.json         Chrome trace of one step (chrome://tracing, Perfetto)
//     sample.txt         GPT: text generated through the pipeline at the end
//     summary.json       per rank: memory measured and planned, p2p sent;
//                        the machine facts (run_observability.h)
//     tb/, logs/, profile/  TensorBoard events, per-rank glog files, operator
//                        profiles (--profile_steps); see run_observability.h
//
// and the console report. Other ranks hold an inactive one.
#ifndef DRIVER_RUN_REPORT_H_
#define DRIVER_RUN_REPORT_H_

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "driver/experiment_config.h"
#include "driver/progress.h"
#include "driver/run_observability.h"
#include "observability/loss_curve.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/trainer.h"

namespace pp {

// Writes `contents` to `path` (replacing it).
absl::Status WriteFile(const std::filesystem::path& path, const std::string& contents);

class RunReport {
 public:
  static absl::StatusOr<RunReport> Open(const ExperimentConfig& config,
                                        const std::string& model_name, bool rank0);

  bool active() const { return metrics_ != nullptr; }
  const std::filesystem::path& dir() const { return dir_; }
  // TensorBoard, memory and the rest of run_observability.h (every rank).
  void set_observability(RunObservability* obs) { obs_ = obs; }

  // The run's header line: model, parallelism, data, the partition, and the
  // BLAS, its kernel and the CPU (topology/blas_kernel.h).
  void Header(const std::string& data_description, int64_t tokens_per_step,
              const PipelineModel& model) const;

  // This attempt is the launcher's restart `count` of at most `max_restarts`
  // after `cause`, continuing at step `resumed_from_step` (0: from the
  // start): said on the console, and in the next metrics line as
  // "restart": {"count", "max_restarts", "cause", "resumed_from_step"}.
  void Restarted(int count, int max_restarts, const std::string& cause, int64_t resumed_from_step);

  // One metrics line, the loss curves and the progress display.
  absl::Status Step(int64_t step, const StepResult& r, double tokens_per_s, double seconds,
                    std::optional<double> eval_loss, const StepMemory& memory, Progress& progress);

  // trace.json for the first traced step (`first`); with trace_steps > 1 also
  // traces/step_<step>.json for every traced step (0-based, as trace_step).
  absl::Status Trace(int64_t step, bool first, const std::string& trace) const;

  // sample.txt, TensorBoard's text and the console.
  absl::Status Sample(const std::string& text) const;

  // loss.svg and the closing line.
  absl::Status Finish(double train_seconds, const std::string& memory_summary) const;

 private:
  RunReport(const ExperimentConfig& config, const std::string& model_name)
      : config_(&config), model_name_(model_name) {}

  const ExperimentConfig* config_;
  std::string model_name_;
  std::filesystem::path dir_;
  std::unique_ptr<std::ofstream> metrics_;  // null on ranks other than 0
  RunObservability* obs_ = nullptr;
  LossPoints train_curve_, eval_curve_;
  // For the next metrics line: a JSON object, or empty.
  std::string restart_;
};

}  // namespace pp

#endif  // DRIVER_RUN_REPORT_H_
