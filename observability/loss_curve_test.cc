#include "observability/loss_curve.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace pp {
namespace {

namespace fs = std::filesystem;

int Occurrences(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A run directory under $TEST_TMPDIR whose metrics.jsonl holds `lines`.
std::string RunDir(const std::string& name, const std::string& lines) {
  const char* root = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(root != nullptr ? root : "/tmp") / ("loss_curve_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "metrics.jsonl") << lines;
  return dir.string();
}

TEST(LossCurvesSvgTest, OneLineAndEvalDotsPerRunWithFinalLossesInTheLegend) {
  const std::string svg =
      LossCurvesSvg("a <vs> b", {{.label = "fp32",
                                  .train = {{1, 5.0}, {2, 4.0}, {3, 3.0}, {4, 2.5}},
                                  .eval = {{2, 4.2}, {4, 2.9}}},
                                 {.label = "bf16",
                                  .train = {{1, 5.0}, {2, 4.1}, {3, 3.1}, {4, 2.6}},
                                  .eval = {{2, 4.3}, {4, 3.0}}}});
  EXPECT_EQ(Occurrences(svg, "<polyline"), 2);
  EXPECT_EQ(Occurrences(svg, "<circle"), 4);
  EXPECT_EQ(Occurrences(svg, "stroke-dasharray"), 1) << "the second run is dashed";
  EXPECT_TRUE(absl::StrContains(svg, ">a &lt;vs&gt; b</text>"));
  EXPECT_TRUE(absl::StrContains(svg, ">fp32: train 2.5000, eval 2.9000</text>"));
  EXPECT_TRUE(absl::StrContains(svg, ">bf16: train 2.6000, eval 3.0000</text>"));
  EXPECT_TRUE(absl::EndsWith(svg, "</svg>\n"));
}

TEST(LossCurvesSvgTest, NonFinitePointsAreLeftOutAndEmptyRunsGiveAnEmptyChart) {
  const std::string svg = LossCurvesSvg(
      "t", {{.label = "a", .train = {{1, 3.0}, {2, std::nan("")}, {3, 2.0}}, .eval = {}}});
  EXPECT_FALSE(absl::StrContains(svg, "nan"));
  EXPECT_TRUE(absl::StrContains(svg, ">a: train 2.0000, eval -</text>"));
  const std::string empty = LossCurvesSvg("nothing", {});
  EXPECT_TRUE(absl::StrContains(empty, ">nothing</text>"));
  EXPECT_EQ(Occurrences(empty, "<polyline"), 0);
}

TEST(LossCurveSvgTest, ASingleRunHasABlueLineOrangeDotsAndATrainEvalLegend) {
  const std::string svg = LossCurveSvg("run", {{1, 3.0}, {2, 2.0}}, {{2, 2.5}});
  EXPECT_EQ(Occurrences(svg, "<polyline fill=\"none\" stroke=\"#1f77b4\""), 1);
  EXPECT_EQ(Occurrences(svg, "fill=\"#ff7f0e\"/>"), 1);
  EXPECT_TRUE(absl::StrContains(svg, "text-anchor=\"end\">train</text>"));
  EXPECT_TRUE(absl::StrContains(svg, "text-anchor=\"end\">eval</text>"));
  EXPECT_FALSE(absl::StrContains(svg, ": train"));
}

TEST(ReadLossRunTest, ReadsTrainAndEvalLossesAndSkipsLinesWithoutAStep) {
  const std::string dir =
      RunDir("read",
             "{\"run\": \"header\"}\n{\"step\": 1, \"loss\": 4.5, \"lr\": 0.001}\n\n"
             "{\"step\": 2, \"loss\": 4.0, \"eval_loss\": 4.25}\n");
  const absl::StatusOr<LossRun> run = ReadLossRun("x", dir);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->label, "x");
  EXPECT_EQ(run->train, (LossPoints{{1, 4.5}, {2, 4.0}}));
  EXPECT_EQ(run->eval, (LossPoints{{2, 4.25}}));
}

TEST(ReadLossRunTest, AMissingFileAndALineThatIsNotAnObjectAreNamed) {
  const std::string empty = RunDir("empty", "");
  fs::remove(fs::path(empty) / "metrics.jsonl");
  const absl::StatusOr<LossRun> missing = ReadLossRun("fp32", empty);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "fp32")) << missing.status();
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "metrics.jsonl"));

  const absl::StatusOr<LossRun> bad = ReadLossRun("b", RunDir("bad", "{\"step\": 1}\n[1, 2\n"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "metrics.jsonl:2")) << bad.status();
}

}  // namespace
}  // namespace pp
