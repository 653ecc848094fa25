// `profile`: time forward + backward of each layer on the request's sample
// micro-batch (one warm-up, then the median of profile_repeats runs) and
// balance the times. Layers are built one at a time, run on the previous
// layer's (detached) output and freed; tied modules are built once per key.
#include <algorithm>
#include <chrono>
#include <map>

#include "absl/strings/str_cat.h"
#include "pipeline/partition/partitioner.h"

namespace pp {
namespace {

// Sum of every floating-point output that requires grad; undefined if none.
torch::Tensor BackwardTarget(const Activations& outputs) {
  torch::Tensor total;
  for (const torch::Tensor& t : outputs) {
    if (!t.defined() || !t.is_floating_point() || !t.requires_grad()) continue;
    torch::Tensor s = t.sum();
    total = total.defined() ? total + s : s;
  }
  return total;
}

Activations DetachForNextLayer(const Activations& outputs) {
  Activations next;
  for (const torch::Tensor& t : outputs) {
    torch::Tensor d = t.defined() ? t.detach() : t;
    if (d.defined() && d.is_floating_point()) d.requires_grad_(true);
    next.push_back(d);
  }
  return next;
}

absl::StatusOr<Bounds> PartitionByProfile(const PartitionRequest& request) {
  if (!request.argument.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition method 'profile' takes no argument, got '", request.argument, "'"));
  }
  // A first layer may read everything from the micro-batch (a GPT's token ids
  // in batch.tensors["input_ids"], no input activations): either will do.
  if (request.sample_inputs.empty() && request.sample_batch.tensors.empty()) {
    return absl::InvalidArgumentError(
        "partition method 'profile' needs sample inputs or a sample micro-batch "
        "(PartitionRequest::sample_inputs / sample_batch, PipelineModelOptions::sample_inputs / "
        "sample_batch) for the first layer; both are empty");
  }
  if (request.profile_repeats < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile_repeats must be >= 1, got ", request.profile_repeats));
  }
  const std::vector<LayerSpec>& specs = *request.specs;
  const std::map<std::string, std::vector<int64_t>> tie_positions = TiePositions(specs);
  std::map<std::string, Layer> shared;
  std::vector<double> costs(specs.size());
  Activations inputs = DetachForNextLayer(request.sample_inputs);
  for (size_t i = 0; i < specs.size(); ++i) {
    const LayerSpec& spec = specs[i];
    try {
      Layer layer;
      if (spec.is_tied()) {
        Layer& module = shared[spec.tie_key()];
        if (module == nullptr) {
          const int64_t first = tie_positions.at(spec.tie_key()).front();
          module = BuildSeeded(request.base_seed + first, specs[first].factory());
        }
        layer = std::make_shared<TiedLayer>(spec.name(), spec.tie_key(), module,
                                            spec.tied_forward_fn());
      } else {
        layer = BuildSeeded(request.base_seed + i, spec.factory());
      }
      Activations outputs;
      auto run_once = [&] {
        outputs = layer->Forward(inputs, request.sample_batch);
        torch::Tensor target = BackwardTarget(outputs);
        if (target.defined()) target.backward();
      };
      run_once();  // Warm-up: first-call allocations and lazy initialisation.
      std::vector<double> times;
      for (int r = 0; r < request.profile_repeats; ++r) {
        const auto start = std::chrono::steady_clock::now();
        run_once();
        times.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count());
      }
      std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
      costs[i] = times[times.size() / 2];
      inputs = DetachForNextLayer(outputs);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("profiling layer ", i, " ('", spec.name(),
                                                     "') failed: ", ExceptionMessage(e)));
    }
  }
  return BalancedBounds(costs, request.num_parts);
}

}  // namespace

PP_REGISTER_PARTITIONER("profile",
                        "balance measured forward+backward time per layer on a sample micro-batch",
                        &PartitionByProfile);

}  // namespace pp
