// Loading, overriding and validating an ExperimentConfig (config.proto) for a
// training binary, before any process group forms.
//
//   PP_ASSIGN_OR_RETURN(auto config, pp::LoadExperimentConfig(path));
//   PP_RETURN_IF_ERROR(pp::ApplyOverride(config, "parallelism.pp=4"));
//   pp::ResolveDefaults(config);
//   PP_RETURN_IF_ERROR(pp::ValidateExperimentConfig(config, world_size));
//
// The model is the config's `model { [pp.<name>] { ... } }`, one of those
// registered in the binary (models/registry.h); the driver knows no model by
// name. Every error names the field, its value and what would be valid.
//
// Next: driver/run_experiment.h (what a rank does with a valid config).
#ifndef DRIVER_EXPERIMENT_CONFIG_H_
#define DRIVER_EXPERIMENT_CONFIG_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "driver/config.pb.h"
#include "models/registry.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/runtime/optimizer.h"

namespace pp {

using driver::ExperimentConfig;

// Parses protobuf text; InvalidArgument with the parser's line:column message.
absl::StatusOr<ExperimentConfig> ParseExperimentConfig(const std::string& text);
// Reads and parses `path`; NotFound names the path.
absl::StatusOr<ExperimentConfig> LoadExperimentConfig(const std::string& path);

// Sets one field from "dotted.path=value" (e.g. "optimizer.lr=1e-3",
// "data.path=/tmp/text"); a registered model's name stands for its message
// ("gpt.num_layers=8" sets model { [pp.gpt] { num_layers: 8 } }).
// InvalidArgument for a bad form, an unknown field (listing the valid ones at
// that level), a message field, or a value that does not parse as the
// field's type.
absl::Status ApplyOverride(ExperimentConfig& config, absl::string_view assignment);

// One override of the command line: the flag as typed ("--precision=fp32",
// "--set=precision=bf16") and its "path=value".
struct CommandLineOverride {
  std::string flag;
  std::string assignment;
};

// OK when no field is set twice. Otherwise InvalidArgument naming the field
// and both flags: only one value would be taken, silently (issue #42, class
// 9), as a repeated flag is refused for the same reason.
absl::Status CheckOneValuePerField(const std::vector<CommandLineOverride>& overrides);

// Sets every unset field to its default, the model's message included, so
// the printed config is the complete, resolved one. An unset
// parallelism.partition_method becomes the model's default.
void ResolveDefaults(ExperimentConfig& config);

// Processes one run starts: pp x dp x tp.
inline constexpr int64_t kMaxWorldSize = 1 << 16;
int WorldSizeOf(const driver::ParallelismConfig& par);

// Everything checkable without processes: sizes, the model (registered here,
// its own fields and shape, tensor parallelism), pp x dp x tp against
// `world_size` (0: not known yet),
// the schedule (registered, accepts this micro-batch count and chunking,
// trains), layers per part, the partition method, optimizer, learning-rate
// schedule, data source and path, sampling.
absl::Status ValidateExperimentConfig(const ExperimentConfig& config, int world_size);

// The optimizer and its learning-rate schedule as the runtime takes them:
// the one conversion from the config (validation and the driver use it).
OptimizerConfig ToOptimizerConfig(const ExperimentConfig& config);
LrScheduleConfig ToLrScheduleConfig(const ExperimentConfig& config);

// What the model reads of the run (sizes, seed, data).
ModelRun ModelRunOf(const ExperimentConfig& config);

// The selected model's own check of the run's data files (ModelInfo::
// check_data, e.g. token ids against its vocabulary); OK when it has none.
// The launcher calls it once before any worker starts.
absl::Status CheckModelData(const ExperimentConfig& config);
// The layer specs the config's pipeline stages hold: the model's, or under
// parallelism.vocab_parallel its split's body (without the token table and
// the head, which the vocabulary layers hold).
absl::StatusOr<std::vector<LayerSpec>> MakeExperimentSpecs(const ExperimentConfig& config);

// Protobuf text of the whole config.
std::string ConfigToText(const ExperimentConfig& config);

// Resume: compares the config a checkpoint was written with (`saved_text`,
// from its manifest) with this run's, field by field ("gpt.num_heads: 4 in
// the checkpoint, 8 now"). A difference that makes the continuation a
// different training run (the model and its fields, seed, optimizer.name)
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

#endif  // DRIVER_EXPERIMENT_CONFIG_H_
