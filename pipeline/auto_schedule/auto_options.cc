#include "pipeline/auto_schedule/auto_options.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pp {

absl::StatusOr<std::string> AutoMeasurementSchedule(int chunks) {
  if (chunks == 1) return std::string("zb_h1");
  if (chunks == 2) return std::string("zbv");
  return absl::InvalidArgumentError(absl::StrCat(
      "parallelism.schedule 'auto' synthesises for parallelism.chunks 1 (looped, measured under "
      "zb_h1) or 2 (V placement, measured under zbv), got chunks=",
      chunks));
}

absl::StatusOr<std::string> StartingSchedule(const std::string& schedule, int chunks) {
  if (schedule != kAutoSchedule) return schedule;
  return AutoMeasurementSchedule(chunks);
}

absl::StatusOr<SimulationCosts> AutoFixedCosts(absl::string_view text, int num_stages,
                                               int num_chunks) {
  absl::StatusOr<SimulationCosts> parsed = ParseSimulationCosts(text);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.auto_costs '", text, "': ", parsed.status().message()));
  }
  SimulationCosts costs = *parsed;
  const double f = costs.forward;
  const double b = costs.backward;
  double i = costs.backward_input;
  double w = costs.backward_weight;
  if (f <= 0 || b <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.auto_costs '", text, "' needs F > 0 and B > 0 (or I and W > 0), got F ", f,
        " and B ", b, "; e.g. \"F:1,I:1,W:1\""));
  }
  if (i <= 0 || w <= 0 || std::abs(i + w - b) > 1e-9 * b) {
    // B given without its I and W (which keep their defaults): split in
    // halves, as a measured backward that was not split.
    i = b / 2;
    w = b / 2;
  }
  const double v = num_chunks;
  for (int s = 0; s < num_stages * num_chunks; ++s) {
    StageCosts sc;
    sc.forward = f / v;
    sc.backward_input = i / v;
    sc.backward_weight = w / v;
    sc.backward = (i + w) / v;
    costs.stage_costs[s] = sc;
  }
  costs.forward = f / v;
  costs.backward_input = i / v;
  costs.backward_weight = w / v;
  costs.backward = (i + w) / v;
  return costs;
}

}  // namespace pp
