#include "pipeline/runtime/nccl_order.h"

#include <string>

#include "gtest/gtest.h"
#include "pipeline/schedule/ir/action.h"
#include "pipeline/schedule/ir/defer_receives.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

// Every registered schedule, as lowered, posts matching transfers in matching
// order on every pair of ranks: the device runtime runs them without batching
// (and without DeferReceives, which the next test shows breaks the order).
TEST(NcclOrderTest, EveryLoweredScheduleIsPairwiseOrdered) {
  int checked = 0;
  for (const std::string& name : RegisteredScheduleNames()) {
    for (int p : {2, 3, 4}) {
      for (int m : {1, 2, 4, 8}) {
        for (int v : {1, 2}) {
          absl::StatusOr<Schedule> schedule = MakeSchedule(name, {p, m, v, 0});
          if (!schedule.ok()) continue;  // options this schedule does not take
          absl::StatusOr<LoweredProgram> program = Lower(*schedule);
          ASSERT_TRUE(program.ok()) << program.status();
          EXPECT_TRUE(CheckPairwiseP2POrder(*program).ok())
              << name << " p=" << p << " m=" << m << " v=" << v << ": "
              << CheckPairwiseP2POrder(*program);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 50);
}

// DeferReceives moves receives after later sends: fine for Gloo (tags), a
// deadlock on NCCL. The message names the two ranks and the first mismatch.
TEST(NcclOrderTest, DeferredReceivesAreRefusedNamingTheMismatch) {
  absl::StatusOr<Schedule> schedule = MakeSchedule("1f1b", {2, 4, 1, 0});
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  absl::StatusOr<LoweredProgram> program = Lower(*schedule);
  ASSERT_TRUE(program.ok()) << program.status();
  absl::Status s = CheckPairwiseP2POrder(DeferReceives(*program));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "schedule '1f1b' on NCCL: ranks 0 and 1 post their transfers in different orders: "
            "transfer 2 is 0SEND_F1 on rank 0 but 1SEND_B0 on rank 1 (both send; NCCL pairs the "
            "operations of two ranks by order, not by tag)");
}

LoweredProgram TwoRanks(const std::string& rank0, const std::string& rank1) {
  LoweredProgram program;
  program.schedule_name = "hand";
  program.num_stages = 2;
  program.num_microbatches = 2;
  program.stage_to_rank = {0, 1};
  program.ranks = {*ParseActions(rank0), *ParseActions(rank1)};
  return program;
}

TEST(NcclOrderTest, HandWrittenProgramsPassOrFailAsExpected) {
  EXPECT_TRUE(CheckPairwiseP2POrder(TwoRanks("0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
                                             "1RECV_F0 1F0 1RECV_F1 1F1 1B0 1SEND_B0 1B1 1SEND_B1"))
                  .ok());
  // Rank 1 receives micro-batch 1 first: both wait on the pair's stream.
  absl::Status swapped =
      CheckPairwiseP2POrder(TwoRanks("0F0 0SEND_F0 0F1 0SEND_F1", "1RECV_F1 1RECV_F0 1F0 1F1"));
  EXPECT_EQ(swapped.message(),
            "schedule 'hand' on NCCL: ranks 0 and 1 post their transfers in different orders: "
            "transfer 1 is 0SEND_F0 on rank 0 but 1RECV_F1 on rank 1 (not a pair; NCCL pairs the "
            "operations of two ranks by order, not by tag)");
  absl::Status unpaired = CheckPairwiseP2POrder(TwoRanks("0F0 0F1", "1RECV_F0 1F0"));
  EXPECT_EQ(unpaired.message(),
            "schedule 'hand' on NCCL: ranks 0 and 1: 1RECV_F0 on rank 1 has no counterpart on "
            "rank 0");
}

}  // namespace
}  // namespace pp
