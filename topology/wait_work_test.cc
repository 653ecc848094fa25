#include "topology/wait_work.h"

#include <chrono>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(WaitWorkTest, CompletedCollectiveIsOk) {
  absl::Status s = RunOnThreadRanks(2, seconds(20), [](World& world) -> absl::Status {
    std::vector<at::Tensor> t = {at::full({1}, world.rank + 1, at::kLong)};
    absl::Status r = RunCollective("all-reduce of a test value", "world group", seconds(10),
                                   [&] { return world.group->allreduce(t); });
    if (!r.ok()) return r;
    if (t[0].item<int64_t>() != 3) {
      return absl::InternalError(absl::StrCat("sum ", t[0].item<int64_t>(), ", expected 3"));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Rank 1 joins the world but never enters the all-reduce: rank 0's wait
// expires and says what it waited for, on which group, for how long.
TEST(WaitWorkTest, RankThatNeverJoinsGivesDeadlineExceededNamingCollectiveGroupTimeout) {
  absl::Status waited;
  // The groups' own timeout (3 s) is longer than the wait's (300 ms), so the
  // wait expires first; Gloo's timeout then ends the abandoned operation.
  absl::Status s = RunOnThreadRanks(2, seconds(3), [&](World& world) -> absl::Status {
    if (world.rank == 1) return absl::OkStatus();
    std::vector<at::Tensor> t = {at::ones({4})};
    waited = WaitWork(world.group->allreduce(t), "all-reduce of the loss", "pipe group [0, 1]",
                      milliseconds(300));
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  EXPECT_TRUE(absl::StrContains(waited.message(), "all-reduce of the loss")) << waited;
  EXPECT_TRUE(absl::StrContains(waited.message(), "pipe group [0, 1]")) << waited;
  EXPECT_TRUE(absl::StrContains(waited.message(), "300 ms")) << waited;
}

TEST(WaitWorkTest, ExceptionWhileStartingBecomesStatusNamingTheCollective) {
  absl::Status s = RunOnThreadRanks(1, seconds(20), [](World& world) -> absl::Status {
    std::vector<at::Tensor> none;  // Gloo refuses an empty tensor list
    absl::Status r = RunCollective("broadcast of nothing", "world group", seconds(1),
                                   [&] { return world.group->broadcast(none); });
    if (r.code() != absl::StatusCode::kInternal ||
        !absl::StrContains(r.message(), "broadcast of nothing on world group")) {
      return absl::InternalError(absl::StrCat("unexpected: ", r.ToString()));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(WaitWorkTest, NullWorkAndNonPositiveTimeoutAreInvalidArguments) {
  absl::Status null_work = WaitWork(WorkPtr(), "barrier", "data group", seconds(1));
  EXPECT_EQ(null_work.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(null_work.message(), "barrier on data group")) << null_work;
  absl::Status s = RunOnThreadRanks(1, seconds(20), [](World& world) -> absl::Status {
    absl::Status r = WaitWork(world.group->barrier(), "barrier", "world group", milliseconds(0));
    if (r.code() != absl::StatusCode::kInvalidArgument ||
        !absl::StrContains(r.message(), "timeout must be > 0")) {
      return absl::InternalError(absl::StrCat("unexpected: ", r.ToString()));
    }
    // The barrier was started: finish it so the group shuts down cleanly.
    return WaitWork(world.group->barrier(), "barrier", "world group", seconds(10));
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(DescribeGroupTest, NamesMembersAndThisRanksPeersByGlobalRank) {
  EXPECT_EQ(DescribeGroup("world group", {0, 1, 2}, 1),
            "world group [0,1,2] (this rank's peers: global rank 0, global rank 2)");
  EXPECT_EQ(DescribeGroup("pipe group", {3, 7}, 7),
            "pipe group [3,7] (this rank's peers: global rank 3)");
  // A group of one has no peers to name.
  EXPECT_EQ(DescribeGroup("data group", {4}, 4), "data group [4]");
}

TEST(DescribeGroupTest, NamesAtMostSixteenPeersAndCountsTheRest) {
  std::vector<int> ranks(40);
  for (int r = 0; r < 40; ++r) ranks[r] = r;
  const std::string text = DescribeGroup("world group", ranks, 0);
  EXPECT_TRUE(absl::StrContains(text, "global rank 16 and 23 more)")) << text;
  EXPECT_FALSE(absl::StrContains(text, "global rank 17")) << text;
  EXPECT_FALSE(absl::StrContains(text, "global rank 0,")) << text;
}

}  // namespace
}  // namespace pp
