#include "pipeline/partition/balance.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pp {

absl::Status CheckEnoughLayers(int64_t num_layers, int64_t num_parts) {
  if (num_parts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("number of parts must be >= 1, got ", num_parts));
  }
  if (num_layers < num_parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot split ", num_layers, " layers into ", num_parts,
                     " parts: every part needs at least one layer (use at most ", num_layers,
                     " parts, e.g. fewer stages or chunks)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateBounds(const Bounds& bounds, int64_t num_layers, int64_t num_parts) {
  if (static_cast<int64_t>(bounds.size()) != num_parts + 1) {
    return absl::InvalidArgumentError(absl::StrCat("bounds [", absl::StrJoin(bounds, ","),
                                                   "] have ", bounds.size(), " entries; ",
                                                   num_parts, " parts need ", num_parts + 1));
  }
  if (bounds.front() != 0 || bounds.back() != num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("bounds [", absl::StrJoin(bounds, ","),
                     "] must start at 0 and end at the number of layers (", num_layers, ")"));
  }
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    if (bounds[s + 1] <= bounds[s]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bounds [", absl::StrJoin(bounds, ","), "] must be strictly increasing: part ", s, " = [",
          bounds[s], ", ", bounds[s + 1], ") has no layer"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Bounds> UniformBounds(int64_t num_layers, int64_t num_parts) {
  if (absl::Status s = CheckEnoughLayers(num_layers, num_parts); !s.ok()) return s;
  Bounds bounds(num_parts + 1, 0);
  const int64_t base = num_layers / num_parts;
  const int64_t extra = num_layers % num_parts;
  for (int64_t s = 0; s < num_parts; ++s) bounds[s + 1] = bounds[s] + base + (s < extra ? 1 : 0);
  return bounds;
}

std::vector<double> PartCosts(const std::vector<double>& costs, const Bounds& bounds) {
  std::vector<double> sums;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    double sum = 0;
    for (int64_t i = bounds[s]; i < bounds[s + 1]; ++i) sum += costs[i];
    sums.push_back(sum);
  }
  return sums;
}

// sqrt(DBL_MAX) is 1.34e154; a round bound below it.
constexpr double kMaxTotalCost = 1e154;

absl::StatusOr<Bounds> BalancedBounds(const std::vector<double>& costs, int64_t num_parts) {
  const int64_t n = static_cast<int64_t>(costs.size());
  if (absl::Status s = CheckEnoughLayers(n, num_parts); !s.ok()) return s;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(costs[i]) || costs[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cost of layer ", i, " is ", costs[i], "; costs must be finite and >= 0"));
    }
  }
  // Pass 2 sums squared part costs: the total's square must stay finite
  // (costs near 1e154 would overflow to inf and lose the optimum).
  double total = 0;
  for (double c : costs) total += c;
  if (!(total < kMaxTotalCost)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "costs sum to ", total, "; the balancer squares part costs, so the sum must be below ",
        kMaxTotalCost, " (scale the costs down)"));
  }
  const int64_t p = num_parts;
  // prefix[i] = cost of layers [0, i). Every segment cost is computed as one
  // difference of prefixes, so both passes see bit-identical segment costs.
  std::vector<double> prefix(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  auto seg = [&](int64_t j, int64_t i) { return prefix[i] - prefix[j]; };
  constexpr double kInf = std::numeric_limits<double>::infinity();

  // Pass 1: best[k][j] = the smallest possible heaviest part when layers
  // [j, n) are split into k non-empty parts.
  std::vector<std::vector<double>> best(p + 1, std::vector<double>(n + 1, kInf));
  for (int64_t j = 0; j < n; ++j) best[1][j] = seg(j, n);
  for (int64_t k = 2; k <= p; ++k) {
    for (int64_t j = 0; j + k <= n; ++j) {
      double value = kInf;
      for (int64_t i = j + 1; i + (k - 1) <= n; ++i) {
        const double first = seg(j, i);
        if (first >= value) break;  // Costs are >= 0: longer first parts only get heavier.
        value = std::min(value, std::max(first, best[k - 1][i]));
      }
      best[k][j] = value;
    }
  }
  const double limit = best[p][0];

  // Pass 2: among splits whose parts all cost <= limit, the smallest sum of
  // squared part costs.
  std::vector<std::vector<double>> squares(p + 1, std::vector<double>(n + 1, kInf));
  for (int64_t j = 0; j < n; ++j) {
    const double c = seg(j, n);
    if (c <= limit) squares[1][j] = c * c;
  }
  for (int64_t k = 2; k <= p; ++k) {
    for (int64_t j = 0; j + k <= n; ++j) {
      double value = kInf;
      for (int64_t i = j + 1; i + (k - 1) <= n; ++i) {
        const double c = seg(j, i);
        if (c > limit) break;
        value = std::min(value, c * c + squares[k - 1][i]);
      }
      squares[k][j] = value;
    }
  }

  // Reconstruct from the front, taking the latest cut that keeps the optimum.
  Bounds bounds = {0};
  int64_t j = 0;
  for (int64_t k = p; k >= 2; --k) {
    int64_t chosen = -1;
    for (int64_t i = n - (k - 1); i > j; --i) {
      const double c = seg(j, i);
      if (c > limit || squares[k - 1][i] == kInf) continue;
      if (c * c + squares[k - 1][i] == squares[k][j]) {
        chosen = i;
        break;
      }
    }
    if (chosen < 0) {
      return absl::InternalError("balanced partition: reconstruction found no cut (a bug)");
    }
    bounds.push_back(chosen);
    j = chosen;
  }
  bounds.push_back(n);
  return bounds;
}

}  // namespace pp
