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

// Sum of costs in each part.
std::vector<double> PartCosts(const std::vector<double>& costs, const Bounds& bounds);

}  // namespace pp

#endif  // PIPELINE_PARTITION_BALANCE_H_
