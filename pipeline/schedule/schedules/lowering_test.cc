#include "pipeline/schedule/ir/lowering.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pipeline/schedule/analysis/validator.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

using ::testing::HasSubstr;

LoweredProgram MustLower(const std::string& name, int p, int m, int v = 1,
                         LoweringOptions options = {}) {
  absl::StatusOr<Schedule> s = MakeSchedule(name, {p, m, v, 0});
  EXPECT_TRUE(s.ok()) << s.status();
  absl::StatusOr<LoweredProgram> program = Lower(*s, options);
  EXPECT_TRUE(program.ok()) << program.status();
  return *program;
}

TEST(LoweringTest, OneFOneBTwoStages) {
  LoweredProgram program = MustLower("1f1b", 2, 2);
  EXPECT_EQ(ActionsToString(program.ranks[0]),
            "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 "
            "REDUCE_TIED 0REDUCE_GRAD STEP");
  EXPECT_EQ(ActionsToString(program.ranks[1]),
            "1RECV_F0 1F0 1RECV_F1 1B0 1SEND_B0 1F1 1B1 1SEND_B1 "
            "REDUCE_TIED 1REDUCE_GRAD STEP");
  EXPECT_TRUE(ValidateLoweredProgram(program).ok());
}

TEST(LoweringTest, PeersFollowThePlacement) {
  LoweredProgram program = MustLower("interleaved_1f1b", 2, 2, 2);
  EXPECT_EQ(program.LocalStages(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(program.LocalStages(1), (std::vector<int>{1, 3}));
  int wrap_sends = 0;
  for (int r = 0; r < 2; ++r) {
    for (const Action& a : program.ranks[r]) {
      if (!IsCommunication(a.type)) continue;
      EXPECT_EQ(program.stage_to_rank[a.stage], r) << a;
      EXPECT_NE(program.PeerRank(a), r) << a;
      // Stage 1 (rank 1) feeds stage 2 (rank 0): the chunk wrap-around.
      if (a == Action{1, ActionType::kSendForward, 0}) {
        ++wrap_sends;
        EXPECT_EQ(program.PeerRank(a), 0);
      }
    }
  }
  EXPECT_EQ(wrap_sends, 1);
}

TEST(LoweringTest, StagesOnOneRankHandOverLocally) {
  LoweredProgram program = MustLower("interleaved_1f1b", 1, 2, 3);
  for (const Action& a : program.ranks[0]) {
    EXPECT_FALSE(IsCommunication(a.type)) << a;
  }
  // Tail: stages in the order of their last backward (stage 0 last).
  const std::vector<Action>& actions = program.ranks[0];
  ASSERT_GE(actions.size(), 5u);
  EXPECT_EQ(ActionsToString({actions.end() - 5, actions.end()}),
            "REDUCE_TIED 2REDUCE_GRAD 1REDUCE_GRAD 0REDUCE_GRAD STEP");
}

TEST(LoweringTest, ForwardOnlyAndNoTailOption) {
  LoweredProgram inference = MustLower("inference", 2, 2);
  EXPECT_EQ(ActionsToString(inference.ranks[0]), "0F0 0SEND_F0 0F1 0SEND_F1");
  LoweringOptions options;
  options.include_tail = false;
  LoweredProgram no_tail = MustLower("gpipe", 2, 1, 1, options);
  EXPECT_EQ(ActionsToString(no_tail.ranks[1]), "1RECV_F0 1F0 1B0 1SEND_B0");
}

TEST(LoweringTest, EverySendPrecedesNothingItDependsOn) {
  // Sends come right after what they send whenever the receiver is free.
  LoweredProgram program = MustLower("gpipe", 4, 4);
  EXPECT_EQ(ActionsToString(program.ranks[0]).substr(0, 23), "0F0 0SEND_F0 0F1 0SEND_");
}

TEST(LoweringTest, BackwardBeforeItsForwardIsRejectedWithGrid) {
  Schedule s = *MakeSchedule("gpipe", {2, 1, 1, 0});
  std::swap(s.ranks[0][0], s.ranks[0][1]);  // 0B0 0F0
  absl::StatusOr<LoweredProgram> program = Lower(s);
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(program.status().message()), HasSubstr("[0B0]"));
  EXPECT_THAT(std::string(program.status().message()), HasSubstr("waits for"));
}

TEST(LoweringTest, CrossRankCycleIsRejected) {
  Schedule s = *MakeSchedule("1f1b", {2, 2, 1, 0});
  s.ranks[0] = *ParseActions("0F0 0B0 0F1 0B1");
  s.ranks[1] = *ParseActions("1F1 1B1 1F0 1B0");
  absl::StatusOr<LoweredProgram> program = Lower(s);
  ASSERT_FALSE(program.ok());
  const std::string message(program.status().message());
  EXPECT_THAT(message, HasSubstr("0B0 waits for 1B0"));
  EXPECT_THAT(message, HasSubstr("1F1 waits for 0F1"));
}

TEST(LoweringTest, MisplacedOrCommunicationActionsAreRejected) {
  Schedule s = *MakeSchedule("gpipe", {2, 1, 1, 0});
  s.ranks[0][0] = F(1, 0);
  EXPECT_THAT(std::string(Lower(s).status().message()), HasSubstr("placed on rank 1"));
  s = *MakeSchedule("gpipe", {2, 1, 1, 0});
  s.ranks[0].push_back({0, ActionType::kSendForward, 0});
  EXPECT_THAT(std::string(Lower(s).status().message()), HasSubstr("only compute actions"));
  LoweringOptions zero;
  zero.backward_weight_cost = 0;
  EXPECT_EQ(Lower(*MakeSchedule("gpipe", {2, 1, 1, 0}), zero).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pp
