#include "pipeline/schedule/formats/render.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pipeline/schedule/analysis/validator.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

using ::testing::HasSubstr;

SimulationResult Sim(const std::string& name, int p, int m, int v = 1, SimulationCosts costs = {}) {
  absl::StatusOr<SimulationResult> r = Simulate(*MakeSchedule(name, {p, m, v, 0}), costs);
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

TEST(RenderTest, TimelineGridShowsIdleAndLongActions) {
  const std::string gpipe = FormatTimelineGrid(Sim("gpipe", 2, 2));
  EXPECT_EQ(gpipe,
            "   time  rank 0  rank 1\n"
            "      0  0F0\n"
            "      1  0F1     1F0\n"
            "      2          1F1\n"
            "      3          1B0\n"
            "      5  0B0     1B1\n"
            "      7  0B1\n");
  // 1F1B: rank 0's 0B0 (cost 2, from 4) still runs when rank 1 starts 1B1.
  EXPECT_THAT(FormatTimelineGrid(Sim("1f1b", 2, 2)), HasSubstr("      5  |       1B1\n"));
}

TEST(RenderTest, SvgHasRowsBoxesLabelsAndLegend) {
  SimulationCosts costs;
  costs.comm = 0.5;
  SvgOptions options;
  options.title = "1f1b <p=2>";
  const std::string svg = RenderSvg(Sim("1f1b", 2, 3, 1, costs), options);
  EXPECT_THAT(svg, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, HasSubstr("1f1b &lt;p=2&gt;"));  // escaped title
  EXPECT_THAT(svg, HasSubstr(">rank 0</text>"));
  EXPECT_THAT(svg, HasSubstr(">rank 1</text>"));
  EXPECT_THAT(svg, HasSubstr("F forward"));
  EXPECT_THAT(svg, HasSubstr("B backward"));
  EXPECT_THAT(svg, HasSubstr(">message</text>"));
  EXPECT_THAT(svg, HasSubstr(">idle</text>"));
  EXPECT_THAT(svg, HasSubstr("<title>1B2 ["));
  // One box per compute action: 2 ranks x 3 mbs x (F + B).
  size_t boxes = 0;
  for (size_t pos = svg.find("fill-opacity=\"1\" stroke"); pos != std::string::npos;
       pos = svg.find("fill-opacity=\"1\" stroke", pos + 1)) {
    ++boxes;
  }
  EXPECT_EQ(boxes, 12u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
}

TEST(RenderTest, SvgLabelsChunksWhenInterleaved) {
  SvgOptions options;
  options.num_stages = 2;
  const std::string svg = RenderSvg(Sim("interleaved_1f1b", 2, 2, 2), options);
  EXPECT_THAT(svg, HasSubstr("micro-batch.chunk"));
  EXPECT_THAT(svg, HasSubstr(">1.1</text>"));
}

TEST(RenderTest, CsvRoundTripsAndRebuildsAValidSchedule) {
  Schedule s = *MakeSchedule("interleaved_1f1b", {2, 4, 2, 0});
  const std::string csv = DumpCsv(s.ranks);
  EXPECT_EQ(csv.substr(0, 16), "0F0,0F1,2F0,2F1,");
  absl::StatusOr<RankActions> loaded = LoadCsv(csv);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, s.ranks);
  absl::StatusOr<Schedule> rebuilt = ScheduleFromRankActions("from_csv", *loaded);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  EXPECT_EQ(rebuilt->num_chunks, 2);
  EXPECT_EQ(rebuilt->num_microbatches, 4);
  EXPECT_EQ(rebuilt->stage_to_rank, s.stage_to_rank);
  EXPECT_TRUE(ValidateSchedule(*rebuilt).ok());
}

TEST(RenderTest, CsvEmptyCellsAreIdleSteps) {
  // PyTorch writes idle steps as empty cells.
  absl::StatusOr<RankActions> loaded = LoadCsv("0F0,,0B0\r\n,1F0,1B0\n");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(ActionsToString((*loaded)[0]), "0F0 0B0");
  EXPECT_EQ(ActionsToString((*loaded)[1]), "1F0 1B0");
  absl::StatusOr<Schedule> s = ScheduleFromRankActions("csv", *loaded);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(ValidateSchedule(*s).ok()) << ValidateSchedule(*s);
}

TEST(RenderTest, TimelineCsvAlignsStepsWithIdleCells) {
  SimulationResult sim = Sim("gpipe", 2, 2);
  const std::string csv = DumpTimelineCsv(sim);
  // Columns: times 0, 1, 2, 3, 5, 7 (see the timeline grid test).
  EXPECT_EQ(csv, "0F0,0F1,,,0B0,0B1\n,1F0,1F1,1B0,1B1,\n");
  absl::StatusOr<RankActions> loaded = LoadCsv(csv);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, MakeSchedule("gpipe", {2, 2, 1, 0})->ranks);
}

TEST(RenderTest, CsvErrorsNameRowAndColumn) {
  absl::StatusOr<RankActions> loaded = LoadCsv("0F0,0B0\n1F0,1Q0\n");
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("row 1"));
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("column 1"));
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("\"1Q0\""));
  EXPECT_FALSE(ScheduleFromRankActions("x", {{F(0, 0)}, {F(1, 0)}, {F(2, 0)}, {}}).ok());
}

}  // namespace
}  // namespace pp
