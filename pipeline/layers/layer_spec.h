// How a pipeline model is described: an ordered list of layer specs.
//
// A LayerSpec holds a name and a factory; the layer is constructed only on the
// stage that owns it, right after the RNG is seeded with `base_seed + i` for
// global layer `i`, so its initial weights do not depend on the partition.
// A TiedLayerSpec marks positions that share one module per stage (the GPT
// token embedding at the start and, through `forward_fn`, the LM head at the
// end). The spec list can be inspected (names, declared parameter counts, tie
// keys) without building any layer.
//
//   auto embedding = [](const pp::LayerContext&) {
//     return pp::MakeModuleLayer(torch::nn::Embedding(100, 16));
//   };
//   std::vector<pp::LayerSpec> specs = {
//       pp::TiedLayerSpec("embed", embedding),
//       pp::LayerSpec("Block", [](const pp::LayerContext& ctx) { return MakeBlock(16, ctx); }),
//       pp::TiedLayerSpec("embed", embedding, pp::TiedProjection("weight")).WithName("LmHead"),
//   };
//
// Next: pipeline/partition/partitioner.h (cuts the list into parts), then
// pipeline/pipeline_model.h (builds one stage's modules from it).
#ifndef PIPELINE_LAYERS_LAYER_SPEC_H_
#define PIPELINE_LAYERS_LAYER_SPEC_H_

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeline/layers/layer.h"
#include "pipeline/layers/layer_context.h"

namespace pp {

// Builds a fresh layer for `context` (its index, tensor-parallel shard, device,
// dtype; pipeline/layers/layer_context.h). Called with the RNG already seeded;
// must not depend on any other mutable state, so every rank holding the same
// shard builds the same weights.
using LayerFactory = std::function<Layer(const LayerContext& context)>;

// How a tied position runs the key's shared module. Empty = call the module's
// own Forward (the embedding position); set for positions that use the module's
// parameters differently (the LM head: logits = x @ embedding.weight^T).
using TiedForwardFn = std::function<Activations(LayerImpl& shared, const Activations& inputs,
                                                const MicroBatch& batch)>;

// A value type, cheap to copy (the factory is shared). TiedLayerSpec derives
// from it without adding members, so a std::vector<LayerSpec> holds both.
class LayerSpec {
 public:
  // `name` is what the partition report prints and what `type:<regex>`
  // partitioning matches; use the layer's type name ("TransformerBlock").
  LayerSpec(std::string name, LayerFactory factory);

  // Overrides the name (e.g. "LmHead" for the second use of a tied key).
  LayerSpec& WithName(std::string name);
  // Declares the trainable parameter count, so the `parameters` partitioner
  // does not have to build the layer to count it. REQUIRES: count >= 0.
  LayerSpec& WithParameterCount(int64_t count);

  const std::string& name() const { return name_; }
  const std::optional<int64_t>& declared_parameter_count() const { return parameter_count_; }
  const LayerFactory& factory() const { return factory_; }

  bool is_tied() const { return tied_; }
  // Empty for an untied spec.
  const std::string& tie_key() const { return tie_key_; }
  const TiedForwardFn& tied_forward_fn() const { return tied_forward_fn_; }
  // Names (inside the shared module) of the parameters kept identical across
  // the stages that hold the key; empty = all of the shared module's parameters.
  const std::vector<std::string>& tied_param_names() const { return tied_param_names_; }

 protected:
  std::string name_;
  LayerFactory factory_;
  std::optional<int64_t> parameter_count_;
  bool tied_ = false;
  std::string tie_key_;
  TiedForwardFn tied_forward_fn_;
  std::vector<std::string> tied_param_names_;
};

// A position that uses the module shared under `key`. Every occurrence of a key
// must use a factory that builds the same module: the stage builds it once,
// from the first occurrence's factory, seeded with base_seed + (global index of
// the key's first occurrence in the whole list), so all stages' copies start
// identical. `key` must be a valid module name (non-empty, no '.').
// The spec's name defaults to `key`.
class TiedLayerSpec : public LayerSpec {
 public:
  TiedLayerSpec(std::string key, LayerFactory factory, TiedForwardFn forward_fn = nullptr,
                std::vector<std::string> tied_param_names = {});
};

// The layer at a tied position: runs the key's shared module (directly, or
// through the spec's TiedForwardFn). Holds the shared module without
// registering it, so its parameters appear once, under "tied.<key>.".
class TiedLayer : public LayerImpl {
 public:
  TiedLayer(std::string type_name, std::string key, Layer shared, TiedForwardFn forward_fn);
  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;
  const std::string& key() const { return key_; }
  const Layer& shared() const { return shared_; }

 private:
  std::string key_;
  Layer shared_;
  TiedForwardFn forward_fn_;
};

// forward_fn for an output projection through a tied weight: for every input
// tensor x returns x @ shared.<param>^T (the LM head over the embedding table).
TiedForwardFn TiedProjection(std::string param_name = "weight");

// Checks a spec list: non-empty, every factory set, tie keys valid module
// names. InvalidArgument names the offending index.
absl::Status ValidateSpecs(const std::vector<LayerSpec>& specs);

// For each tie key, the global indices of its positions in ascending order.
std::map<std::string, std::vector<int64_t>> TiePositions(const std::vector<LayerSpec>& specs);

// Runs `build(context)` with the default CPU generator seeded with
// `context.seed` (torch::manual_seed; `context.rng` is that generator) and
// restores the generator's previous state afterwards, so building a model
// leaves the caller's RNG stream as it was whatever the partition. Thread-safe:
// concurrent calls (ranks as threads) are serialized, each seeing its own seed.
Layer BuildSeeded(LayerContext context, const LayerFactory& build);

// The layer of spec `index` (a tied spec: its key's shared module, which the
// caller passes the index of the key's first occurrence for) built in
// `environment` with seed base_seed + index.
Layer BuildSpecLayer(const LayerSpec& spec, int64_t index, uint64_t base_seed,
                     const LayerEnvironment& environment = {});

// Number of elements of the trainable (requires_grad) parameters of `layer`,
// each tensor counted once even if registered under several names.
int64_t CountTrainableParameters(const torch::nn::Module& module);

// The trainable parameter count of spec `index`: the declared count if any,
// else the layer (for a tied spec: the shared module) is built in
// `environment`, counted and freed at once, so counting a whole list keeps at
// most one layer alive.
int64_t SpecParameterCount(const LayerSpec& spec, int64_t index, uint64_t base_seed,
                           const LayerEnvironment& environment = {});

// The message of an exception a factory or a layer threw: c10::Error's
// without its C++ backtrace, else what().
std::string ExceptionMessage(const std::exception& e);

}  // namespace pp

#endif  // PIPELINE_LAYERS_LAYER_SPEC_H_
