// Loss curves as self-contained SVG line charts: the one SVG writer for them.
// A run writes its own chart at its end (loss.svg in the run directory,
// driver/run_report.h); `loss_curves` (loss_curves_main.cc) draws several runs'
// metrics.jsonl in one chart to compare them by eye.
#ifndef OBSERVABILITY_LOSS_CURVE_H_
#define OBSERVABILITY_LOSS_CURVE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pp {

using LossPoints = std::vector<std::pair<int64_t, double>>;  // (step, loss)

// One run's curve: its train loss per step and its eval losses.
struct LossRun {
  std::string label;  // the legend's name of the run
  LossPoints train;
  LossPoints eval;
};

// Every run's train loss as a line and its eval losses as dots in the run's
// colour (matplotlib's first colours; later runs dashed with open dots, so a
// curve drawn exactly over another still shows), with labelled axes over the
// runs' step and loss ranges and a legend giving each run's final train and
// eval loss. Non-finite points are left out; empty runs give an empty chart
// with its title.
std::string LossCurvesSvg(const std::string& title, const std::vector<LossRun>& runs);

// A single run's chart (loss.svg): the train line in blue and the eval dots
// in orange, legend "train" and "eval".
std::string LossCurveSvg(const std::string& title, const LossPoints& train, const LossPoints& eval);

// The train and eval losses of a run directory's metrics.jsonl (one JSON
// object a line, as the training binaries write it; a line without a "step"
// is skipped). NotFound naming the file when it is missing, InvalidArgument
// naming the line for one that is not a JSON object.
absl::StatusOr<LossRun> ReadLossRun(const std::string& label, const std::string& run_dir);

}  // namespace pp

#endif  // OBSERVABILITY_LOSS_CURVE_H_
