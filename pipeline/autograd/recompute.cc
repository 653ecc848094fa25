#include "pipeline/autograd/recompute.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include "common/default_generator.h"
#include "pipeline/autograd/split_backward.h"
#include "pipeline/layers/layer_spec.h"

namespace pp {

RngSnapshot RngSnapshot::Capture(const std::vector<c10::Device>& devices) {
  RngSnapshot snapshot;
  std::vector<at::Generator> generators = {at::detail::getDefaultCPUGenerator()};
  std::vector<c10::Device> seen;
  for (const c10::Device& device : devices) {
    // CPU is always included; each accelerator device has its own generator.
    if (device.is_cpu()) continue;
    // A LibTorch or a machine without CUDA never has a CUDA tensor, so this
    // runtime check keeps CUDA code paths out of CPU runs without an #ifdef.
    if (device.is_cuda() && !at::globalContext().hasCUDA()) continue;
    c10::Device resolved(device.type(), device.has_index() ? device.index() : 0);
    if (std::find(seen.begin(), seen.end(), resolved) != seen.end()) continue;
    seen.push_back(resolved);
    generators.push_back(at::globalContext().defaultGenerator(resolved));
  }
  snapshot.devices_.push_back(c10::Device(c10::DeviceType::CPU));
  snapshot.devices_.insert(snapshot.devices_.end(), seen.begin(), seen.end());
  // Not in the middle of another thread's seeded build (default_generator.h).
  std::lock_guard<std::recursive_mutex> process_lock(DefaultGeneratorMutex());
  for (at::Generator& gen : generators) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    snapshot.entries_.push_back({gen, gen.get_state()});
  }
  return snapshot;
}

void RngSnapshot::Restore() const {
  std::lock_guard<std::recursive_mutex> process_lock(DefaultGeneratorMutex());
  for (const Entry& entry : entries_) {
    at::Generator gen = entry.generator;
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(entry.state);
  }
}

std::vector<c10::Device> AcceleratorDevicesOf(const std::vector<torch::Tensor>& tensors) {
  std::vector<c10::Device> devices;
  for (const torch::Tensor& t : tensors) {
    if (!t.defined() || t.device().is_cpu()) continue;
    if (std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}

std::vector<torch::Tensor> LayerParameters(const LayerImpl& layer) {
  std::vector<torch::Tensor> params = layer.parameters();
  if (const auto* tied = dynamic_cast<const TiedLayer*>(&layer)) {
    for (const torch::Tensor& p : tied->shared()->parameters()) {
      const bool known = std::any_of(params.begin(), params.end(),
                                     [&](const torch::Tensor& q) { return q.is_same(p); });
      if (!known) params.push_back(p);
    }
  }
  return params;
}

namespace internal_checkpoint {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool IsDifferentiable(const torch::Tensor& t) {
  return t.defined() && (t.is_floating_point() || t.is_complex());
}

// Everything the recompute needs besides the saved input tensors. Held by the
// autograd node (as a capsule in saved_data), so it lives as long as the graph.
struct RecomputeRange : torch::CustomClassHolder {
  std::vector<Layer> layers;
  // Side inputs; the ones that require grad are replaced by detached copies at
  // recompute time (they are also inputs of the node).
  MicroBatch batch;
  // The node's tensor inputs are [activations..., parameters..., side inputs
  // that require grad...], in this order.
  size_t num_activations = 0;
  std::vector<torch::Tensor> parameters;
  std::vector<std::string> grad_side_inputs;
  std::vector<c10::Device> devices;
  RngSnapshot forward_rng;
  // Split backward (pipeline/autograd/split_backward.h): the input pass
  // recomputes the range once and keeps the weight half of its backward here;
  // the weight pass runs it instead of recomputing again.
  std::optional<WeightGradTask> pending_weight;
};

// Puts the outer code's generator state back even if the recompute throws.
class RestoreOnExit {
 public:
  explicit RestoreOnExit(RngSnapshot snapshot) : snapshot_(std::move(snapshot)) {}
  ~RestoreOnExit() { snapshot_.Restore(); }
  RestoreOnExit(const RestoreOnExit&) = delete;
  RestoreOnExit& operator=(const RestoreOnExit&) = delete;

 private:
  RngSnapshot snapshot_;
};

std::string TypeNames(const std::vector<Layer>& layers) {
  std::string names;
  for (const Layer& layer : layers) names += (names.empty() ? "" : ", ") + layer->TypeName();
  return names;
}

// A leaf of the recomputed graph that is not an input of the node would get no
// gradient (the engine only hands the node's inputs on). Walks the recomputed
// graph and fails naming the range rather than silently dropping it.
void CheckEveryLeafIsAnInput(const variable_list& roots, const RecomputeRange& range,
                             const Activations& inputs, const MicroBatch& batch) {
  std::unordered_set<const c10::TensorImpl*> known;
  for (const torch::Tensor& t : inputs) known.insert(t.unsafeGetTensorImpl());
  for (const torch::Tensor& t : range.parameters) known.insert(t.unsafeGetTensorImpl());
  for (const auto& [name, t] : batch.tensors) known.insert(t.unsafeGetTensorImpl());
  std::unordered_set<const torch::autograd::Node*> visited;
  std::vector<torch::autograd::Node*> stack;
  for (const torch::Tensor& root : roots) {
    if (root.grad_fn() != nullptr) stack.push_back(root.grad_fn().get());
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!visited.insert(node).second) continue;
    if (auto* leaf = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      TORCH_CHECK(known.count(leaf->variable.unsafeGetTensorImpl()) > 0,
                  "a checkpointed range of layers [", TypeNames(range.layers),
                  "] uses a tensor of shape ", leaf->variable.sizes(),
                  " that requires grad but is neither a parameter of its layers (see "
                  "LayerParameters), an input, nor a side input; its gradient would be lost. "
                  "Register it as a parameter, or do not checkpoint this range.");
      continue;
    }
    for (const torch::autograd::Edge& edge : node->next_edges()) {
      if (edge.function != nullptr) stack.push_back(edge.function.get());
    }
  }
}

struct RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
  // `tensors` = activations, parameters, grad-requiring side inputs (see
  // RecomputeRange). Runs under no_grad (Function::apply turns grad mode off),
  // so the layers' intermediate results are freed as soon as they are used.
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<RecomputeRange> range,
                               at::TensorList tensors) {
    range->forward_rng = RngSnapshot::Capture(range->devices);
    Activations inputs(tensors.begin(), tensors.begin() + range->num_activations);
    Activations outputs = RunLayers(range->layers, inputs, range->batch);
    ctx->save_for_backward(inputs);
    ctx->set_materialize_grads(false);
    ctx->saved_data["range"] = c10::IValue::make_capsule(std::move(range));
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto range =
        c10::static_intrusive_pointer_cast<RecomputeRange>(ctx->saved_data["range"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    const size_t num_activations = range->num_activations;
    const size_t num_params = range->parameters.size();
    // Index 0 of what we return belongs to the non-tensor `range` argument.
    variable_list result(1 + num_activations + num_params + range->grad_side_inputs.size());
    // Gradients the engine wants, as (tensor to differentiate, slot in result).
    std::vector<std::pair<torch::Tensor, size_t>> wanted;

    // The recompute starts from detached inputs, so its graph ends here and the
    // engine (not us) continues into whatever produced the inputs.
    Activations inputs;
    inputs.reserve(num_activations);
    for (size_t i = 0; i < num_activations; ++i) {
      torch::Tensor input = saved[i].detach();
      if (IsDifferentiable(input) && ctx->needs_input_grad(i)) {
        input.requires_grad_(true);
        wanted.emplace_back(input, 1 + i);
      }
      inputs.push_back(std::move(input));
    }
    // Parameters that require grad but are not asked for now: the input half
    // of a split backward (I). Asked for with no activation: its weight half (W).
    bool params_deferred = false;
    std::vector<std::pair<torch::Tensor, size_t>> wanted_params;
    for (size_t k = 0; k < num_params; ++k) {
      if (ctx->needs_input_grad(num_activations + k)) {
        wanted_params.emplace_back(range->parameters[k], 1 + num_activations + k);
      } else if (range->parameters[k].requires_grad()) {
        params_deferred = true;
      }
    }
    if (range->pending_weight.has_value()) {
      // The weight pass of a split backward: the graph recomputed by the input
      // pass is still there; only its weight half runs.
      WeightGradTask task = std::move(*range->pending_weight);
      range->pending_weight.reset();
      TORCH_CHECK(wanted.empty(),
                  "a checkpointed range's split backward was asked for input "
                  "gradients again after its input pass");
      for (size_t s = 0; s < range->grad_side_inputs.size(); ++s) {
        TORCH_CHECK(!ctx->needs_input_grad(num_activations + num_params + s),
                    "a checkpointed range's split backward was asked for the gradient of side "
                    "input '",
                    range->grad_side_inputs[s], "' in its weight pass");
      }
      std::vector<torch::Tensor> targets;
      for (const auto& [tensor, slot] : wanted_params) targets.push_back(tensor);
      std::vector<torch::Tensor> grads = task.Run(targets);
      for (size_t w = 0; w < wanted_params.size(); ++w) {
        result[wanted_params[w].second] = std::move(grads[w]);
      }
      return result;
    }
    wanted.insert(wanted.end(), wanted_params.begin(), wanted_params.end());
    MicroBatch batch = range->batch;
    for (size_t s = 0; s < range->grad_side_inputs.size(); ++s) {
      torch::Tensor& side = batch.tensors[range->grad_side_inputs[s]];
      side = side.detach();
      const size_t edge = num_activations + num_params + s;
      if (ctx->needs_input_grad(edge)) {
        side.requires_grad_(true);
        wanted.emplace_back(side, 1 + edge);
      }
    }
    if (wanted.empty()) return result;

    // The engine runs backward with grad mode on only for create_graph; keep
    // that so a double backward through the range works.
    const bool create_graph = torch::GradMode::is_enabled();
    Activations outputs;
    {
      RestoreOnExit restore_outer(RngSnapshot::Capture(range->devices));
      range->forward_rng.Restore();
      torch::AutoGradMode enable_grad(true);
      outputs = RunLayers(range->layers, inputs, batch);
    }
    TORCH_CHECK(outputs.size() == grad_outputs.size(), "checkpointed range returned ",
                outputs.size(), " tensors on recompute but ", grad_outputs.size(),
                " in forward; its layers must be deterministic");

    variable_list roots, root_grads;
    for (size_t j = 0; j < outputs.size(); ++j) {
      if (grad_outputs[j].defined() && outputs[j].requires_grad()) {
        roots.push_back(outputs[j]);
        root_grads.push_back(grad_outputs[j]);
      }
    }
    if (roots.empty()) return result;
    CheckEveryLeafIsAnInput(roots, *range, inputs, batch);
    // Ranges with side inputs that require grad take the general path below
    // (correct, but the weight pass recomputes again).
    if (params_deferred && wanted_params.empty() && !create_graph &&
        range->grad_side_inputs.empty()) {
      // The input pass of a split backward: input gradients now, the weight
      // half kept for the weight pass (recompute once, not twice).
      variable_list targets;
      for (const auto& [tensor, slot] : wanted) targets.push_back(tensor);
      BackwardInputResult split = BackwardInput(roots, root_grads, targets);
      for (size_t w = 0; w < wanted.size(); ++w) {
        result[wanted[w].second] = std::move(split.input_grads[w]);
      }
      if (!split.weight.empty()) range->pending_weight = std::move(split.weight);
      return result;
    }
    variable_list targets;
    targets.reserve(wanted.size());
    for (const auto& [tensor, slot] : wanted) targets.push_back(tensor);
    variable_list grads = torch::autograd::grad(roots, targets, root_grads,
                                                /*retain_graph=*/create_graph, create_graph,
                                                /*allow_unused=*/true);
    for (size_t w = 0; w < wanted.size(); ++w) result[wanted[w].second] = std::move(grads[w]);
    return result;
  }
};

}  // namespace
}  // namespace internal_checkpoint

Activations RunLayersWithRecompute(const std::vector<Layer>& layers, Activations inputs,
                                   const MicroBatch& batch) {
  using internal_checkpoint::RecomputeRange;
  if (!torch::GradMode::is_enabled()) return RunLayers(layers, std::move(inputs), batch);

  auto range = c10::make_intrusive<RecomputeRange>();
  range->layers = layers;
  range->batch = batch;
  range->num_activations = inputs.size();
  std::vector<torch::Tensor> tensors = inputs;
  bool any_requires_grad = false;
  for (const torch::Tensor& t : inputs) {
    TORCH_CHECK(t.defined(), "checkpointed range received an undefined input tensor");
    any_requires_grad |= t.requires_grad();
  }
  // Tied layers inside one range share parameters: list each tensor once.
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const Layer& layer : layers) {
    for (const torch::Tensor& p : LayerParameters(*layer)) {
      if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
      range->parameters.push_back(p);
      tensors.push_back(p);
      any_requires_grad = true;
    }
  }
  for (const auto& [name, side] : batch.tensors) {
    if (side.defined() && side.requires_grad()) {
      range->grad_side_inputs.push_back(name);
      tensors.push_back(side);
      any_requires_grad = true;
    }
  }
  // Nothing to differentiate: recomputing would only cost time.
  if (!any_requires_grad) return RunLayers(layers, std::move(inputs), batch);
  // Every device the range touches: its inputs, parameters and all side
  // inputs (labels, masks: their device is where the layers draw numbers too).
  std::vector<torch::Tensor> placed = tensors;
  for (const auto& [name, side] : batch.tensors) placed.push_back(side);
  range->devices = AcceleratorDevicesOf(placed);
  return internal_checkpoint::RecomputeFunction::apply(std::move(range), at::TensorList(tensors));
}

}  // namespace pp
