// Pure partition arithmetic: bounds validation, uniform splits and the min-max
// optimal balancer that the cost-based partitioners share. No LibTorch.
//
// Balancing rule (deterministic): first, the heaviest part is as light as
// possible (exact min-max, unlike DeepSpeed's max-min heuristic). Among the
// partitions that reach that optimum, the one with the smallest sum of squared
// part costs (the most even). Remaining ties go to the latest cuts, compared
// from the first cut on: earlier parts are filled as much as possible. So
// [0,1,2,3,3,3] into 4 gives [0,3,4,5,6] and ten equal costs into 4 give
// [0,3,6,8,10], the same as `uniform`.
#ifndef PIPELINE_PARTITION_BALANCE_H_
#define PIPELINE_PARTITION_BALANCE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pp {

// bounds[s] .. bounds[s+1] is part s; bounds.front() == 0, bounds.back() == #layers.
using Bounds = std::vector<int64_t>;

// OK iff bounds has num_parts + 1 strictly increasing entries from 0 to num_layers.
absl::Status ValidateBounds(const Bounds& bounds, int64_t num_layers, int64_t num_parts);

// InvalidArgument naming both numbers when num_layers < num_parts or num_parts < 1.
absl::Status CheckEnoughLayers(int64_t num_layers, int64_t num_parts);

// Equal counts; the first num_layers % num_parts parts get one more layer.
absl::StatusOr<Bounds> UniformBounds(int64_t num_layers, int64_t num_parts);

// The balancing rule in the file comment. Costs must be finite and >= 0.
// O(n^2 p) time, O(n p) memory.
absl::StatusOr<Bounds> BalancedBounds(const std::vector<double>& costs, int64_t num_parts);

// Memory of each part for MemoryBoundedBounds: part s owning layers L takes
// sum(fixed_bytes[L]) + sum(activation_bytes[L]) * in_flight[s] bytes
// (parameters, gradients and optimizer state, plus one micro-batch's saved
// activations times the micro-batches in flight on that part under the
// schedule, e.g. 1F1B's p - s). Bytes as doubles: only sums and compares.
struct PartMemory {
  std::vector<double> fixed_bytes;       // per layer
  std::vector<double> activation_bytes;  // per layer, one micro-batch
  std::vector<double> in_flight;         // per part
  double cap_bytes = 0;                  // per part (each part on its own rank)
};

// The balancing rule among the splits whose every part fits memory.cap_bytes:
// where the cap binds, the heaviest part is as light as the cap allows.
// InvalidArgument for bad sizes or values, or, when no split fits, naming the
// parts of the time-balanced split over the cap with their bytes and terms.
absl::StatusOr<Bounds> MemoryBoundedBounds(const std::vector<double>& costs, int64_t num_parts,
                                           const PartMemory& memory);

// Bytes of each part under `memory` (sizes as MemoryBoundedBounds checks).
std::vector<double> PartBytes(const PartMemory& memory, const Bounds& bounds);

// Sum of costs in each part.
std::vector<double> PartCosts(const std::vector<double>& costs, const Bounds& bounds);

}  // namespace pp

#endif  // PIPELINE_PARTITION_BALANCE_H_
