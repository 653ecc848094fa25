#include "pipeline/schedule/ir/idle_peers.h"

#include <vector>

#include <gtest/gtest.h>

#include "pipeline/schedule/ir/action.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {
namespace {

using Idle = std::vector<std::vector<int>>;

Schedule TwoRanks(std::vector<Action> rank0, std::vector<Action> rank1, int m) {
  Schedule s = EmptyLoopedSchedule("hand", {.num_stages = 2, .num_microbatches = m});
  s.ranks = {std::move(rank0), std::move(rank1)};
  return s;
}

TEST(IdlePeersTest, GpipeWarmUpAndCoolDown) {
  // rank 0: F0 F1 B0 B1; rank 1: F0 F1 B0 B1.
  const Schedule s =
      TwoRanks({F(0, 0), F(0, 1), B(0, 0), B(0, 1)}, {F(1, 0), F(1, 1), B(1, 0), B(1, 1)}, 2);
  absl::StatusOr<Idle> first = IdlePeersDuring(s, 0, {1});
  ASSERT_TRUE(first.ok()) << first.status();
  // Rank 1 waits for 0F0 and has finished by 0B1; 0F1 may meet 1F0, and 0B0
  // may meet 1B1.
  EXPECT_EQ(*first, (Idle{{1}, {}, {}, {1}}));
  absl::StatusOr<Idle> last = IdlePeersDuring(s, 1, {0});
  ASSERT_TRUE(last.ok()) << last.status();
  // Rank 0 has sent both forwards before 1F1 and waits for 1B0's gradient.
  EXPECT_EQ(*last, (Idle{{}, {0}, {0}, {}}));
}

TEST(IdlePeersTest, OneFOneBOnlyTheFirstStagesEnds) {
  const Schedule s =
      TwoRanks({F(0, 0), F(0, 1), B(0, 0), F(0, 2), B(0, 1), F(0, 3), B(0, 2), B(0, 3)},
               {F(1, 0), B(1, 0), F(1, 1), B(1, 1), F(1, 2), B(1, 2), F(1, 3), B(1, 3)}, 4);
  absl::StatusOr<Idle> first = IdlePeersDuring(s, 0, {1});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, (Idle{{1}, {}, {}, {}, {}, {}, {}, {1}}));
  absl::StatusOr<Idle> last = IdlePeersDuring(s, 1, {0});
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(*last, Idle(8));
}

TEST(IdlePeersTest, OnlyTheAskedPeersAndARankWithoutActions) {
  Schedule s = EmptyLoopedSchedule("hand", {.num_stages = 3, .num_microbatches = 1});
  s.ranks = {{F(0, 0), B(0, 0)}, {F(1, 0), B(1, 0)}, {F(2, 0), B(2, 0)}};
  absl::StatusOr<Idle> idle = IdlePeersDuring(s, 1, {2, 0});
  ASSERT_TRUE(idle.ok()) << idle.status();
  // One micro-batch: nothing overlaps anything, peers in the order asked.
  EXPECT_EQ(*idle, (Idle{{2, 0}, {2, 0}}));
  absl::StatusOr<Idle> none = IdlePeersDuring(s, 1, {});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, (Idle{{}, {}}));
}

TEST(IdlePeersTest, BadRanksAndUnrunnableOrdersAreInvalidArgument) {
  const Schedule s = TwoRanks({F(0, 0), B(0, 0)}, {F(1, 0), B(1, 0)}, 1);
  for (const auto& [rank, peers] : std::vector<std::pair<int, std::vector<int>>>{
           {2, {}}, {-1, {}}, {0, {0}}, {0, {1, 1}}, {0, {2}}}) {
    absl::StatusOr<Idle> idle = IdlePeersDuring(s, rank, peers);
    EXPECT_EQ(idle.status().code(), absl::StatusCode::kInvalidArgument) << rank;
    EXPECT_FALSE(idle.status().message().empty());
  }
  // 0B0 before 0F0 can never run.
  const Schedule stuck = TwoRanks({B(0, 0), F(0, 0)}, {F(1, 0), B(1, 0)}, 1);
  EXPECT_EQ(IdlePeersDuring(stuck, 0, {1}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pp
