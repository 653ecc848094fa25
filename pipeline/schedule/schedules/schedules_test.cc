// Exact orders of the built-in schedules against the published rules
// (/work/shared/references/schedules.md, "Ordering rules") and hand-checked
// examples.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pipeline/schedule/ir/schedule.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

Schedule MustMake(const std::string& name, int p, int m, int v = 1, int g = 0) {
  absl::StatusOr<Schedule> s = MakeSchedule(name, {p, m, v, g});
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Schedule{};
}

std::string Rank(const Schedule& s, int r) { return ActionsToString(s.ranks[r]); }

TEST(RegistryTest, ListsBuiltInsAndRejectsUnknownNames) {
  std::vector<std::string> names = RegisteredScheduleNames();
  for (const char* name : {"gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "inference", "zb_h1",
                           "zb_h2", "zbv", "vhalf", "dualpipev", "interleaved_zb"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  absl::StatusOr<Schedule> s = MakeSchedule("2f2b", {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("1f1b"));
  for (const ScheduleInfo& info : RegisteredSchedules()) {
    EXPECT_FALSE(info.description.empty()) << info.name;
  }
}

TEST(RegistryDeathTest, DuplicateNameAbortsWithTheName) {
  EXPECT_DEATH(RegisterSchedule(
                   {"gpipe", "again",
                    [](const ScheduleOptions&) { return absl::StatusOr<Schedule>(Schedule{}); }}),
               "\"gpipe\" registered twice");
}

TEST(GPipeTest, AllForwardsThenAllBackwards) {
  Schedule s = MustMake("gpipe", 2, 3);
  EXPECT_EQ(Rank(s, 0), "0F0 0F1 0F2 0B0 0B1 0B2");
  EXPECT_EQ(Rank(s, 1), "1F0 1F1 1F2 1B0 1B1 1B2");
  EXPECT_EQ(MakeSchedule("gpipe", {2, 3, 2, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(OneFOneBTest, WarmupSteadyCooldown) {
  Schedule s = MustMake("1f1b", 4, 8);
  EXPECT_EQ(Rank(s, 0), "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7");
  EXPECT_EQ(Rank(s, 2), "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7");
  EXPECT_EQ(Rank(s, 3), "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7");
}

TEST(OneFOneBTest, FewerMicrobatchesThanStages) {
  Schedule s = MustMake("1f1b", 4, 2);
  EXPECT_EQ(Rank(s, 0), "0F0 0F1 0B0 0B1");  // warm-up min(3, 2) = 2
  EXPECT_EQ(Rank(s, 2), "2F0 2F1 2B0 2B1");  // warm-up 1: F0, then F1 B0
  EXPECT_EQ(Rank(s, 3), "3F0 3B0 3F1 3B1");
}

TEST(Interleaved1F1BTest, TwoStagesFourMicrobatchesTwoChunks) {
  // g = p = 2; table (mb, chunk): (0,0)(1,0)(0,1)(1,1)(2,0)(3,0)(2,1)(3,1).
  Schedule s = MustMake("interleaved_1f1b", 2, 4, 2);
  // Rank 0: warm-up 2*1 + 1*2 = 4.
  EXPECT_EQ(Rank(s, 0), "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");
  // Rank 1: warm-up 0 + 2 = 2.
  EXPECT_EQ(Rank(s, 1), "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3");
}

TEST(Interleaved1F1BTest, MegatronFigureFourStagesEightMicrobatches) {
  // Narayanan et al. 2021, Fig. 4 (p = 4, m = 8, v = 2), device 1: ten
  // warm-up forwards (mbs 1-4 chunk 1, 1-4 chunk 2, 5-6 chunk 1, 1-based),
  // then forward/backward pairs with backwards of chunk 2 first.
  Schedule s = MustMake("interleaved_1f1b", 4, 8, 2);
  EXPECT_EQ(Rank(s, 0),
            "0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 0F4 0F5 "
            "0F6 4B0 0F7 4B1 4F4 4B2 4F5 4B3 4F6 0B0 4F7 0B1 "
            "0B2 0B3 4B4 4B5 4B6 4B7 0B4 0B5 0B6 0B7");
  // Last device: warm-up (v - 1) g = 4.
  EXPECT_EQ(Rank(s, 3),
            "3F0 3F1 3F2 3F3 7F0 7B0 7F1 7B1 7F2 7B2 7F3 7B3 3F4 3B0 3F5 3B1 "
            "3F6 3B2 3F7 3B3 7F4 7B4 7F5 7B5 7F6 7B6 7F7 7B7 3B4 3B5 3B6 3B7");
}

TEST(Interleaved1F1BTest, GroupSizeAndRemainderGroup) {
  // p = 2, m = 5, g = 3: groups [0,3) and [3,5) (5 % 3 = 2 >= p).
  Schedule s = MustMake("interleaved_1f1b", 2, 5, 2, 3);
  // Table: (0,0)(1,0)(2,0)(0,1)(1,1)(2,1)(3,0)(4,0)(3,1)(4,1);
  // rank 1 warm-up = 0 + 1 * 3 = 3.
  EXPECT_EQ(Rank(s, 1),
            "1F0 1F1 1F2 3F0 3B0 3F1 3B1 3F2 3B2 1F3 1B0 1F4 1B1 3F3 1B2 3F4 "
            "3B3 3B4 1B3 1B4");
}

TEST(Interleaved1F1BTest, GroupEqualToMicrobatchesIsBreadthFirstForwards) {
  // g = m: every forward of chunk 0 before any of chunk 1, as in looped BFS;
  // rank 0 warms up with 2 (p - 1) + (v - 1) m = 6 forwards.
  Schedule s = MustMake("interleaved_1f1b", 2, 4, 2, 4);
  std::vector<Action> forwards;
  for (const Action& a : s.ranks[0]) {
    if (a.type == ActionType::kForward) forwards.push_back(a);
  }
  EXPECT_EQ(ActionsToString(forwards), "0F0 0F1 0F2 0F3 2F0 2F1 2F2 2F3");
  EXPECT_EQ(Rank(s, 0).substr(0, 31), "0F0 0F1 0F2 0F3 2F0 2F1 2F2 2B0");
}

TEST(Interleaved1F1BTest, GroupRuleViolationsNameTheRuleAndValues) {
  for (ScheduleOptions o : {ScheduleOptions{4, 2, 2, 4},     // m < p with a group size
                            ScheduleOptions{4, 6, 2, 0},     // 6 % 4 = 2 < 4
                            ScheduleOptions{4, 8, 2, 3},     // g < p
                            ScheduleOptions{4, 8, 2, 9}}) {  // g > m
    absl::StatusOr<Schedule> s = MakeSchedule("interleaved_1f1b", o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.status().message()),
                HasSubstr("p <= g <= m and (m % g == 0 or m % g >= p)"));
    EXPECT_THAT(std::string(s.status().message()),
                HasSubstr("m=" + std::to_string(o.num_microbatches)));
  }
  // m < p without a group size: PyTorch's one round of m (orders compared
  // with PyTorch's in pytorch_interop_test), here p = 4, m = 2, v = 2 rank 0:
  // warm-up (v - 1) m + 2 (p - 1) = 8 capped at v m = 4.
  Schedule one_round = MustMake("interleaved_1f1b", 4, 2, 2);
  EXPECT_EQ(Rank(one_round, 0), "0F0 0F1 4F0 4F1 4B0 4B1 0B0 0B1");
  EXPECT_EQ(Rank(one_round, 3), "3F0 3F1 7F0 7B0 7F1 7B1 3B0 3B1");
  // m = 6, g = 4: 6 % 4 = 2 >= p = 2 is accepted; m = 5, g = 2: 1 < 2 is not.
  EXPECT_TRUE(MakeSchedule("interleaved_1f1b", {2, 6, 2, 4}).ok());
  EXPECT_FALSE(MakeSchedule("interleaved_1f1b", {2, 5, 2, 2}).ok());
}

TEST(LoopedBFSTest, ChunksBreadthFirstBackwardsReversed) {
  Schedule s = MustMake("looped_bfs", 2, 2, 2);
  EXPECT_EQ(Rank(s, 0), "0F0 0F1 2F0 2F1 2B1 2B0 0B1 0B0");
  EXPECT_EQ(Rank(s, 1), "1F0 1F1 3F0 3F1 3B1 3B0 1B1 1B0");
  EXPECT_EQ(s.stage_to_rank, (std::vector<int>{0, 1, 0, 1}));
}

TEST(InferenceTest, ForwardOnlyInOrder) {
  Schedule s = MustMake("inference", 2, 3);
  EXPECT_TRUE(s.forward_only);
  EXPECT_EQ(Rank(s, 0), "0F0 0F1 0F2");
  EXPECT_EQ(Rank(s, 1), "1F0 1F1 1F2");
}

// zb_h1, p = 4, m = 8, by hand from the rule in zero_bubble.cc: rank r warms
// up with p - 1 - r forwards (1F1B's), then F, I pairs; a W follows an I once
// more than r I's wait for their W; the remaining W's close the rank.
TEST(ZeroBubbleTest, H1OrderFourStagesEightMicrobatches) {
  Schedule s = MustMake("zb_h1", 4, 8);
  // r = 0: delay 0, every I is followed by its W.
  EXPECT_EQ(Rank(s, 0),
            "0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0F6 0I3 0W3 0F7 0I4 0W4 "
            "0I5 0W5 0I6 0W6 0I7 0W7");
  // r = 1: warm-up 2, the first W after the second I.
  EXPECT_EQ(Rank(s, 1),
            "1F0 1F1 1F2 1I0 1F3 1I1 1W0 1F4 1I2 1W1 1F5 1I3 1W2 1F6 1I4 1W3 1F7 1I5 1W4 "
            "1I6 1W5 1I7 1W6 1W7");
  // r = 3: no warm-up; W0 waits for four I's; three W's at the end.
  EXPECT_EQ(Rank(s, 3),
            "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3F6 3I6 3W3 3F7 3I7 "
            "3W4 3W5 3W6 3W7");
}

// zb_h2, p = 4, m = 8: warm-up 2(p - 1 - r), W delay 2r.
TEST(ZeroBubbleTest, H2OrderFourStagesEightMicrobatches) {
  Schedule s = MustMake("zb_h2", 4, 8);
  EXPECT_EQ(Rank(s, 0),
            "0F0 0F1 0F2 0F3 0F4 0F5 0F6 0I0 0W0 0F7 0I1 0W1 0I2 0W2 0I3 0W3 0I4 0W4 "
            "0I5 0W5 0I6 0W6 0I7 0W7");
  EXPECT_EQ(Rank(s, 2),
            "2F0 2F1 2F2 2I0 2F3 2I1 2F4 2I2 2F5 2I3 2F6 2I4 2W0 2F7 2I5 2W1 2I6 2W2 2I7 2W3 "
            "2W4 2W5 2W6 2W7");
  EXPECT_EQ(Rank(s, 3),
            "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3F4 3I4 3F5 3I5 3F6 3I6 3W0 3F7 3I7 3W1 "
            "3W2 3W3 3W4 3W5 3W6 3W7");
}

TEST(ZeroBubbleTest, FewMicrobatchesAndChunksRejected) {
  Schedule s = MustMake("zb_h2", 4, 2);
  EXPECT_EQ(Rank(s, 0), "0F0 0F1 0I0 0W0 0I1 0W1");  // warm-up min(6, 2)
  EXPECT_EQ(Rank(s, 3), "3F0 3I0 3F1 3I1 3W0 3W1");  // delay 6 > m
  for (const char* name : {"zb_h1", "zb_h2"}) {
    absl::StatusOr<Schedule> bad = MakeSchedule(name, {4, 8, 2, 0});
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("num_chunks (2)"));
  }
}

// zbv, p = 2, m = 4 (n = max(2p - 1, m) = 4, nothing dropped), by hand from
// the phases in zbv.cc (PyTorch's ScheduleZBVZeroBubble). Rank 0 holds stages
// 0 and 3, rank 1 stages 1 and 2.
TEST(ZbvTest, OrderTwoRanksFourMicrobatches) {
  Schedule s = MustMake("zbv", 2, 4, 2);
  EXPECT_EQ(s.stage_to_rank, (std::vector<int>{0, 1, 1, 0}));
  // Warm-up 1: three F of stage 0; warm-up 3: two (F, I, W) of stage 3;
  // stable: F3, I/W 0, F/I/W of stage 3, twice (the second without F);
  // cool-down: two (I, W) of stage 0.
  EXPECT_EQ(Rank(s, 0),
            "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 "
            "0I2 0W2 0I3 0W3");
  // Warm-up 1: one F of stage 1; warm-up 2: 2F0 1F1; warm-up 3: 2F1 2I0 2W0;
  // stable twice; cool-down: 1I2 2I3, then 1I3 1W2, then 2W3, then 1W3.
  EXPECT_EQ(Rank(s, 1),
            "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 "
            "1I3 1W2 2W3 1W3");
}

// m < 2p - 1: generated for n = 2p - 1, micro-batches >= m dropped (PyTorch
// leaves idle cells there); two chunks are required.
TEST(ZbvTest, FewMicrobatchesAndChunkCount) {
  Schedule s = MustMake("zbv", 2, 1, 2);
  EXPECT_EQ(Rank(s, 0), "0F0 3F0 3I0 3W0 0I0 0W0");
  EXPECT_EQ(Rank(s, 1), "1F0 2F0 2I0 2W0 1I0 1W0");
  for (int v : {1, 3}) {
    absl::StatusOr<Schedule> bad = MakeSchedule("zbv", {2, 4, v, 0});
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << v;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("must be 2"));
  }
}

// vhalf (vhalf.cc), p = 4, m = 8: V placement, and the squeezed warm-up
// fills the building block's memory (p + 2 = 6 virtual-stage activations)
// before the first backward: rank 0 runs five forwards of stage 0, then stage
// 7's first forward, whose I and W come at once; the last rank hands stage 3
// to stage 4 locally, forward after forward.
TEST(VHalfTest, WarmupFillsTheBlocksMemory) {
  Schedule s = MustMake("vhalf", 4, 8, 2);
  EXPECT_EQ(s.stage_to_rank, VPlacement(4));
  EXPECT_THAT(Rank(s, 0), StartsWith("0F0 0F1 0F2 0F3 0F4 7F0 7I0 7W0 7F1 "));
  EXPECT_THAT(Rank(s, 3), StartsWith("3F0 4F0 3F1 4F1 3F2 4F2 4I0 4W0 3I0 3W0 "));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(s.ranks[r].size(), 6u * 8) << r;
  for (int v : {1, 3}) {
    absl::StatusOr<Schedule> bad = MakeSchedule("vhalf", {4, 8, v, 0});
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << v;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("must be 2"));
  }
}

// dualpipev, derived by hand from the eight steps in dualpipev.cc (PyTorch's
// ScheduleDualPipeV._calculate_single_rank_operations). p = 2, m = 4: rank 0
// holds stages 0 and 3, rank 1 stages 1 and 2.
TEST(DualPipeVTest, OrderTwoRanksFourMicrobatches) {
  Schedule s = MustMake("dualpipev", 2, 4, 2);
  EXPECT_EQ(s.stage_to_rank, (std::vector<int>{0, 1, 1, 0}));
  // Rank 0: step 1 two F0's; step 2 one (F0, F1); step 3 one (I1, W, F1);
  // step 4 m - 2p + 1 = 1 x two pairs; step 5 one (B1, pair); step 6 one
  // (B1, then I0: even rank, switch between); step 7 one (W, I0); step 8 W.
  EXPECT_EQ(Rank(s, 0),
            "0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1)OVERLAP_F_B (3F2;0B0)OVERLAP_F_B 3B2 "
            "(3F3;0B1)OVERLAP_F_B 3B3 0I2 0W2 0I3 0W3");
  // Rank 1 (last): step 2 two (F0, F1); step 4 two iterations, the first
  // with F0, B1 unpaired; step 6 two (X1, X0), B then I (odd rank: switch
  // before the second iteration's stage-1 action); step 8 two W.
  EXPECT_EQ(Rank(s, 1),
            "1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0)OVERLAP_F_B (1F3;2B1)OVERLAP_F_B "
            "(2F3;1B1)OVERLAP_F_B 2B2 1B2 2I3 1I3 2W3 1W3");
}

TEST(DualPipeVTest, OrderTwoRanksEightMicrobatches) {
  Schedule s = MustMake("dualpipev", 2, 8, 2);
  // Step 4 now runs m - 2p + r + 1 = 5 (rank 0) and 6 (rank 1) times.
  EXPECT_EQ(Rank(s, 0),
            "0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1)OVERLAP_F_B (3F2;0B0)OVERLAP_F_B "
            "(0F4;3B2)OVERLAP_F_B (3F3;0B1)OVERLAP_F_B (0F5;3B3)OVERLAP_F_B "
            "(3F4;0B2)OVERLAP_F_B (0F6;3B4)OVERLAP_F_B (3F5;0B3)OVERLAP_F_B "
            "(0F7;3B5)OVERLAP_F_B (3F6;0B4)OVERLAP_F_B 3B6 (3F7;0B5)OVERLAP_F_B 3B7 0I6 0W6 "
            "0I7 0W7");
  EXPECT_EQ(Rank(s, 1),
            "1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0)OVERLAP_F_B (1F3;2B1)OVERLAP_F_B "
            "(2F3;1B1)OVERLAP_F_B (1F4;2B2)OVERLAP_F_B (2F4;1B2)OVERLAP_F_B "
            "(1F5;2B3)OVERLAP_F_B (2F5;1B3)OVERLAP_F_B (1F6;2B4)OVERLAP_F_B "
            "(2F6;1B4)OVERLAP_F_B (1F7;2B5)OVERLAP_F_B (2F7;1B5)OVERLAP_F_B 2B6 1B6 2I7 1I7 "
            "2W7 1W7");
}

TEST(DualPipeVTest, OrderFourRanksEightMicrobatches) {
  Schedule s = MustMake("dualpipev", 4, 8, 2);
  EXPECT_EQ(s.stage_to_rank, (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0}));
  // Rank 0 (stages 0, 7): 6 F0; (0F6, 7F0); 3 x (I1, W, F1); 1 x two pairs;
  // 3 x (B1, pair); step 6 (7B7, then I0); 3 x (W, I0); one W.
  EXPECT_EQ(Rank(s, 0),
            "0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0 7F1 7I1 7W1 7F2 7I2 7W2 7F3 "
            "(0F7;7B3)OVERLAP_F_B (7F4;0B0)OVERLAP_F_B 7B4 (7F5;0B1)OVERLAP_F_B 7B5 "
            "(7F6;0B2)OVERLAP_F_B 7B6 (7F7;0B3)OVERLAP_F_B 7B7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7");
  // Rank 1 (stages 1, 6): the W queue mixes stages: 6I7 1I5 then W pops 6W7.
  EXPECT_EQ(Rank(s, 1),
            "1F0 1F1 1F2 1F3 1F4 6F0 1F5 6F1 6I0 6W0 6F2 6I1 6W1 6F3 (1F6;6B2)OVERLAP_F_B "
            "(6F4;1B0)OVERLAP_F_B (1F7;6B3)OVERLAP_F_B (6F5;1B1)OVERLAP_F_B 6B4 "
            "(6F6;1B2)OVERLAP_F_B 6B5 (6F7;1B3)OVERLAP_F_B 6B6 1B4 6I7 1I5 6W7 1I6 1W5 1I7 1W6 "
            "1W7");
  // Rank 2 (stages 2, 5; even): step 6 switches to I between 5B6 and 2I5.
  EXPECT_EQ(Rank(s, 2),
            "2F0 2F1 2F2 5F0 2F3 5F1 2F4 5F2 5I0 5W0 5F3 (2F5;5B1)OVERLAP_F_B "
            "(5F4;2B0)OVERLAP_F_B (2F6;5B2)OVERLAP_F_B (5F5;2B1)OVERLAP_F_B "
            "(2F7;5B3)OVERLAP_F_B (5F6;2B2)OVERLAP_F_B 5B4 (5F7;2B3)OVERLAP_F_B 5B5 2B4 5B6 "
            "2I5 5I7 2I6 2W5 2I7 5W7 2W6 2W7");
  // Rank 3 (stages 3, 4; last): 3F4 and 4B0 unpaired in the first step 4.
  EXPECT_EQ(Rank(s, 3),
            "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 3F4 4B0 (4F4;3B0)OVERLAP_F_B "
            "(3F5;4B1)OVERLAP_F_B (4F5;3B1)OVERLAP_F_B (3F6;4B2)OVERLAP_F_B "
            "(4F6;3B2)OVERLAP_F_B (3F7;4B3)OVERLAP_F_B (4F7;3B3)OVERLAP_F_B 4B4 3B4 4B5 3B5 "
            "4I6 3I6 4I7 3I7 4W6 3W6 4W7 3W7");
}

// PyTorch's errors: exactly two local stages, m >= 2p (its stage count).
TEST(DualPipeVTest, RejectsWhatPyTorchRejects) {
  for (int v : {1, 3}) {
    absl::StatusOr<Schedule> bad = MakeSchedule("dualpipev", {2, 8, v, 0});
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << v;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("num_chunks (" + std::to_string(v)));
  }
  absl::StatusOr<Schedule> few = MakeSchedule("dualpipev", {4, 7, 2, 0});
  EXPECT_EQ(few.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(few.status().message()),
              HasSubstr("num_microbatches (7) must be >= 2 * num_stages = 8"));
  EXPECT_TRUE(MakeSchedule("dualpipev", {4, 8, 2, 0}).ok());
  EXPECT_TRUE(MakeSchedule("dualpipev", {1, 2, 2, 0}).ok());
}

// interleaved_zb, p = 2, m = 4, v = 2, by hand from the rules in
// interleaved_zb.cc: rounds = 2, mpr = 2, warm-up 3 (rank 0) and 2 (rank 1);
// forward chunks of ops 0..7: 0 0 1 1 0 0 1 1; W from op warm-up + r on.
TEST(InterleavedZbTest, OrderTwoRanksFourMicrobatchesTwoChunks) {
  Schedule s = MustMake("interleaved_zb", 2, 4, 2);
  EXPECT_EQ(s.stage_to_rank, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(Rank(s, 0),
            "0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 2F3 2I2 2W2 2I3 2W3 "
            "0I2 0W2 0I3 0W3");
  EXPECT_EQ(Rank(s, 1),
            "1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 "
            "3W3 1I3 1W2 1W3");
}

// p = 4, m = 8, v = 2, rank 3: rounds 2, mpr 4, warm-up 4; backward chunks
// of ops 4..: 1 1 1 1 0 0 0 0 1 1 1 1 0 0 0 0; the first W at op 7.
TEST(InterleavedZbTest, LastRankFourStagesEightMicrobatches) {
  Schedule s = MustMake("interleaved_zb", 4, 8, 2);
  EXPECT_EQ(Rank(s, 3),
            "3F0 3F1 3F2 3F3 7F0 7I0 7F1 7I1 7F2 7I2 7F3 7I3 7W0 3F4 3I0 7W1 3F5 3I1 7W2 3F6 "
            "3I2 7W3 3F7 3I3 3W0 7F4 7I4 3W1 7F5 7I5 3W2 7F6 7I6 3W3 7F7 7I7 7W4 3I4 7W5 3I5 "
            "7W6 3I6 7W7 3I7 3W4 3W5 3W6 3W7");
}

// PyTorch's one rule: m a multiple of rounds = max(1, m / p).
TEST(InterleavedZbTest, RoundsRule) {
  for (auto [p, m] : std::vector<std::pair<int, int>>{{2, 5}, {3, 7}, {4, 9}}) {
    absl::StatusOr<Schedule> bad = MakeSchedule("interleaved_zb", {p, m, 2, 0});
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << p << " " << m;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("multiple of the number of rounds"));
  }
  for (auto [p, m] : std::vector<std::pair<int, int>>{{4, 3}, {4, 6}, {4, 10}, {3, 9}}) {
    EXPECT_TRUE(MakeSchedule("interleaved_zb", {p, m, 2, 0}).ok()) << p << " " << m;
  }
}

TEST(PlacementTest, VPlacementPutsTheBottomOfTheVOnTheLastRank) {
  EXPECT_EQ(VPlacement(1), (std::vector<int>{0, 0}));
  EXPECT_EQ(VPlacement(4), (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0}));
}

TEST(FormatGridTest, AMarkShowsTheStepsAroundIt) {
  RankActions ranks(2);
  for (int mb = 0; mb < 100; ++mb) {
    ranks[0].push_back(F(0, mb));
    ranks[1].push_back(F(1, mb));
  }
  const std::string grid = FormatGrid(ranks, GridMark{1, 50});
  EXPECT_THAT(grid, HasSubstr("[1F50]   <-- here"));
  EXPECT_THAT(grid, HasSubstr("... steps 0-39 not shown"));
  EXPECT_THAT(grid, HasSubstr("   40   0F40"));
  EXPECT_THAT(grid, HasSubstr("   60   0F60"));
  EXPECT_THAT(grid, HasSubstr("... steps 61-99 not shown"));
  EXPECT_THAT(grid, ::testing::Not(HasSubstr("0F39")));
  EXPECT_THAT(grid, ::testing::Not(HasSubstr("0F61")));
  // Without a mark, and with few steps, every step.
  EXPECT_THAT(FormatGrid(ranks), HasSubstr("   99   0F99"));
  EXPECT_THAT(FormatGrid(ranks), ::testing::Not(HasSubstr("not shown")));
  RankActions few = {{F(0, 0), F(0, 1)}, {F(1, 0)}};
  EXPECT_EQ(FormatGrid(few, GridMark{1, 1}),
            " step  rank 0  rank 1\n"
            "    0   0F0     1F0\n"
            "    1   0F1    [ ]   <-- here\n");
}

}  // namespace
}  // namespace pp
