// Loading, overriding and validating an ExperimentConfig (config.proto) for
// train_gpt / train_bert, before any process group forms.
//
//   PP_ASSIGN_OR_RETURN(auto config, pp::LoadExperimentConfig(path));
//   PP_RETURN_IF_ERROR(pp::ApplyOverride(config, "parallelism.pp=4"));
//   PP_RETURN_IF_ERROR(pp::ValidateExperimentConfig(config, pp::ModelKind::kGpt, world_size));
//
// Every error names the field, its value and what would be valid.
//
// Next: experiments/train_lib.h (what a rank does with a valid config).
#ifndef EXPERIMENTS_EXPERIMENT_CONFIG_H_
#define EXPERIMENTS_EXPERIMENT_CONFIG_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "experiments/config.pb.h"
#include "models/bert/bert.h"
#include "models/gpt/gpt.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/runtime/optimizer.h"

namespace pp {

using experiments::ExperimentConfig;

// kCustom: a user's model (experiments/train_lib.h, ExperimentModel); the
// config then has no gpt/bert section and validation checks its specs.
enum class ModelKind { kGpt, kBert, kCustom };
const char* ModelKindName(ModelKind kind);  // "gpt", "bert", "custom"

// Parses protobuf text; InvalidArgument with the parser's line:column message.
absl::StatusOr<ExperimentConfig> ParseExperimentConfig(const std::string& text);
// Reads and parses `path`; NotFound names the path.
absl::StatusOr<ExperimentConfig> LoadExperimentConfig(const std::string& path);

// Sets one field from "dotted.path=value" (e.g. "optimizer.lr=1e-3",
// "gpt.num_layers=8", "data.path=/tmp/text"). InvalidArgument for a bad
// form, an unknown field (listing the valid ones at that level), a message
// field, or a value that does not parse as the field's type.
absl::Status ApplyOverride(ExperimentConfig& config, absl::string_view assignment);

// Makes the model sub-message for `kind` present (others are an error at
// validation) and sets every unset field to its default, so the printed
// config is the complete, resolved one. kCustom: no model sub-message, and
// parallelism.partition_method defaults to "uniform".
void ResolveDefaults(ExperimentConfig& config, ModelKind kind);

// Everything checkable without processes: sizes, model shape, pp x dp against
// `world_size` (0: not known yet), the schedule (registered, accepts this
// micro-batch count and chunking, trains), stages vs blocks, the partition
// method, optimizer, learning-rate schedule, data path, sampling.
// REQUIRES: `custom_specs` (the model's layers) set for ModelKind::kCustom.
absl::Status ValidateExperimentConfig(const ExperimentConfig& config, ModelKind kind,
                                      int world_size,
                                      const std::vector<LayerSpec>* custom_specs = nullptr);

// The optimizer and its learning-rate schedule as the runtime takes them:
// the one conversion from the config (validation and the driver use it).
OptimizerConfig ToOptimizerConfig(const ExperimentConfig& config);
LrScheduleConfig ToLrScheduleConfig(const ExperimentConfig& config);

GptConfig ToGptConfig(const ExperimentConfig& config);
BertConfig ToBertConfig(const ExperimentConfig& config);
absl::StatusOr<std::vector<LayerSpec>> MakeExperimentSpecs(const ExperimentConfig& config,
                                                           ModelKind kind);

// Protobuf text of the whole config.
std::string ConfigToText(const ExperimentConfig& config);

// Resume: compares the config a checkpoint was written with (`saved_text`,
// from its manifest) with this run's, field by field ("gpt.num_heads: 4 in
// the checkpoint, 8 now"). A difference that makes the continuation a
// different training run (the model's kind and shape, seed, optimizer.name)
// is an error listing every such field, unless
// checkpoint.allow_config_change is set; the other differences that change
// the numbers (learning rate and schedule, steps, batch and data, layout and
// schedule, which reshard) are appended to `warnings`. Fields that do not
// change the training (names, paths of outputs, logging, evaluation,
// sampling, checkpointing, timeouts) are ignored. A checkpoint without a
// config, or with one this build cannot parse, gives a warning.
absl::Status CheckResumeConfig(const std::string& saved_text, const ExperimentConfig& now,
                               std::vector<std::string>* warnings);

}  // namespace pp

#endif  // EXPERIMENTS_EXPERIMENT_CONFIG_H_
