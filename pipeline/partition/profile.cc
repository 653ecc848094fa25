// `profile`: time forward + backward of each layer on the request's sample
// micro-batch (one warm-up, then the median of profile_repeats runs) and
// balance the times. Layers are built one at a time, run on the previous
// layer's (detached) output and freed; tied modules are built once per key.
// With "profile:cap_mib=N" the split also keeps each part's memory (measured
// per layer by layer_memory.h: parameters x (1 + gradient + optimizer states)
// + kept activation bytes x the part's micro-batches in flight) within N MiB
// (balance.h's MemoryBoundedBounds); plain "profile" is unchanged.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "pipeline/partition/layer_memory.h"
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

// The optional argument: "cap_mib=N[,in_flight=A/B/...][,optimizer=adamw|momentum|sgd]".
struct ProfileMemoryCap {
  double cap_mib = 0;  // 0: no cap
  std::vector<double> in_flight;
  double state_factor = 2;  // fp32 optimizer states per parameter (AdamW)
};

absl::StatusOr<ProfileMemoryCap> ParseProfileArgument(const std::string& argument) {
  ProfileMemoryCap cap;
  if (argument.empty()) return cap;
  const std::string valid =
      "valid: 'profile' or 'profile:cap_mib=N[,in_flight=A/B/...][,optimizer=adamw|momentum|sgd]'";
  for (absl::string_view item : absl::StrSplit(argument, ',')) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.first == "cap_mib") {
      if (!absl::SimpleAtod(kv.second, &cap.cap_mib) || !std::isfinite(cap.cap_mib) ||
          cap.cap_mib <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "partition method 'profile': cap_mib must be a number > 0, got '", kv.second, "'"));
      }
    } else if (kv.first == "in_flight") {
      for (absl::string_view v : absl::StrSplit(kv.second, '/')) {
        double count = 0;
        if (!absl::SimpleAtod(v, &count) || !std::isfinite(count) || count < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("partition method 'profile': in_flight needs '/'-separated counts >= "
                           "0 (one per part), got '",
                           kv.second, "'"));
        }
        cap.in_flight.push_back(count);
      }
    } else if (kv.first == "optimizer") {
      if (kv.second == "adamw") {
        cap.state_factor = 2;
      } else if (kv.second == "momentum") {
        cap.state_factor = 1;
      } else if (kv.second == "sgd") {
        cap.state_factor = 0;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("partition method 'profile': unknown optimizer '", kv.second,
                         "'; valid: adamw, momentum, sgd"));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("partition method 'profile': unknown argument '", item, "'; ", valid));
    }
  }
  if (cap.cap_mib == 0) {
    return absl::InvalidArgumentError(absl::StrCat("partition method 'profile': argument '",
                                                   argument, "' sets no cap_mib; ", valid));
  }
  return cap;
}

absl::StatusOr<Bounds> PartitionByProfile(const PartitionRequest& request) {
  absl::StatusOr<ProfileMemoryCap> cap = ParseProfileArgument(request.argument);
  if (!cap.ok()) return cap.status();
  if (cap->cap_mib > 0 && cap->in_flight.empty()) cap->in_flight = request.part_in_flight;
  if (cap->cap_mib > 0 && static_cast<int64_t>(cap->in_flight.size()) != request.num_parts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "partition method 'profile' with a memory cap needs the micro-batches in flight of each "
        "of the ",
        request.num_parts,
        " parts (in_flight=A/B/... or PartitionRequest::part_in_flight, e.g. "
        "1F1B's p - s), got ",
        cap->in_flight.size()));
  }
  if (request.check_only) {  // one layer per part, the rest on the last
    Bounds bounds;
    for (int64_t i = 0; i < request.num_parts; ++i) bounds.push_back(i);
    bounds.push_back(static_cast<int64_t>(request.specs->size()));
    return bounds;
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
  Activations inputs = internal_partition::DetachForNextLayer(request.sample_inputs);
  for (size_t i = 0; i < specs.size(); ++i) {
    const LayerSpec& spec = specs[i];
    try {
      Layer layer = internal_partition::BuildForProfiling(specs, i, request.base_seed,
                                                          tie_positions, &shared);
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
      inputs = internal_partition::DetachForNextLayer(outputs);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("profiling layer ", i, " ('", spec.name(),
                                                     "') failed: ", ExceptionMessage(e)));
    }
  }
  if (cap->cap_mib == 0) return BalancedBounds(costs, request.num_parts);
  absl::StatusOr<std::vector<LayerMemory>> measured =
      MeasureLayerMemory(specs, request.sample_inputs, request.sample_batch, request.base_seed);
  if (!measured.ok()) return measured.status();
  // Parameters + gradients + optimizer state count once per part; the bytes
  // a forward keeps count once per micro-batch in flight.
  PartMemory memory;
  memory.in_flight = cap->in_flight;
  memory.cap_bytes = cap->cap_mib * 1024 * 1024;
  for (const LayerMemory& layer : *measured) {
    memory.fixed_bytes.push_back(static_cast<double>(layer.parameter_bytes) *
                                 (2 + cap->state_factor));
    memory.activation_bytes.push_back(static_cast<double>(layer.activation_bytes));
  }
  return MemoryBoundedBounds(costs, request.num_parts, memory);
}

}  // namespace

PP_REGISTER_PARTITIONER("profile",
                        "balance measured forward+backward time per layer on a sample micro-batch; "
                        "profile:cap_mib=N[,in_flight=A/B/...][,optimizer=adamw|momentum|sgd] "
                        "keeps each part's measured parameters/state + activations x in-flight "
                        "micro-batches within N MiB",
                        &PartitionByProfile);

}  // namespace pp
