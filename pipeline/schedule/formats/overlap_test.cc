// OVERLAP_F_B through every pass: validation, dependency timing and lowering
// (the comms of both halves), the simulator (cost F + B back to back, memory,
// one timeline event per half), DeferReceives and the capability check.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/analysis/validator.h"
#include "pipeline/schedule/formats/render.h"
#include "pipeline/schedule/ir/capabilities.h"
#include "pipeline/schedule/ir/chrome_trace.h"
#include "pipeline/schedule/ir/defer_receives.h"
#include "pipeline/schedule/ir/lowering.h"

namespace pp {
namespace {

using ::testing::HasSubstr;

Schedule Manual(int p, int m, const std::vector<std::string>& ranks) {
  Schedule s = EmptyLoopedSchedule("manual", {p, m, 1, 0});
  for (int r = 0; r < p; ++r) {
    absl::StatusOr<std::vector<Action>> actions = ParseActions(ranks[r]);
    EXPECT_TRUE(actions.ok()) << actions.status();
    s.ranks[r] = *actions;
  }
  return s;
}

// p = 2, m = 3: each rank pairs the forward of one micro-batch with the
// backward of an earlier one.
Schedule Paired() {
  return Manual(2, 3,
                {"0F0 0F1 (0F2;0B0)OVERLAP_F_B 0B1 0B2",
                 "1F0 (1F1;1B0)OVERLAP_F_B (1F2;1B1)OVERLAP_F_B 1B2"});
}

TEST(OverlapTest, PairedScheduleValidates) {
  absl::Status status = ValidateSchedule(Paired());
  EXPECT_TRUE(status.ok()) << status;
}

TEST(OverlapTest, LoweringPutsBothHalvesCommsAroundThePair) {
  absl::StatusOr<LoweredProgram> program = Lower(Paired());
  ASSERT_TRUE(program.ok()) << program.status();
  // Rank 0's pair needs 1B0's gradient (RECV_B0 before it) and produces 0F2's
  // output (SEND_F2 after it); rank 1's first pair needs 0F1's output and
  // produces 1B0's gradient.
  EXPECT_EQ(ActionsToString(program->ranks[0]),
            "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 (0F2;0B0)OVERLAP_F_B 0SEND_F2 0RECV_B1 0B1 "
            "0RECV_B2 0B2 REDUCE_TIED 0REDUCE_GRAD STEP");
  EXPECT_EQ(ActionsToString(program->ranks[1]),
            "1RECV_F0 1F0 1RECV_F1 (1F1;1B0)OVERLAP_F_B 1SEND_B0 1RECV_F2 "
            "(1F2;1B1)OVERLAP_F_B 1SEND_B1 1B2 1SEND_B2 REDUCE_TIED 1REDUCE_GRAD STEP");
  EXPECT_TRUE(ValidateLoweredProgram(*program).ok()) << ValidateLoweredProgram(*program);
}

TEST(OverlapTest, SimulatorRunsTheHalvesBackToBack) {
  SimulationCosts costs;  // F = 1, B = 2
  absl::StatusOr<SimulationResult> sim = Simulate(Paired(), costs);
  ASSERT_TRUE(sim.ok()) << sim.status();
  // By hand: rank 0 0F0 [0,1] 0F1 [1,2]; rank 1 1F0 [1,2], pair (1F1 [2,3],
  // 1B0 [3,5]); rank 0 pair (0F2 [5,6], 0B0 [6,8]), whose 0SEND_F2 follows
  // the whole pair (8); rank 1 pair (1F2 [8,9], 1B1 [9,11]), 1B2 [11,13];
  // rank 0 0B1 [11,13], 0B2 [13,15].
  EXPECT_DOUBLE_EQ(sim->makespan, 15);
  EXPECT_DOUBLE_EQ(sim->busy[0], 9);
  EXPECT_DOUBLE_EQ(sim->busy[1], 9);
  std::vector<std::string> rank0;
  for (const TraceEvent& e : sim->timeline) {
    if (e.rank != 0) continue;
    rank0.push_back(absl::StrCat(e.name, "@", e.start, "-", e.end));
  }
  EXPECT_THAT(rank0, ::testing::Contains("0F2@5-6"));
  EXPECT_THAT(rank0, ::testing::Contains("0B0@6-8"));
  // Memory: the pair's F adds before its B frees.
  EXPECT_DOUBLE_EQ(sim->peak_memory[0], 3);
  EXPECT_DOUBLE_EQ(sim->peak_memory[1], 2);
  EXPECT_EQ(sim->peak_inflight[0], 3);
}

TEST(OverlapTest, ChromeTraceAndSvgShowThePair) {
  absl::StatusOr<SimulationResult> sim = Simulate(Paired(), SimulationCosts{});
  ASSERT_TRUE(sim.ok()) << sim.status();
  int halves = 0;
  for (const TraceEvent& e : sim->timeline) {
    if (e.overlap == "(0F2;0B0)OVERLAP_F_B") ++halves;
  }
  EXPECT_EQ(halves, 2);
  EXPECT_THAT(ChromeTraceJson(sim->timeline),
              HasSubstr("\"overlap_f_b\": \"(0F2;0B0)OVERLAP_F_B\""));
  const std::string svg = RenderSvg(*sim);
  // One outline per pair, spanning both halves: [5, 8) on rank 0.
  EXPECT_THAT(svg, HasSubstr("<title>(0F2;0B0)OVERLAP_F_B</title>"));
  EXPECT_THAT(svg, HasSubstr("OVERLAP_F_B pair"));
}

TEST(OverlapTest, CsvRoundTripKeepsThePairs) {
  const Schedule s = Paired();
  const std::string csv = DumpCsv(s.ranks);
  EXPECT_THAT(csv, HasSubstr("0F1,(0F2;0B0)OVERLAP_F_B,0B1"));
  absl::StatusOr<RankActions> loaded = LoadCsv(csv);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, s.ranks);
  absl::StatusOr<Schedule> rebuilt = ScheduleFromRankActions("csv", *loaded);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  EXPECT_EQ(rebuilt->num_microbatches, 3);
  EXPECT_TRUE(ValidateSchedule(*rebuilt).ok()) << ValidateSchedule(*rebuilt);
}

TEST(OverlapTest, PairThatWaitsOnItselfAcrossRanksIsRejected) {
  // Unpaired this order runs; paired, rank 0's pair waits for 1B0, inside
  // rank 1's pair, which waits for 0F1, inside rank 0's pair.
  Schedule s = Manual(2, 2, {"0F0 (0F1;0B0)OVERLAP_F_B 0B1", "1F0 (1F1;1B0)OVERLAP_F_B 1B1"});
  absl::Status status = ValidateSchedule(s);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot all make progress")) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("(0F1;0B0)OVERLAP_F_B")) << status;
}

TEST(OverlapTest, HalvesAreCheckedLikeAnyCell) {
  Schedule misplaced =
      Manual(2, 3, {"0F0 0F1 (0F2;1B0)OVERLAP_F_B 0B1 0B2", "1F0 1F1 1F2 1B1 1B2"});
  absl::Status status = ValidateSchedule(misplaced);
  EXPECT_THAT(std::string(status.message()), HasSubstr("stage 1 is placed on rank 1")) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("[(0F2;1B0)OVERLAP_F_B]")) << status;

  Schedule same_mb = Paired();
  same_mb.ranks[0][2] = OverlapFB(F(0, 2), B(0, 2));  // built directly, not parsed
  status = ValidateSchedule(same_mb);
  EXPECT_THAT(std::string(status.message()), HasSubstr("different micro-batches")) << status;

  Schedule twice = Paired();
  twice.ranks[0][3] = OverlapFB(F(0, 1), B(0, 2));  // 0F1 again
  status = ValidateSchedule(twice);
  EXPECT_THAT(std::string(status.message()), HasSubstr("0F1 appears twice")) << status;
}

TEST(OverlapTest, DeferReceivesKeepsBothHalvesInputsBeforeThePair) {
  absl::StatusOr<LoweredProgram> program = Lower(Paired());
  ASSERT_TRUE(program.ok()) << program.status();
  LoweredProgram d = DeferReceives(*program);
  EXPECT_EQ(ActionsToString(d.ranks[1]),
            "1RECV_F0 1F0 1RECV_F1 (1F1;1B0)OVERLAP_F_B 1SEND_B0 1RECV_F2 "
            "(1F2;1B1)OVERLAP_F_B 1SEND_B1 1B2 1SEND_B2 REDUCE_TIED 1REDUCE_GRAD STEP");
  EXPECT_TRUE(ValidateLoweredProgram(d).ok()) << ValidateLoweredProgram(d);
}

TEST(OverlapTest, CapabilityCheckNamesThePair) {
  absl::StatusOr<LoweredProgram> program = Lower(Paired());
  ASSERT_TRUE(program.ok()) << program.status();
  RuntimeCapabilities caps;
  absl::Status status = CheckRuntimeSupports(*program, caps);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(status.message()), HasSubstr("(0F2;0B0)OVERLAP_F_B on rank 0"));
  caps.overlap_f_b = true;
  EXPECT_TRUE(CheckRuntimeSupports(*program, caps).ok());
  // An I half needs split backward as well.
  program->ranks[0][5] = OverlapFB(F(0, 2), I(0, 0));
  status = CheckRuntimeSupports(*program, caps);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(status.message()), HasSubstr("0I0 on rank 0")) << status;
}

}  // namespace
}  // namespace pp
