// What train_gpt and train_bert run: load the config (file + flag overrides),
// validate it before any process group forms, launch pp x dp ranks, train,
// evaluate, and write the run directory:
//
//   <output_dir>/<name>-<UTC time>/
//     config.textproto   the resolved config (every field, defaults included)
//     metrics.jsonl      one line per step: step, loss, eval_loss, lr,
//                        grad_norm, tokens_per_s, step_s, bubble, mem_peak_bytes,
//                        mem_current_bytes (per rank), time
//     loss.svg           loss curve, written at the end
//     trace.json         Chrome trace of one step (chrome://tracing, Perfetto)
//     sample.txt         GPT: text generated through the pipeline at the end
//     tb/, logs/, profile/  TensorBoard events, per-rank glog files, operator
//                        profiles (--profile_steps); see run_observability.h
//
// On a terminal rank 0 draws a progress bar (step/total, loss, tokens/s, ETA);
// otherwise it prints a plain log line every log_interval steps.
#ifndef EXPERIMENTS_TRAIN_LIB_H_
#define EXPERIMENTS_TRAIN_LIB_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "experiments/experiment_config.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/runtime/micro_batch_source.h"

namespace pp {

// A model's data for one run. Every rank makes its own (the sources must be
// deterministic in (step, index); see micro_batch_source.h).
struct ExperimentData {
  std::unique_ptr<MicroBatchSource> train;
  std::unique_ptr<MicroBatchSource> eval;  // null: no evaluation
  int64_t tokens_per_step = 0;             // global (samples, for a non-token model)
  std::string description;                 // for the run's header line
};

// A user's model for the experiment driver: the same launcher, config
// validation, Trainer, checkpoints and run directory as train_gpt. The config
// (ExperimentConfig) has no gpt/bert section; the functions read what they
// need from it (sizes from parallelism.micro_batch_size, seed, data.path).
// See examples/custom_model/.
struct ExperimentModel {
  std::string name;  // printed and in loss.svg's title
  // Workspace-relative textproto used without --config (ship it as data).
  std::string default_config;
  std::function<absl::StatusOr<std::vector<LayerSpec>>(const ExperimentConfig&)> specs;
  LossFn loss;
  std::function<absl::StatusOr<ExperimentData>(const ExperimentConfig&)> data;
};

// main() of an experiment binary: returns the process exit code (2 for a bad
// config, 1 for a failed run).
int ExperimentMain(int argc, char** argv, ModelKind kind);
// The same for a user's model (ModelKind::kCustom).
int ExperimentMain(int argc, char** argv, const ExperimentModel& model);

// One rank's whole run with a validated config (after rendezvous env is set).
// REQUIRES: `custom` set iff kind == ModelKind::kCustom.
absl::Status RunExperiment(const ExperimentConfig& config, ModelKind kind,
                           const ExperimentModel* custom = nullptr);

}  // namespace pp

#endif  // EXPERIMENTS_TRAIN_LIB_H_
