// Validating an ExperimentConfig (config.proto) for a training binary, before
// any process group forms; reading and overriding it is config_text.h, which
// this includes, and comparing it with a checkpoint's is resume_config.h.
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
#include "driver/config_text.h"
#include "models/registry.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/runtime/optimizer.h"

namespace pp {

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

}  // namespace pp

#endif  // DRIVER_EXPERIMENT_CONFIG_H_
