#include "pipeline/schedule/analysis/validator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

using ::testing::HasSubstr;

Schedule Manual(int p, int m, std::vector<std::string> ranks, bool forward_only = false) {
  Schedule s = EmptyLoopedSchedule("manual", {p, m, 1, 0});
  s.forward_only = forward_only;
  for (int r = 0; r < p; ++r) s.ranks[r] = *ParseActions(ranks[r]);
  return s;
}

std::string Message(const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

TEST(ValidatorTest, BuiltInSchedulesPass) {
  for (const char* name : {"gpipe", "1f1b", "looped_bfs", "inference"}) {
    EXPECT_TRUE(ValidateSchedule(*MakeSchedule(name, {4, 6, 1, 0})).ok()) << name;
  }
  EXPECT_TRUE(ValidateSchedule(*MakeSchedule("interleaved_1f1b", {4, 8, 2, 0})).ok());
}

TEST(ValidatorTest, SplitBackwardValidatesAndSimulates) {
  // A zero-bubble-like order: I early, W deferred.
  Schedule s = Manual(2, 2, {"0F0 0F1 0I0 0W0 0I1 0W1", "1F0 1I0 1F1 1I1 1W0 1W1"});
  ASSERT_TRUE(ValidateSchedule(s).ok()) << ValidateSchedule(s);
  SimulationCosts costs;  // F=1, I=1, W=1
  absl::StatusOr<SimulationResult> r = Simulate(s, costs);
  ASSERT_TRUE(r.ok()) << r.status();
  // Rank 1: 1F0 1-2, 1I0 2-3, 1F1 3-4, 1I1 4-5, 1W0 5-6, 1W1 6-7; rank 0:
  // 0F0 0-1, 0F1 1-2, 0I0 3-4, 0W0 4-5, 0I1 5-6, 0W1 6-7.
  EXPECT_DOUBLE_EQ(r->makespan, 7);
  EXPECT_EQ(r->peak_inflight[0], 2);
}

TEST(ValidatorTest, MissingBackwardMarksTheRanksEnd) {
  Schedule s = Manual(1, 2, {"0F0 0F1 0B0"});
  const std::string message = Message(ValidateSchedule(s));
  EXPECT_THAT(message, HasSubstr("missing backward of (stage 0, mb 1)"));
  EXPECT_THAT(message, HasSubstr("[ ]"));
}

TEST(ValidatorTest, DuplicateForwardIsMarked) {
  const std::string message = Message(ValidateSchedule(Manual(1, 1, {"0F0 0F0 0B0"})));
  EXPECT_THAT(message, HasSubstr("0F0 appears twice"));
  EXPECT_THAT(message, HasSubstr("[0F0]   <-- here"));
}

TEST(ValidatorTest, WeightBeforeInputIsRejected) {
  EXPECT_THAT(Message(ValidateSchedule(Manual(1, 1, {"0F0 0W0 0I0"}))),
              HasSubstr("0W0 runs before 0I0"));
}

TEST(ValidatorTest, FullAndSplitBackwardTogetherIsRejected) {
  EXPECT_THAT(Message(ValidateSchedule(Manual(1, 1, {"0F0 0B0 0I0 0W0"}))),
              HasSubstr("both a full backward B and a split I/W"));
}

TEST(ValidatorTest, BackwardBeforeForwardIsRejected) {
  EXPECT_THAT(Message(ValidateSchedule(Manual(1, 1, {"0B0 0F0"}))),
              HasSubstr("runs before its forward"));
}

TEST(ValidatorTest, LocalStageOrderIsChecked) {
  Schedule s = EmptyLoopedSchedule("manual", {1, 1, 2, 0});
  s.ranks[0] = *ParseActions("1F0 0F0 1B0 0B0");
  EXPECT_THAT(Message(ValidateSchedule(s)), HasSubstr("F on stage 1 runs before F on stage 0"));
  s.ranks[0] = *ParseActions("0F0 1F0 0B0 1B0");
  EXPECT_THAT(Message(ValidateSchedule(s)),
              HasSubstr("backward on stage 0 runs before the backward on stage 1"));
}

TEST(ValidatorTest, ForwardOnlyScheduleWithBackwardIsRejected) {
  EXPECT_THAT(Message(ValidateSchedule(Manual(1, 1, {"0F0 0B0"}, true))),
              HasSubstr("forward-only"));
}

TEST(ValidatorTest, CrossRankOrderThatCannotProgressIsRejected) {
  Schedule s = Manual(2, 2, {"0F0 0B0 0F1 0B1", "1F1 1B1 1F0 1B0"});
  EXPECT_THAT(Message(ValidateSchedule(s)), HasSubstr("cannot all make progress"));
}

LoweredProgram Program(int p, int m, std::vector<std::string> ranks, bool forward_only = true) {
  LoweredProgram program;
  program.schedule_name = "manual";
  program.num_stages = p;
  program.num_microbatches = m;
  program.forward_only = forward_only;
  program.stage_to_rank = LoopedPlacement(p, 1);
  for (const std::string& r : ranks) program.ranks.push_back(*ParseActions(r));
  return program;
}

TEST(ValidatorTest, BlockingSendsInCrossedOrderDeadlock) {
  // Rank 0 sends mb 1 first, rank 1 waits for mb 0 first: with blocking
  // sends neither can move.
  LoweredProgram program =
      Program(2, 2, {"0F0 0F1 0SEND_F1 0SEND_F0", "1RECV_F0 1F0 1RECV_F1 1F1"});
  const std::string message = Message(ValidateLoweredProgram(program));
  EXPECT_THAT(message, HasSubstr("deadlock"));
  EXPECT_THAT(message, HasSubstr("[0SEND_F1]"));
  EXPECT_THAT(message, HasSubstr("waits for rank 1 (1RECV_F1), which is at step 0: 1RECV_F0"));
}

TEST(ValidatorTest, TwoRanksBothSendingFirstDeadlock) {
  // The classic 1F1B hazard: each rank sends before it receives.
  LoweredProgram program = Program(2, 2,
                                   {"0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
                                    "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"},
                                   false);
  EXPECT_THAT(Message(ValidateLoweredProgram(program)), HasSubstr("deadlock"));
}

TEST(ValidatorTest, ComputeWithoutItsInputIsRejected) {
  LoweredProgram program = Program(2, 1, {"0F0 0SEND_F0", "1F0 1RECV_F0"});
  EXPECT_THAT(Message(ValidateLoweredProgram(program)), HasSubstr("1F0 cannot run: its input"));
  program = Program(2, 1, {"0SEND_F0 0F0", "1RECV_F0 1F0"});
  EXPECT_THAT(Message(ValidateLoweredProgram(program)), HasSubstr("0SEND_F0 cannot run"));
}

TEST(ValidatorTest, MessageToOwnRankIsRejected) {
  LoweredProgram program;
  program.schedule_name = "manual";
  program.num_stages = 1;
  program.num_microbatches = 1;
  program.num_chunks = 2;
  program.forward_only = true;
  program.stage_to_rank = LoopedPlacement(1, 2);
  program.ranks = {*ParseActions("0F0 0SEND_F0 1RECV_F0 1F0")};
  EXPECT_THAT(Message(ValidateLoweredProgram(program)), HasSubstr("hand over locally"));
}

TEST(ValidatorTest, LoweredCountsAreChecked) {
  LoweredProgram program = Program(1, 2, {"0F0"});
  EXPECT_THAT(Message(ValidateLoweredProgram(program)), HasSubstr("(stage 0, mb 1) has 0 F"));
}

}  // namespace
}  // namespace pp
