#include "pipeline/partition/balance.h"

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>

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

namespace {

// fits(part, j, i): may part `part` own layers [j, i)? Must be monotone: if
// [j, i) does not fit, no longer [j, i') does (the DP stops there). Empty
// `fits` = everything fits.
using FitsFn = std::function<bool(int64_t part, int64_t j, int64_t i)>;

absl::Status CheckCosts(const std::vector<double>& costs) {
  for (size_t i = 0; i < costs.size(); ++i) {
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
  return absl::OkStatus();
}

// The balancing rule as two dynamic programs over "layers [j, n) in k parts"
// and a reconstruction. REQUIRES: CheckCosts passed and num_parts <= layers.
class Balancer {
 public:
  Balancer(const std::vector<double>& costs, int64_t num_parts, const FitsFn& fits)
      : n_(static_cast<int64_t>(costs.size())), p_(num_parts), fits_(fits), prefix_(n_ + 1, 0.0) {
    for (int64_t i = 0; i < n_; ++i) prefix_[i + 1] = prefix_[i] + costs[i];
  }

  // Pass 1: the smallest possible heaviest part; kInf when no split fits.
  double MinMaxPart() const {
    // best[k][j] = the smallest possible heaviest part when layers [j, n) are
    // split into k non-empty parts.
    std::vector<std::vector<double>> best(p_ + 1, std::vector<double>(n_ + 1, kInf));
    for (int64_t j = 0; j < n_; ++j) best[1][j] = Allowed(1, j, n_) ? Seg(j, n_) : kInf;
    for (int64_t k = 2; k <= p_; ++k) {
      for (int64_t j = 0; j + k <= n_; ++j) {
        double value = kInf;
        for (int64_t i = j + 1; i + (k - 1) <= n_; ++i) {
          const double first = Seg(j, i);
          if (first >= value) break;     // Costs are >= 0: longer first parts only get heavier.
          if (!Allowed(k, j, i)) break;  // Monotone: longer first parts do not fit either.
          value = std::min(value, std::max(first, best[k - 1][i]));
        }
        best[k][j] = value;
      }
    }
    return best[p_][0];
  }

  // Pass 2: squares[k][j] = among splits of [j, n) into k parts that all
  // cost <= limit, the smallest sum of squared part costs.
  std::vector<std::vector<double>> MinSquares(double limit) const {
    std::vector<std::vector<double>> squares(p_ + 1, std::vector<double>(n_ + 1, kInf));
    for (int64_t j = 0; j < n_; ++j) {
      const double c = Seg(j, n_);
      if (c <= limit && Allowed(1, j, n_)) squares[1][j] = c * c;
    }
    for (int64_t k = 2; k <= p_; ++k) {
      for (int64_t j = 0; j + k <= n_; ++j) {
        double value = kInf;
        for (int64_t i = j + 1; i + (k - 1) <= n_; ++i) {
          const double c = Seg(j, i);
          if (c > limit || !Allowed(k, j, i)) break;
          value = std::min(value, c * c + squares[k - 1][i]);
        }
        squares[k][j] = value;
      }
    }
    return squares;
  }

  // Reconstruct from the front, taking the latest cut that keeps the optimum.
  absl::StatusOr<Bounds> Reconstruct(double limit,
                                     const std::vector<std::vector<double>>& squares) const {
    Bounds bounds = {0};
    int64_t j = 0;
    for (int64_t k = p_; k >= 2; --k) {
      int64_t chosen = -1;
      for (int64_t i = n_ - (k - 1); i > j; --i) {
        const double c = Seg(j, i);
        if (c > limit || squares[k - 1][i] == kInf || !Allowed(k, j, i)) continue;
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
    bounds.push_back(n_);
    return bounds;
  }

  static constexpr double kInf = std::numeric_limits<double>::infinity();

 private:
  // Cost of layers [j, i). Every segment cost is one difference of prefixes,
  // so both passes see bit-identical segment costs.
  double Seg(int64_t j, int64_t i) const { return prefix_[i] - prefix_[j]; }

  // With k parts left for [j, n), the first of them is part p - k.
  bool Allowed(int64_t k, int64_t j, int64_t i) const { return !fits_ || fits_(p_ - k, j, i); }

  const int64_t n_;
  const int64_t p_;
  const FitsFn& fits_;
  std::vector<double> prefix_;  // prefix_[i] = cost of layers [0, i)
};

// The balancing rule over the splits that `fits` allows. nullopt (with an OK
// status) when no split fits.
absl::StatusOr<std::optional<Bounds>> Balance(const std::vector<double>& costs, int64_t num_parts,
                                              const FitsFn& fits) {
  if (absl::Status s = CheckEnoughLayers(static_cast<int64_t>(costs.size()), num_parts); !s.ok())
    return s;
  if (absl::Status s = CheckCosts(costs); !s.ok()) return s;
  const Balancer balancer(costs, num_parts, fits);
  const double limit = balancer.MinMaxPart();
  if (limit == Balancer::kInf) return std::optional<Bounds>();
  absl::StatusOr<Bounds> bounds = balancer.Reconstruct(limit, balancer.MinSquares(limit));
  if (!bounds.ok()) return bounds.status();
  return std::optional<Bounds>(*std::move(bounds));
}

}  // namespace

absl::StatusOr<Bounds> BalancedBounds(const std::vector<double>& costs, int64_t num_parts) {
  absl::StatusOr<std::optional<Bounds>> bounds = Balance(costs, num_parts, nullptr);
  if (!bounds.ok()) return bounds.status();
  if (!bounds->has_value()) return absl::InternalError("balanced partition: no split (a bug)");
  return **bounds;
}

std::vector<double> PartBytes(const PartMemory& memory, const Bounds& bounds) {
  std::vector<double> bytes;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    double fixed = 0, activations = 0;
    for (int64_t i = bounds[s]; i < bounds[s + 1]; ++i) {
      fixed += memory.fixed_bytes[i];
      activations += memory.activation_bytes[i];
    }
    bytes.push_back(fixed + activations * memory.in_flight[s]);
  }
  return bytes;
}

absl::StatusOr<Bounds> MemoryBoundedBounds(const std::vector<double>& costs, int64_t num_parts,
                                           const PartMemory& memory) {
  const int64_t n = static_cast<int64_t>(costs.size());
  if (static_cast<int64_t>(memory.fixed_bytes.size()) != n ||
      static_cast<int64_t>(memory.activation_bytes.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory-bounded partition: ", n, " layer costs but ", memory.fixed_bytes.size(),
        " fixed byte counts and ", memory.activation_bytes.size(),
        " activation byte counts; give one of each per layer"));
  }
  if (num_parts >= 1 && static_cast<int64_t>(memory.in_flight.size()) != num_parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory-bounded partition: ", memory.in_flight.size(),
                     " in-flight counts for ", num_parts, " parts; give one per part"));
  }
  auto check = [](const std::vector<double>& values, const char* what) -> absl::Status {
    for (size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i]) || values[i] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " ", i, " is ", values[i], "; must be finite and >= 0"));
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status s = check(memory.fixed_bytes, "fixed bytes of layer"); !s.ok()) return s;
  if (absl::Status s = check(memory.activation_bytes, "activation bytes of layer"); !s.ok()) {
    return s;
  }
  if (absl::Status s = check(memory.in_flight, "in-flight count of part"); !s.ok()) return s;
  if (!std::isfinite(memory.cap_bytes) || memory.cap_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory cap is ", memory.cap_bytes, " bytes; must be finite and > 0"));
  }
  std::vector<double> fixed_prefix(n + 1, 0.0), act_prefix(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    fixed_prefix[i + 1] = fixed_prefix[i] + memory.fixed_bytes[i];
    act_prefix[i + 1] = act_prefix[i] + memory.activation_bytes[i];
  }
  // Bytes only grow with the part's length, as Balance's `fits` must.
  auto fits = [&](int64_t part, int64_t j, int64_t i) {
    return (fixed_prefix[i] - fixed_prefix[j]) +
               (act_prefix[i] - act_prefix[j]) * memory.in_flight[part] <=
           memory.cap_bytes;
  };
  absl::StatusOr<std::optional<Bounds>> bounds = Balance(costs, num_parts, fits);
  if (!bounds.ok()) return bounds.status();
  if (bounds->has_value()) return **bounds;
  // Nothing fits: name the parts of the time-balanced split that break the cap.
  absl::StatusOr<Bounds> unbounded = BalancedBounds(costs, num_parts);
  if (!unbounded.ok()) return unbounded.status();
  const std::vector<double> bytes = PartBytes(memory, *unbounded);
  std::string over;
  for (size_t s = 0; s < bytes.size(); ++s) {
    if (bytes[s] <= memory.cap_bytes) continue;
    double fixed = 0, activations = 0;
    for (int64_t i = (*unbounded)[s]; i < (*unbounded)[s + 1]; ++i) {
      fixed += memory.fixed_bytes[i];
      activations += memory.activation_bytes[i];
    }
    absl::StrAppend(&over, over.empty() ? "" : "; ", "stage (part) ", s, " layers [",
                    (*unbounded)[s], ", ", (*unbounded)[s + 1], "): ", bytes[s], " bytes = ", fixed,
                    " parameters/state + ", activations, " activation bytes x ",
                    memory.in_flight[s], " micro-batches in flight");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "no split of ", n, " layers into ", num_parts, " parts keeps every part within the cap of ",
      memory.cap_bytes, " bytes; the time-balanced split [", absl::StrJoin(*unbounded, ","),
      "] has ", over,
      " (raise the cap, use more stages, fewer micro-batches in flight or activation "
      "checkpointing)"));
}

}  // namespace pp
