// The layer contract every model in pipe is written against.
//
// A layer maps an ordered list of tensors (Activations) plus the side inputs of
// the micro-batch being processed (MicroBatch: named tensors such as
// "attention_mask" or "labels") to Activations. Stages chain layers; the
// runtime ships Activations between stages. Adapters turn a plain LibTorch
// module of one tensor (torch::nn::Linear) or a parameter-free function (GELU,
// a reshape) into a layer.
//
// Next: pipeline/layers/layer_spec.h (how layers are described and built per stage).
#ifndef PIPELINE_LAYERS_LAYER_H_
#define PIPELINE_LAYERS_LAYER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace pp {

// What flows between layers and between stages.
using Activations = std::vector<torch::Tensor>;

// The side inputs of one micro-batch. Every stage that needs a side input reads
// it from the same deterministic source, so `id` lets the last stage check that
// its labels belong to the activations it received.
struct MicroBatch {
  int64_t id = -1;
  std::map<std::string, torch::Tensor> tensors;

  bool Has(const std::string& name) const { return tensors.count(name) > 0; }
  // Throws c10::Error naming `name` and the names present when it is missing.
  const torch::Tensor& Get(const std::string& name) const;
};

// A module with the layer signature. Subclasses implement Forward; TypeName is
// what `type:<regex>` partitioning and checkpoint policies match against.
// Not thread-safe (like any torch::nn::Module).
class LayerImpl : public torch::nn::Module {
 public:
  LayerImpl() = default;
  explicit LayerImpl(std::string type_name) : type_name_(std::move(type_name)) {}

  virtual Activations Forward(const Activations& inputs, const MicroBatch& batch) = 0;

  // Defaults to the C++ class name without namespaces and a trailing "Impl"
  // (torch::nn::LinearImpl -> "Linear"), unless given at construction.
  virtual std::string TypeName() const;

 private:
  std::string type_name_;
};

using Layer = std::shared_ptr<LayerImpl>;

// "torch::nn::LinearImpl" -> "Linear"; "pp::TransformerBlock" -> "TransformerBlock".
std::string ShortTypeName(const std::string& qualified_name);

// Adapter for a module that maps one tensor to one tensor. The wrapped module's
// parameters, buffers and submodules are registered directly on the layer, so
// a wrapped Linear's weight is named "weight", not "module.weight".
class ModuleLayer : public LayerImpl {
 public:
  // `type_name` defaults to the wrapped module's short type name.
  ModuleLayer(torch::nn::AnyModule module, std::string type_name = "");

  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;

  const torch::nn::AnyModule& module() const { return module_; }

 private:
  torch::nn::AnyModule module_;
};

// Wraps any LibTorch module holder (torch::nn::Linear, torch::nn::GELU, ...).
template <typename ModuleHolder>
Layer MakeModuleLayer(ModuleHolder module, std::string type_name = "") {
  return std::make_shared<ModuleLayer>(torch::nn::AnyModule(std::move(module)),
                                       std::move(type_name));
}

// Adapter for a parameter-free function of the whole payload and micro-batch.
class FunctionLayer : public LayerImpl {
 public:
  using Fn = std::function<Activations(const Activations&, const MicroBatch&)>;
  FunctionLayer(std::string type_name, Fn fn);

  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;

 private:
  Fn fn_;
};

// A parameter-free function of one tensor, e.g. MakeFunctionLayer("Gelu", torch::gelu).
Layer MakeFunctionLayer(std::string type_name,
                        std::function<torch::Tensor(const torch::Tensor&)> fn);
// A parameter-free function of the whole payload and the micro-batch.
Layer MakeFunctionLayer(std::string type_name, FunctionLayer::Fn fn);

// Runs `layers` one after another.
Activations RunLayers(const std::vector<Layer>& layers, Activations inputs,
                      const MicroBatch& batch);

// How a stage runs its local layers. RunLayers is the plain one; activation
// checkpointing (checkpoint/) supplies one that recomputes ranges in backward.
using LayerRunner = std::function<Activations(const std::vector<Layer>& layers, Activations inputs,
                                              const MicroBatch& batch)>;

}  // namespace pp

#endif  // PIPELINE_LAYERS_LAYER_H_
