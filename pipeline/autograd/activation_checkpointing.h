// Which ranges of a stage's layers are checkpointed, and a LayerRunner that
// applies the decision: DeepSpeed's PipelineModule policy
// (activation_checkpoint_interval + checkpointable layers) for pipe.
//
// A StageModule and PipelineModel::ToSequential() run their local layers
// through a settable LayerRunner (pipeline/layers/layer.h), so the same policy applies
// to a pipeline stage and to the sequential reference without pipeline/
// depending on checkpoint/:
//
//   ActivationCheckpointPolicy policy;
//   policy.interval = 1;
//   PP_ASSIGN_OR_RETURN(LayerRunner runner, MakeCheckpointingRunner(policy));
//   stage_module->set_layer_runner(runner);  // or the sequential model's
//
// Policy, as in DeepSpeed: the local layers are cut into consecutive runs of
// `interval` layers (the last may be shorter). A run is checkpointed when it
// is "checkpointable": by default when any of its layers has parameters;
// with `checkpointable_types` set, when every layer's TypeName() matches it.
// interval 0 turns checkpointing off. Recomputation itself: recompute.h.
#ifndef PIPELINE_AUTOGRAD_ACTIVATION_CHECKPOINTING_H_
#define PIPELINE_AUTOGRAD_ACTIVATION_CHECKPOINTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/layers/layer.h"

namespace pp {

struct ActivationCheckpointPolicy {
  // Checkpoint every run of `interval` consecutive local layers; 0 = off.
  int64_t interval = 0;
  // ECMAScript regex that must match a layer's whole TypeName() (case-
  // sensitive), e.g. "TransformerBlock|MlpBlock". Empty: a run is
  // checkpointable when any of its layers has parameters.
  std::string checkpointable_types;
};

// A regex for `checkpointable_types` matching exactly the given type names
// (DeepSpeed's `checkpointable_layers` list); special characters are escaped.
std::string TypeNamesRegex(const std::vector<std::string>& type_names);

// What the policy needs to know about one layer.
struct LayerTraits {
  std::string type_name;
  bool has_parameters = false;  // Any tensor from LayerParameters (recompute.h).
};
LayerTraits TraitsOf(const LayerImpl& layer);

// Local layers [begin, end) run as one unit, recomputed in backward or not.
struct LayerRun {
  int64_t begin = 0;
  int64_t end = 0;
  bool checkpointed = false;

  bool operator==(const LayerRun& o) const {
    return begin == o.begin && end == o.end && checkpointed == o.checkpointed;
  }
};

// The policy's decision for a list of local layers (pure). Interval 0 gives one
// uncheckpointed run of all layers (none for an empty list); an interval
// larger than the layer count gives one run of all layers.
// Errors: InvalidArgument for a negative interval or a regex that does not
// compile (the message names the value).
absl::StatusOr<std::vector<LayerRun>> PlanLayerRuns(const ActivationCheckpointPolicy& policy,
                                                    const std::vector<LayerTraits>& layers);

// A LayerRunner that plans the runs of the layers it is given (per call, so one
// runner serves every StageModule and ToSequential) and runs checkpointed runs
// through RunLayersWithRecompute, the others through RunLayers. With interval
// 0 it behaves exactly like RunLayers. The runner is copyable and holds no
// mutable state; calls from several threads are as safe as the layers are.
// Errors: as PlanLayerRuns, reported here (not at call time).
absl::StatusOr<LayerRunner> MakeCheckpointingRunner(const ActivationCheckpointPolicy& policy);

}  // namespace pp

#endif  // PIPELINE_AUTOGRAD_ACTIVATION_CHECKPOINTING_H_
