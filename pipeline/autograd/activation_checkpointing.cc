#include "pipeline/autograd/activation_checkpointing.h"

#include <algorithm>
#include <memory>
#include <regex>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pipeline/autograd/recompute.h"

namespace pp {
namespace {

// A policy whose regex has been compiled; nullptr regex = "has parameters".
struct CompiledPolicy {
  int64_t interval = 0;
  std::shared_ptr<const std::regex> checkpointable;
};

absl::StatusOr<CompiledPolicy> Compile(const ActivationCheckpointPolicy& policy) {
  if (policy.interval < 0) {
    return absl::InvalidArgumentError(absl::StrCat("activation checkpoint interval (",
                                                   policy.interval,
                                                   ") must be >= 0 (0 turns checkpointing off)"));
  }
  CompiledPolicy compiled;
  compiled.interval = policy.interval;
  if (!policy.checkpointable_types.empty()) {
    try {
      compiled.checkpointable =
          std::make_shared<const std::regex>(policy.checkpointable_types, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpointable layer type regex '", policy.checkpointable_types,
                       "' does not compile as an ECMAScript regex: ", e.what()));
    }
  }
  return compiled;
}

// DeepSpeed's PipelineModule._is_checkpointable: with a type list every layer
// must match; otherwise any layer with parameters makes the run worth it.
bool IsCheckpointable(const CompiledPolicy& policy, const std::vector<LayerTraits>& layers,
                      int64_t begin, int64_t end) {
  if (policy.checkpointable != nullptr) {
    for (int64_t i = begin; i < end; ++i) {
      if (!std::regex_match(layers[i].type_name, *policy.checkpointable)) return false;
    }
    return true;
  }
  for (int64_t i = begin; i < end; ++i) {
    if (layers[i].has_parameters) return true;
  }
  return false;
}

std::vector<LayerRun> Plan(const CompiledPolicy& policy, const std::vector<LayerTraits>& layers) {
  const int64_t n = static_cast<int64_t>(layers.size());
  std::vector<LayerRun> runs;
  if (n == 0) return runs;
  if (policy.interval == 0) return {LayerRun{0, n, false}};
  for (int64_t begin = 0; begin < n; begin += policy.interval) {
    const int64_t end = std::min(n, begin + policy.interval);
    runs.push_back({begin, end, IsCheckpointable(policy, layers, begin, end)});
  }
  return runs;
}

}  // namespace

std::string TypeNamesRegex(const std::vector<std::string>& type_names) {
  static const std::regex kSpecial(R"([.^$|()\[\]{}*+?\\/-])");
  std::vector<std::string> escaped;
  escaped.reserve(type_names.size());
  for (const std::string& name : type_names) {
    escaped.push_back(std::regex_replace(name, kSpecial, R"(\$&)"));
  }
  if (escaped.empty()) return "(?!)";  // Matches nothing: no type is checkpointable.
  return absl::StrCat("(?:", absl::StrJoin(escaped, "|"), ")");
}

LayerTraits TraitsOf(const LayerImpl& layer) {
  return LayerTraits{layer.TypeName(), !LayerParameters(layer).empty()};
}

absl::StatusOr<std::vector<LayerRun>> PlanLayerRuns(const ActivationCheckpointPolicy& policy,
                                                    const std::vector<LayerTraits>& layers) {
  absl::StatusOr<CompiledPolicy> compiled = Compile(policy);
  if (!compiled.ok()) return compiled.status();
  return Plan(*compiled, layers);
}

absl::StatusOr<LayerRunner> MakeCheckpointingRunner(const ActivationCheckpointPolicy& policy) {
  absl::StatusOr<CompiledPolicy> compiled = Compile(policy);
  if (!compiled.ok()) return compiled.status();
  if (compiled->interval == 0) return LayerRunner(RunLayers);
  return LayerRunner([policy = *std::move(compiled)](const std::vector<Layer>& layers,
                                                     Activations inputs, const MicroBatch& batch) {
    std::vector<LayerTraits> traits;
    traits.reserve(layers.size());
    for (const Layer& layer : layers) traits.push_back(TraitsOf(*layer));
    for (const LayerRun& run : Plan(policy, traits)) {
      std::vector<Layer> range(layers.begin() + run.begin, layers.begin() + run.end);
      inputs = run.checkpointed ? RunLayersWithRecompute(range, std::move(inputs), batch)
                                : RunLayers(range, std::move(inputs), batch);
    }
    return inputs;
  });
}

}  // namespace pp
