// ExperimentModel: how a user's model joins pipe's training driver (the same
// launcher, config validation, Trainer, checkpoints and run directory as
// train_gpt). See examples/custom_model/.
#ifndef DRIVER_EXPERIMENT_MODEL_H_
#define DRIVER_EXPERIMENT_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "driver/experiment_config.h"
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

// A user's model for the driver. The config (ExperimentConfig) has no
// gpt/bert section; the functions read what they need from it (sizes from
// parallelism.micro_batch_size, seed, data.path).
struct ExperimentModel {
  std::string name;  // printed and in loss.svg's title
  // Workspace-relative textproto used without --config (ship it as data).
  std::string default_config;
  std::function<absl::StatusOr<std::vector<LayerSpec>>(const ExperimentConfig&)> specs;
  LossFn loss;
  std::function<absl::StatusOr<ExperimentData>(const ExperimentConfig&)> data;
};

}  // namespace pp

#endif  // DRIVER_EXPERIMENT_MODEL_H_
