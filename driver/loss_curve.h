// A self-contained SVG line chart of training (and evaluation) loss per step,
// written at the end of a run (loss.svg in the run directory).
#ifndef DRIVER_LOSS_CURVE_H_
#define DRIVER_LOSS_CURVE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pp {

using LossPoints = std::vector<std::pair<int64_t, double>>;  // (step, loss)

// Train loss as a blue line, eval loss as orange dots, labelled axes with the
// step and loss ranges. Empty series are fine (an empty chart with its title).
std::string LossCurveSvg(const std::string& title, const LossPoints& train, const LossPoints& eval);

}  // namespace pp

#endif  // DRIVER_LOSS_CURVE_H_
