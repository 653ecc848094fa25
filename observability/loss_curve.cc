#include "observability/loss_curve.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/xml_escape.h"
#include "nlohmann/json.hpp"

namespace pp {
namespace {

constexpr double kWidth = 640, kHeight = 400, kLeft = 60, kRight = 20, kTop = 40, kBottom = 50;
constexpr const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c",
                                    "#d62728", "#9467bd", "#8c564b"};
constexpr int kNumColours = sizeof(kColours) / sizeof(kColours[0]);

// How a chart draws its runs: several runs share a colour per run; a single
// run's chart (loss.svg) gives eval its own colour and a two-line legend.
enum class Legend { kPerRun, kTrainAndEval };

// The runs' step and loss ranges over their finite points; never empty.
struct Ranges {
  int64_t min_step = 0, max_step = 1;
  double min_loss = 0, max_loss = 1;
};

Ranges RangesOf(const std::vector<LossRun>& runs) {
  Ranges r;
  bool first = true;
  for (const LossRun& run : runs) {
    for (const LossPoints* series : {&run.train, &run.eval}) {
      for (const auto& [step, loss] : *series) {
        if (!std::isfinite(loss)) continue;
        if (first) {
          r.min_step = r.max_step = step;
          r.min_loss = r.max_loss = loss;
          first = false;
        }
        r.min_step = std::min(r.min_step, step);
        r.max_step = std::max(r.max_step, step);
        r.min_loss = std::min(r.min_loss, loss);
        r.max_loss = std::max(r.max_loss, loss);
      }
    }
  }
  if (r.max_step == r.min_step) r.max_step = r.min_step + 1;
  if (r.max_loss - r.min_loss < 1e-9) r.max_loss = r.min_loss + 1;
  return r;
}

std::string FinalLoss(const LossPoints& points) {
  return points.empty() ? "-" : absl::StrFormat("%.4f", points.back().second);
}

std::string ChartSvg(const std::string& title, const std::vector<LossRun>& runs, Legend legend) {
  const Ranges r = RangesOf(runs);
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto x = [&](int64_t step) {
    return kLeft + plot_w * (step - r.min_step) / static_cast<double>(r.max_step - r.min_step);
  };
  auto y = [&](double loss) {
    return kTop + plot_h * (r.max_loss - loss) / (r.max_loss - r.min_loss);
  };

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
  for (const auto& [value, ypos] : {std::pair{r.max_loss, kTop + 4},
                                    {(r.max_loss + r.min_loss) / 2, kTop + plot_h / 2 + 4},
                                    {r.min_loss, kTop + plot_h + 4}}) {
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n",
                          kLeft - 5, ypos, value);
  }
  for (const auto& [step, xpos] : {std::pair{r.min_step, kLeft}, {r.max_step, kLeft + plot_w}}) {
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>\n",
                          xpos, kTop + plot_h + 18, step);
  }
  absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n",
                        kLeft + plot_w / 2, kHeight - 12);
  absl::StrAppendFormat(&svg,
                        "<text x=\"14\" y=\"%.1f\" transform=\"rotate(-90 14 %.1f)\" "
                        "text-anchor=\"middle\">loss</text>\n",
                        kTop + plot_h / 2, kTop + plot_h / 2);
  for (size_t i = 0; i < runs.size(); ++i) {
    const LossRun& run = runs[i];
    const char* colour = kColours[i % kNumColours];
    const char* eval_colour = legend == Legend::kTrainAndEval ? kColours[1] : colour;
    std::string points;
    for (const auto& [step, loss] : run.train) {
      if (std::isfinite(loss)) absl::StrAppendFormat(&points, "%.1f,%.1f ", x(step), y(loss));
    }
    absl::StrAppendFormat(
        &svg, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"%s\"/>\n",
        colour, i > 0 ? " stroke-dasharray=\"6 3\"" : "", points);
    for (const auto& [step, loss] : run.eval) {
      if (!std::isfinite(loss)) continue;
      if (i > 0) {
        absl::StrAppendFormat(&svg,
                              "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"none\" "
                              "stroke=\"%s\" stroke-width=\"1.5\"/>\n",
                              x(step), y(loss), eval_colour);
      } else {
        absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n",
                              x(step), y(loss), eval_colour);
      }
    }
    if (legend == Legend::kPerRun) {
      absl::StrAppendFormat(
          &svg, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\" text-anchor=\"end\">%s</text>\n",
          kLeft + plot_w, kTop + 12 + 16.0 * i, colour,
          XmlEscape(absl::StrCat(run.label, ": train ", FinalLoss(run.train), ", eval ",
                                 FinalLoss(run.eval))));
    }
  }
  if (legend == Legend::kTrainAndEval) {
    absl::StrAppendFormat(
        &svg,
        "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\" text-anchor=\"end\">train</text>\n"
        "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\" text-anchor=\"end\">eval</text>\n",
        kLeft + plot_w, kTop + 12, kColours[0], kLeft + plot_w, kTop + 28, kColours[1]);
  } else {
    absl::StrAppendFormat(&svg,
                          "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\" text-anchor=\"end\">line: "
                          "train loss per step; dots: eval loss</text>\n",
                          kLeft + plot_w, kTop + 12 + 16.0 * runs.size());
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace

std::string LossCurvesSvg(const std::string& title, const std::vector<LossRun>& runs) {
  return ChartSvg(title, runs, Legend::kPerRun);
}

std::string LossCurveSvg(const std::string& title, const LossPoints& train,
                         const LossPoints& eval) {
  return ChartSvg(title, {LossRun{.label = "", .train = train, .eval = eval}},
                  Legend::kTrainAndEval);
}

absl::StatusOr<LossRun> ReadLossRun(const std::string& label, const std::string& run_dir) {
  const std::string path = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  std::ifstream in(path);
  if (!std::filesystem::is_regular_file(path) || !in) {
    return absl::NotFoundError(
        absl::StrCat("run '", label, "': no metrics.jsonl in ", run_dir, " (", path, ")"));
  }
  LossRun run{.label = label};
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", number, ": not a JSON object: ", line.substr(0, 80)));
    }
    const auto step = record.find("step");
    if (step == record.end() || !step->is_number_integer()) continue;
    for (const auto& [field, series] : {std::pair{"loss", &run.train}, {"eval_loss", &run.eval}}) {
      const auto value = record.find(field);
      if (value != record.end() && value->is_number()) {
        series->emplace_back(step->get<int64_t>(), value->get<double>());
      }
    }
  }
  return run;
}

}  // namespace pp
