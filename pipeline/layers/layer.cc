#include "pipeline/layers/layer.h"

#include <sstream>

namespace pp {

const torch::Tensor& MicroBatch::Get(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    std::ostringstream present;
    for (const auto& [key, unused] : tensors) present << (present.tellp() ? ", " : "") << key;
    TORCH_CHECK(false, "micro-batch ", id, " has no side input '", name, "' (it has: [",
                present.str(), "])");
  }
  return it->second;
}

std::string ShortTypeName(const std::string& qualified_name) {
  std::string name = qualified_name;
  // Drop template arguments, then namespaces.
  if (auto lt = name.find('<'); lt != std::string::npos) name.resize(lt);
  if (auto colon = name.rfind("::"); colon != std::string::npos) name = name.substr(colon + 2);
  const std::string kImpl = "Impl";
  if (name.size() > kImpl.size() &&
      name.compare(name.size() - kImpl.size(), kImpl.size(), kImpl) == 0) {
    name.resize(name.size() - kImpl.size());
  }
  return name;
}

std::string LayerImpl::TypeName() const {
  return type_name_.empty() ? ShortTypeName(name()) : type_name_;
}

ModuleLayer::ModuleLayer(torch::nn::AnyModule module, std::string type_name)
    : LayerImpl(type_name.empty() ? ShortTypeName(module.ptr()->name()) : std::move(type_name)),
      module_(std::move(module)) {
  const std::shared_ptr<torch::nn::Module> inner = module_.ptr();
  for (const auto& item : inner->named_parameters(/*recurse=*/false)) {
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : inner->named_buffers(/*recurse=*/false)) {
    register_buffer(item.key(), item.value());
  }
  for (const auto& item : inner->named_children()) {
    register_module(item.key(), item.value());
  }
}

Activations ModuleLayer::Forward(const Activations& inputs, const MicroBatch& batch) {
  TORCH_CHECK(inputs.size() == 1, "layer ", TypeName(), " wraps a one-tensor module but received ",
              inputs.size(), " tensors");
  return {module_.forward(inputs[0])};
}

FunctionLayer::FunctionLayer(std::string type_name, Fn fn)
    : LayerImpl(std::move(type_name)), fn_(std::move(fn)) {}

Activations FunctionLayer::Forward(const Activations& inputs, const MicroBatch& batch) {
  return fn_(inputs, batch);
}

Layer MakeFunctionLayer(std::string type_name,
                        std::function<torch::Tensor(const torch::Tensor&)> fn) {
  return std::make_shared<FunctionLayer>(
      type_name, [fn = std::move(fn), type_name](const Activations& inputs, const MicroBatch&) {
        TORCH_CHECK(inputs.size() == 1, "layer ", type_name, " takes one tensor but received ",
                    inputs.size());
        return Activations{fn(inputs[0])};
      });
}

Layer MakeFunctionLayer(std::string type_name, FunctionLayer::Fn fn) {
  return std::make_shared<FunctionLayer>(std::move(type_name), std::move(fn));
}

Activations RunLayers(const std::vector<Layer>& layers, Activations inputs,
                      const MicroBatch& batch) {
  for (const Layer& layer : layers) inputs = layer->Forward(inputs, batch);
  return inputs;
}

}  // namespace pp
