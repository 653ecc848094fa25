#include "pipeline/layers/layer_spec.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/default_generator.h"

namespace pp {

LayerSpec::LayerSpec(std::string name, LayerFactory factory)
    : name_(std::move(name)), factory_(std::move(factory)) {}

LayerSpec& LayerSpec::WithName(std::string name) {
  name_ = std::move(name);
  return *this;
}

LayerSpec& LayerSpec::WithParameterCount(int64_t count) {
  TORCH_CHECK(count >= 0, "declared parameter count of layer '", name_, "' must be >= 0, got ",
              count);
  parameter_count_ = count;
  return *this;
}

TiedLayerSpec::TiedLayerSpec(std::string key, LayerFactory factory, TiedForwardFn forward_fn,
                             std::vector<std::string> tied_param_names)
    : LayerSpec(key, std::move(factory)) {
  tied_ = true;
  tie_key_ = std::move(key);
  tied_forward_fn_ = std::move(forward_fn);
  tied_param_names_ = std::move(tied_param_names);
}

TiedLayer::TiedLayer(std::string type_name, std::string key, Layer shared, TiedForwardFn forward_fn)
    : LayerImpl(std::move(type_name)),
      key_(std::move(key)),
      shared_(std::move(shared)),
      forward_fn_(std::move(forward_fn)) {
  TORCH_CHECK(shared_ != nullptr, "tied layer '", key_, "' has no shared module");
}

Activations TiedLayer::Forward(const Activations& inputs, const MicroBatch& batch) {
  return forward_fn_ ? forward_fn_(*shared_, inputs, batch) : shared_->Forward(inputs, batch);
}

TiedForwardFn TiedProjection(std::string param_name) {
  return [param_name = std::move(param_name)](LayerImpl& shared, const Activations& inputs,
                                              const MicroBatch&) {
    auto params = shared.named_parameters();
    const torch::Tensor* weight = params.find(param_name);
    TORCH_CHECK(weight != nullptr, "tied projection: shared module ", shared.TypeName(),
                " has no parameter '", param_name, "'");
    Activations out;
    out.reserve(inputs.size());
    for (const torch::Tensor& x : inputs) out.push_back(torch::matmul(x, weight->t()));
    return out;
  };
}

absl::Status ValidateSpecs(const std::vector<LayerSpec>& specs) {
  if (specs.empty()) {
    return absl::InvalidArgumentError(
        "the layer spec list is empty; a model needs at least one layer");
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const LayerSpec& spec = specs[i];
    if (!spec.factory()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer spec ", i, " ('", spec.name(), "') has no factory"));
    }
    if (spec.is_tied() &&
        (spec.tie_key().empty() || spec.tie_key().find('.') != std::string::npos)) {
      return absl::InvalidArgumentError(absl::StrCat("layer spec ", i, ": tie key '",
                                                     spec.tie_key(),
                                                     "' is not a module name (non-empty, no '.')"));
    }
  }
  return absl::OkStatus();
}

std::map<std::string, std::vector<int64_t>> TiePositions(const std::vector<LayerSpec>& specs) {
  std::map<std::string, std::vector<int64_t>> positions;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].is_tied()) positions[specs[i].tie_key()].push_back(static_cast<int64_t>(i));
  }
  return positions;
}

Layer BuildSeeded(LayerContext context, const LayerFactory& build) {
  // The default generator is process-wide: ranks run as threads of one process
  // (tests) must not interleave their seed -> build -> restore sequences with
  // each other or with a recompute's RNG restore (common/default_generator.h).
  std::lock_guard<std::recursive_mutex> build_lock(DefaultGeneratorMutex());
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  torch::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    saved = gen.get_state();
  }
  torch::manual_seed(context.seed);
  context.rng = gen;
  Layer layer;
  try {
    layer = build(context);
  } catch (...) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(saved);
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(saved);
  }
  TORCH_CHECK(layer != nullptr, "a layer factory returned null");
  return layer;
}

int64_t CountTrainableParameters(const torch::nn::Module& module) {
  std::unordered_set<const void*> seen;
  int64_t count = 0;
  for (const torch::Tensor& p : module.parameters()) {
    if (!p.defined() || !p.requires_grad()) continue;
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    count += p.numel();
  }
  return count;
}

Layer BuildSpecLayer(const LayerSpec& spec, int64_t index, uint64_t base_seed,
                     const LayerEnvironment& environment) {
  return BuildSeeded(MakeLayerContext(environment, index, base_seed + index), spec.factory());
}

int64_t SpecParameterCount(const LayerSpec& spec, int64_t index, uint64_t base_seed,
                           const LayerEnvironment& environment) {
  if (spec.declared_parameter_count().has_value()) return *spec.declared_parameter_count();
  // Built, counted and dropped here: only one layer is alive at a time.
  Layer layer = BuildSpecLayer(spec, index, base_seed, environment);
  return CountTrainableParameters(*layer);
}

std::string ExceptionMessage(const std::exception& e) {
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&e))
    return torch_error->what_without_backtrace();
  return e.what();
}

}  // namespace pp
