#include "driver/loss_curve.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/xml_escape.h"

namespace pp {
namespace {

constexpr double kWidth = 640, kHeight = 400, kLeft = 60, kRight = 20, kTop = 40, kBottom = 50;

}  // namespace

std::string LossCurveSvg(const std::string& title, const LossPoints& train,
                         const LossPoints& eval) {
  int64_t min_step = 0, max_step = 1;
  double min_loss = 0, max_loss = 1;
  bool first = true;
  for (const LossPoints* series : {&train, &eval}) {
    for (const auto& [step, loss] : *series) {
      if (!std::isfinite(loss)) continue;
      if (first) {
        min_step = max_step = step;
        min_loss = max_loss = loss;
        first = false;
      }
      min_step = std::min(min_step, step);
      max_step = std::max(max_step, step);
      min_loss = std::min(min_loss, loss);
      max_loss = std::max(max_loss, loss);
    }
  }
  if (max_step == min_step) max_step = min_step + 1;
  if (max_loss - min_loss < 1e-9) max_loss = min_loss + 1;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto x = [&](int64_t step) {
    return kLeft + plot_w * (step - min_step) / static_cast<double>(max_step - min_step);
  };
  auto y = [&](double loss) { return kTop + plot_h * (max_loss - loss) / (max_loss - min_loss); };

  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      static_cast<int>(kWidth), static_cast<int>(kHeight));
  absl::StrAppendFormat(&svg, "<text x=\"%.0f\" y=\"24\" font-size=\"15\">%s</text>\n", kLeft,
                        XmlEscape(title));
  // Axes, with the ranges at their ends and a mid grid line.
  absl::StrAppendFormat(&svg,
                        "<path d=\"M%.1f %.1f V%.1f H%.1f\" stroke=\"black\" fill=\"none\"/>\n"
                        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                        kLeft, kTop, kTop + plot_h, kLeft + plot_w, kLeft, kTop + plot_h / 2,
                        kLeft + plot_w, kTop + plot_h / 2);
  absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n",
                        kLeft - 5, kTop + 4, max_loss);
  absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n",
                        kLeft - 5, kTop + plot_h / 2 + 4, (max_loss + min_loss) / 2);
  absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n",
                        kLeft - 5, kTop + plot_h + 4, min_loss);
  absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>\n",
                        kLeft, kTop + plot_h + 18, min_step);
  absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>\n",
                        kLeft + plot_w, kTop + plot_h + 18, max_step);
  absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n",
                        kLeft + plot_w / 2, kHeight - 12);
  absl::StrAppendFormat(&svg,
                        "<text x=\"14\" y=\"%.1f\" transform=\"rotate(-90 14 %.1f)\" "
                        "text-anchor=\"middle\">loss</text>\n",
                        kTop + plot_h / 2, kTop + plot_h / 2);
  std::string points;
  for (const auto& [step, loss] : train) {
    if (std::isfinite(loss)) absl::StrAppendFormat(&points, "%.1f,%.1f ", x(step), y(loss));
  }
  absl::StrAppendFormat(
      &svg, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"%s\"/>\n",
      points);
  for (const auto& [step, loss] : eval) {
    if (std::isfinite(loss)) {
      absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#ff7f0e\"/>\n",
                            x(step), y(loss));
    }
  }
  absl::StrAppendFormat(
      &svg,
      "<text x=\"%.1f\" y=\"%.1f\" fill=\"#1f77b4\" text-anchor=\"end\">train</text>\n"
      "<text x=\"%.1f\" y=\"%.1f\" fill=\"#ff7f0e\" text-anchor=\"end\">eval</text>\n</svg>\n",
      kLeft + plot_w, kTop + 12, kLeft + plot_w, kTop + 28);
  return svg;
}

}  // namespace pp
