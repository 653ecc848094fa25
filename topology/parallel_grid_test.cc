#include "topology/parallel_grid.h"

#include <unistd.h>

#include <numeric>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "topology/process_topology.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

using ::testing::HasSubstr;

RendezvousOptions FastOptions() {
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(20);
  return options;
}

// Sum of `value` over `group`, as an int.
absl::StatusOr<int64_t> AllReduceSum(const ProcessGroupPtr& group, int64_t value) {
  std::vector<at::Tensor> tensors = {at::full({1}, value, at::kLong)};
  absl::Status s = TorchCall("all-reduce", [&] { group->allreduce(tensors)->wait(); });
  if (!s.ok()) return s;
  return tensors[0].item<int64_t>();
}

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

// Everything a grid promises, checked on one rank against the pure topology.
absl::Status CheckGrid(const World& world, const ProcessTopology& topology) {
  PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world, topology));
  const int rank = world.rank;
  PP_ASSIGN_OR_RETURN(int stage, topology.GetAxisValue(rank, kPipeAxis));
  PP_ASSIGN_OR_RETURN(int data, topology.GetAxisValue(rank, kDataAxis));
  PP_RETURN_IF_ERROR(Expect(grid.stage_id() == stage, "stage id"));
  PP_RETURN_IF_ERROR(Expect(grid.data_parallel_id() == data, "data-parallel id"));
  PP_RETURN_IF_ERROR(Expect(grid.num_stages() == topology.GetDim(kPipeAxis), "num stages"));
  PP_RETURN_IF_ERROR(
      Expect(grid.data_parallel_size() == topology.GetDim(kDataAxis), "data-parallel size"));
  PP_RETURN_IF_ERROR(Expect(grid.IsFirstStage() == (stage == 0), "first stage"));
  PP_RETURN_IF_ERROR(Expect(grid.IsLastStage() == (stage == grid.num_stages() - 1), "last stage"));
  PP_RETURN_IF_ERROR(Expect(grid.pipe_group()->getRank() == stage, "pipe group rank != stage"));
  PP_RETURN_IF_ERROR(Expect(grid.data_group()->getRank() == data, "data group rank != dp id"));

  // StageToGlobal agrees with the topology for every (stage, data).
  AxisValues coord;
  for (size_t i = 0; i < topology.axes().size(); ++i) {
    coord[topology.axes()[i]] = topology.GetCoord(rank).value()[i];
  }
  for (int s = 0; s < grid.num_stages(); ++s) {
    for (int d = 0; d < grid.data_parallel_size(); ++d) {
      coord[kPipeAxis] = s;
      coord[kDataAxis] = d;
      PP_ASSIGN_OR_RETURN(int expected, topology.GetRank(coord));
      PP_ASSIGN_OR_RETURN(int got, grid.StageToGlobal(s, d));
      PP_RETURN_IF_ERROR(Expect(got == expected, absl::StrCat("StageToGlobal(", s, ",", d,
                                                              ")=", got, " want ", expected)));
    }
  }
  const int p = grid.num_stages();
  PP_RETURN_IF_ERROR(
      Expect(grid.NextStageRank() == grid.StageToGlobal((stage + 1) % p, data).value(),
             "next stage rank"));
  PP_RETURN_IF_ERROR(
      Expect(grid.PrevStageRank() == grid.StageToGlobal((stage + p - 1) % p, data).value(),
             "prev stage rank"));

  // Every group's all-reduce of rank ids is the sum of its members, which are
  // the topology's lists for this rank.
  struct Case {
    const char* name;
    const ProcessGroupPtr& group;
    const std::vector<int>& ranks;
    std::vector<int> expected_ranks;
  };
  PP_ASSIGN_OR_RETURN(std::vector<int> replica, topology.FilterMatch({{kDataAxis, data}}));
  auto own = [&](const std::string& axis) {
    for (const auto& list : topology.AxisCommLists(axis)) {
      for (int r : list) {
        if (r == rank) return list;
      }
    }
    return std::vector<int>{rank};
  };
  std::vector<int> everyone(topology.world_size());
  std::iota(everyone.begin(), everyone.end(), 0);
  const std::vector<Case> cases = {
      {"pipe", grid.pipe_group(), grid.pipe_group_ranks(), own(kPipeAxis)},
      {"data", grid.data_group(), grid.data_group_ranks(), own(kDataAxis)},
      {"model", grid.model_group(), grid.model_group_ranks(), own(kModelAxis)},
      {"model_parallel", grid.model_parallel_group(), grid.model_parallel_group_ranks(), replica},
      {"world", grid.world_group(), everyone, everyone},
  };
  for (const Case& c : cases) {
    PP_RETURN_IF_ERROR(Expect(c.ranks == c.expected_ranks, absl::StrCat(c.name, " members")));
    PP_RETURN_IF_ERROR(Expect(c.group->getSize() == static_cast<int>(c.ranks.size()),
                              absl::StrCat(c.name, " group size")));
    PP_ASSIGN_OR_RETURN(int64_t sum, AllReduceSum(c.group, rank));
    const int64_t expected = std::accumulate(c.ranks.begin(), c.ranks.end(), int64_t{0});
    PP_RETURN_IF_ERROR(Expect(sum == expected, absl::StrCat(c.name, " all-reduce on rank ", rank,
                                                            " = ", sum, " want ", expected)));
  }
  return absl::OkStatus();
}

class ParallelGridTest : public ::testing::Test {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

TEST_F(ParallelGridTest, PipeTwoDataTwoOverTcpStore) {
  auto topology = PipeDataParallelTopology(2, 2);
  ASSERT_TRUE(topology.ok());
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  auto status = RunThreadRanks(4, *port, FastOptions(),
                               [&](World& world) { return CheckGrid(world, *topology); });
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_TRUE(status[rank].ok()) << rank << ": " << status[rank];
}

TEST_F(ParallelGridTest, TwoByTwoByTwoOverFileStore) {
  auto topology = PipeModelDataParallelTopology(2, 2, 2);
  ASSERT_TRUE(topology.ok());
  RendezvousOptions options = FastOptions();
  options.file_store_path = absl::StrCat(::testing::TempDir(), "/grid_2x2x2_", getpid());
  auto status =
      RunThreadRanks(8, 0, options, [&](World& world) { return CheckGrid(world, *topology); });
  for (int rank = 0; rank < 8; ++rank)
    EXPECT_TRUE(status[rank].ok()) << rank << ": " << status[rank];
}

TEST_F(ParallelGridTest, FourStagePipelineWraps) {
  auto topology = PipeDataParallelTopology(4, 1);
  ASSERT_TRUE(topology.ok());
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  auto status = RunThreadRanks(4, *port, FastOptions(), [&](World& world) -> absl::Status {
    PP_RETURN_IF_ERROR(CheckGrid(world, *topology));
    PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world, *topology));
    PP_RETURN_IF_ERROR(Expect(grid.NextStageRank() == (world.rank + 1) % 4, "next"));
    return Expect(grid.PrevStageRank() == (world.rank + 3) % 4, "prev");
  });
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_TRUE(status[rank].ok()) << rank << ": " << status[rank];
}

TEST_F(ParallelGridTest, NewGroupForTiedStages) {
  auto topology = PipeDataParallelTopology(2, 2);
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  auto status = RunThreadRanks(4, *port, FastOptions(), [&](World& world) -> absl::Status {
    PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world, *topology));
    const std::vector<int> tie = {3, 0};  // group rank = index
    const bool member = world.rank == 0 || world.rank == 3;
    absl::StatusOr<ProcessGroupPtr> group = grid.NewGroup(tie, "tied.embedding");
    if (!member) {
      return Expect(absl::IsInvalidArgument(group.status()) &&
                        absl::StrContains(group.status().message(), "not a member of [3,0]"),
                    group.status().ToString());
    }
    PP_RETURN_IF_ERROR(group.status());
    PP_RETURN_IF_ERROR(
        Expect((*group)->getRank() == (world.rank == 3 ? 0 : 1), "tie group rank order"));
    PP_ASSIGN_OR_RETURN(int64_t sum, AllReduceSum(*group, world.rank + 10));
    PP_RETURN_IF_ERROR(Expect(sum == 23, absl::StrCat("tie all-reduce ", sum)));
    auto again = grid.NewGroup(tie, "tied.embedding");
    return Expect(absl::StrContains(again.status().message(), "already made"),
                  again.status().ToString());
  });
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_TRUE(status[rank].ok()) << rank << ": " << status[rank];
}

TEST_F(ParallelGridTest, NewGroupRejectsBadRanks) {
  auto topology = PipeDataParallelTopology(1, 1);
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  auto status = RunThreadRanks(1, *port, FastOptions(), [&](World& world) -> absl::Status {
    PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world, *topology));
    auto dup = grid.NewGroup({0, 0}, "dup");
    PP_RETURN_IF_ERROR(
        Expect(absl::StrContains(dup.status().message(), "twice: [0,0]"), dup.status().ToString()));
    auto range = grid.NewGroup({0, 5}, "range");
    PP_RETURN_IF_ERROR(
        Expect(absl::StrContains(range.status().message(), "[0,5]"), range.status().ToString()));
    auto unnamed = grid.NewGroup({0}, "");
    return Expect(absl::IsInvalidArgument(unnamed.status()), unnamed.status().ToString());
  });
  EXPECT_TRUE(status[0].ok()) << status[0];
}

TEST_F(ParallelGridTest, MemberThatNeverJoinsTimesOut) {
  auto topology = PipeDataParallelTopology(2, 1);
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(2);
  auto status = RunThreadRanks(2, *port, options, [&](World& world) -> absl::Status {
    PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world, *topology));
    if (world.rank == 1) return absl::OkStatus();  // never calls NewGroup
    const auto start = std::chrono::steady_clock::now();
    auto group = grid.NewGroup({0, 1}, "lonely");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    PP_RETURN_IF_ERROR(Expect(absl::IsDeadlineExceeded(group.status()), group.status().ToString()));
    return Expect(seconds < 10, absl::StrCat("took ", seconds, " s"));
  });
  EXPECT_TRUE(status[0].ok()) << status[0];
  EXPECT_TRUE(status[1].ok()) << status[1];
}

TEST_F(ParallelGridTest, RecvWithoutSenderTimesOut) {
  auto topology = PipeDataParallelTopology(2, 1);
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(2);
  auto status = RunThreadRanks(2, *port, options, [&](World& world) -> absl::Status {
    PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world, *topology));
    if (grid.IsFirstStage()) return absl::OkStatus();  // never sends
    std::vector<at::Tensor> in = {at::zeros({4})};
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = TorchCall("recv from the previous stage", [&] {
      // pipe_group() ranks are stage ids.
      grid.pipe_group()->recv(in, grid.stage_id() - 1, /*tag=*/0)->wait();
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    PP_RETURN_IF_ERROR(Expect(!s.ok(), "recv without a sender completed"));
    return Expect(seconds < 10, absl::StrCat("recv gave up after ", seconds, " s: ", s.message()));
  });
  EXPECT_TRUE(status[0].ok()) << status[0];
  EXPECT_TRUE(status[1].ok()) << status[1];
}

TEST_F(ParallelGridTest, WorldSizeMustMatchTopology) {
  auto topology = PipeDataParallelTopology(2, 2);
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  auto status = RunThreadRanks(1, *port, FastOptions(), [&](World& world) -> absl::Status {
    return ParallelGrid::Create(world, *topology).status();
  });
  EXPECT_EQ(status[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status[0].message(), HasSubstr("world size 1"));
  EXPECT_THAT(status[0].message(), HasSubstr("needs 4 ranks"));
}

TEST_F(ParallelGridTest, NeedsPipeAxis) {
  auto topology = ProcessTopology::Create({"data"}, {1});
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  auto status = RunThreadRanks(1, *port, FastOptions(), [&](World& world) -> absl::Status {
    return ParallelGrid::Create(world, *topology).status();
  });
  EXPECT_THAT(status[0].message(), HasSubstr("no 'pipe' axis"));
}

}  // namespace
}  // namespace pp
