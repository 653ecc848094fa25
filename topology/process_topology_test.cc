#include "topology/process_topology.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Lists = std::vector<std::vector<int>>;

ProcessTopology Make(std::vector<std::string> axes, std::vector<int> dims) {
  auto topo = ProcessTopology::Create(std::move(axes), std::move(dims));
  EXPECT_TRUE(topo.ok()) << topo.status();
  return *topo;
}

TEST(ProcessTopologyTest, TwoByTwoIsRowMajor) {
  ProcessTopology topo = Make({"row", "col"}, {2, 2});
  EXPECT_EQ(topo.world_size(), 4);
  EXPECT_EQ(*topo.GetRank({{"row", 0}, {"col", 0}}), 0);
  EXPECT_EQ(*topo.GetRank({{"row", 0}, {"col", 1}}), 1);
  EXPECT_EQ(*topo.GetRank({{"row", 1}, {"col", 0}}), 2);
  EXPECT_EQ(*topo.GetRank({{"row", 1}, {"col", 1}}), 3);
  // Ranks sharing a row differ in the column coordinate, and vice versa.
  EXPECT_EQ(topo.AxisCommLists("col"), (Lists{{0, 1}, {2, 3}}));
  EXPECT_EQ(topo.AxisCommLists("row"), (Lists{{0, 2}, {1, 3}}));
}

TEST(ProcessTopologyTest, CoordRoundTripsForEveryRank) {
  ProcessTopology topo = Make({"a", "b", "c"}, {2, 3, 4});
  EXPECT_EQ(topo.world_size(), 24);
  for (int rank = 0; rank < 24; ++rank) {
    auto coord = topo.GetCoord(rank);
    ASSERT_TRUE(coord.ok());
    EXPECT_EQ((*coord)[0], rank / 12);
    EXPECT_EQ((*coord)[1], (rank / 4) % 3);
    EXPECT_EQ((*coord)[2], rank % 4);
    EXPECT_EQ(*topo.GetRankOfCoord(*coord), rank);
    EXPECT_EQ(*topo.GetRank({{"a", (*coord)[0]}, {"b", (*coord)[1]}, {"c", (*coord)[2]}}), rank);
    EXPECT_EQ(*topo.GetAxisValue(rank, "b"), (*coord)[1]);
  }
}

TEST(ProcessTopologyTest, PipeModelDataCommLists) {
  auto topo = PipeModelDataParallelTopology(/*pp=*/2, /*mp=*/2, /*dp=*/2);
  ASSERT_TRUE(topo.ok());
  EXPECT_THAT(topo->axes(), ElementsAre("pipe", "data", "model"));
  EXPECT_EQ(topo->AxisCommLists("pipe"), (Lists{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(topo->AxisCommLists("data"), (Lists{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(topo->AxisCommLists("model"), (Lists{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_TRUE(topo->AxisCommLists("jeff").empty());
}

TEST(ProcessTopologyTest, CommListsPartitionTheRanks) {
  ProcessTopology topo = Make({"x", "y", "z"}, {3, 1, 2});
  for (const std::string axis : {"x", "y", "z"}) {
    std::vector<int> seen(topo.world_size(), 0);
    for (const auto& list : topo.AxisCommLists(axis)) {
      EXPECT_EQ(static_cast<int>(list.size()), topo.GetDim(axis));
      for (size_t k = 0; k < list.size(); ++k) {
        ++seen[list[k]];
        // A rank's index in its list is its coordinate on the axis.
        EXPECT_EQ(*topo.GetAxisValue(list[k], axis), static_cast<int>(k));
      }
    }
    EXPECT_THAT(seen, ::testing::Each(1)) << axis;
  }
}

TEST(ProcessTopologyTest, FilterMatch) {
  auto topo = PipeModelDataParallelTopology(2, 2, 2);
  ASSERT_TRUE(topo.ok());
  EXPECT_THAT(*topo->FilterMatch({{"pipe", 0}, {"data", 1}}), ElementsAre(2, 3));
  EXPECT_THAT(*topo->FilterMatch({{"model", 1}}), ElementsAre(1, 3, 5, 7));
  EXPECT_EQ(topo->FilterMatch({}).value().size(), 8u);
  EXPECT_THAT(topo->FilterMatch({{"tensor", 0}}).status().message(), HasSubstr("'tensor'"));
  EXPECT_THAT(topo->FilterMatch({{"pipe", 2}}).status().message(), HasSubstr("pipe=2"));
}

TEST(ProcessTopologyTest, GetDim) {
  auto topo = PipeDataParallelTopology(4, 3);
  ASSERT_TRUE(topo.ok());
  EXPECT_EQ(topo->GetDim("pipe"), 4);
  EXPECT_EQ(topo->GetDim("data"), 3);
  EXPECT_EQ(topo->GetDim("model"), 0);
  EXPECT_EQ(topo->world_size(), 12);
}

TEST(ProcessTopologyTest, RankRepr) {
  ProcessTopology topo = Make({"a", "b"}, {2, 2});
  EXPECT_EQ(*topo.RankRepr(1), "a_00-b_01");
  EXPECT_EQ(*topo.RankRepr(2, {}, "=", "/"), "a=01/b=00");
  EXPECT_EQ(*PipeDataParallelTopology(2, 2)->RankRepr(3), "");
  auto pmd = PipeModelDataParallelTopology(2, 2, 2);
  EXPECT_EQ(*pmd->RankRepr(0), "model_00");
  EXPECT_EQ(*pmd->RankRepr(5), "model_01");
  EXPECT_EQ(*pmd->RankRepr(5, {"pipe"}), "data_00-model_01");
}

TEST(ProcessTopologyTest, RankReprRejectsRanksOutsideTheWorld) {
  ProcessTopology topo = Make({"a", "b"}, {2, 2});
  for (int rank : {-1, 4}) {
    absl::StatusOr<std::string> repr = topo.RankRepr(rank);
    EXPECT_EQ(repr.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(repr.status().message(), HasSubstr(absl::StrCat("rank ", rank)));
    EXPECT_THAT(repr.status().message(), HasSubstr("[0, 4)"));
  }
}

TEST(ProcessTopologyTest, RejectsBadInput) {
  auto zero = ProcessTopology::Create({"pipe", "data"}, {2, 0});
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("'data' is 0"));
  auto dup = ProcessTopology::Create({"pipe", "pipe"}, {2, 2});
  EXPECT_THAT(dup.status().message(), HasSubstr("duplicate topology axis 'pipe'"));
  auto mismatch = ProcessTopology::Create({"pipe"}, {2, 2});
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(PipeDataParallelTopology(-1, 2).status().message(), HasSubstr("-1"));

  ProcessTopology topo = Make({"pipe", "data"}, {2, 3});
  EXPECT_THAT(topo.GetRank({{"pipe", 1}, {"data", 3}}).status().message(),
              HasSubstr("data=3 is out of range [0, 3)"));
  EXPECT_THAT(topo.GetRank({{"pipe", 1}}).status().message(), HasSubstr("missing axis 'data'"));
  EXPECT_THAT(topo.GetRank({{"pipe", 1}, {"data", 0}, {"model", 0}}).status().message(),
              HasSubstr("'model'"));
  EXPECT_THAT(topo.GetRankOfCoord({1}).status().message(), HasSubstr("[1]"));
  EXPECT_THAT(topo.GetCoord(6).status().message(), HasSubstr("rank 6"));
  EXPECT_THAT(topo.GetCoord(-1).status().message(), HasSubstr("rank -1"));
}

TEST(ProcessTopologyTest, DefaultIsOneRank) {
  ProcessTopology topo;
  EXPECT_EQ(topo.world_size(), 1);
  EXPECT_EQ(topo.GetCoord(0).value().size(), 0u);
  EXPECT_EQ(topo, *ProcessTopology::Create({}, {}));
  EXPECT_NE(topo, *PipeDataParallelTopology(1, 1));
}

}  // namespace
}  // namespace pp
