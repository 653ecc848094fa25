#include "pipeline/schedule/ir/action.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pp {
namespace {

using ::testing::HasSubstr;

TEST(ActionTest, PrintsPyTorchNotation) {
  EXPECT_EQ(ActionToString(F(0, 3)), "0F3");
  EXPECT_EQ(ActionToString(B(12, 0)), "12B0");
  EXPECT_EQ(ActionToString({1, ActionType::kRecvForward, 3}), "1RECV_F3");
  EXPECT_EQ(ActionToString({2, ActionType::kSendBackward, 10}), "2SEND_B10");
  EXPECT_EQ(ActionToString({3, ActionType::kReduceGrads, -1}), "3REDUCE_GRAD");
  EXPECT_EQ(ActionToString({-1, ActionType::kReduceTiedGrads, -1}), "REDUCE_TIED");
  EXPECT_EQ(ActionToString({-1, ActionType::kOptimizerStep, -1}), "STEP");
}

TEST(ActionTest, ParseAndPrintRoundTripEveryType) {
  const std::vector<std::string> texts = {"0F3",          "1B0",         "2I1",       "2W1",
                                          "1SEND_F3",     "2RECV_F3",    "3SEND_B11", "0RECV_B7",
                                          "5REDUCE_GRAD", "REDUCE_TIED", "STEP"};
  for (const std::string& text : texts) {
    absl::StatusOr<Action> action = ParseAction(text);
    ASSERT_TRUE(action.ok()) << text << ": " << action.status();
    EXPECT_EQ(ActionToString(*action), text);
    EXPECT_EQ(*ParseAction(ActionToString(*action)), *action);
  }
}

TEST(ActionTest, ParsesFields) {
  absl::StatusOr<Action> a = ParseAction(" 14RECV_B27 ");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->stage, 14);
  EXPECT_EQ(a->type, ActionType::kRecvBackward);
  EXPECT_EQ(a->microbatch, 27);
}

TEST(ActionTest, MalformedTextIsInvalidArgumentShowingIt) {
  for (const char* text : {"", "F3", "0F", "0X3", "0F3x", "-1F3", "0F-3", "0SEND3", "1STEP",
                           "STEP2", "REDUCE_GRAD", "0REDUCE_GRAD1", "0f3", "0F3F"}) {
    absl::StatusOr<Action> a = ParseAction(text);
    ASSERT_FALSE(a.ok()) << "accepted \"" << text << "\"";
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(std::string("\"") + text + "\""));
  }
}

TEST(ActionTest, ParseActionsSplitsOnSpacesAndCommas) {
  absl::StatusOr<std::vector<Action>> list = ParseActions("0F0 0F1,,0B0\n");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(*list, (std::vector<Action>{F(0, 0), F(0, 1), B(0, 0)}));
  EXPECT_EQ(ActionsToString(*list), "0F0 0F1 0B0");
  EXPECT_FALSE(ParseActions("0F0 bogus").ok());
}

TEST(ActionTest, OverlapFBInPyTorchNotationRoundTrips) {
  const Action pair = OverlapFB(F(0, 3), B(3, 1));
  EXPECT_EQ(ActionToString(pair), "(0F3;3B1)OVERLAP_F_B");
  EXPECT_EQ(pair.type, ActionType::kOverlapFB);
  EXPECT_EQ(ForwardHalf(pair), F(0, 3));
  EXPECT_EQ(BackwardHalf(pair), B(3, 1));
  for (const char* text : {"(0F3;3B1)OVERLAP_F_B", "(12F0;7I10)OVERLAP_F_B"}) {
    absl::StatusOr<Action> a = ParseAction(text);
    ASSERT_TRUE(a.ok()) << text << ": " << a.status();
    EXPECT_EQ(ActionToString(*a), text);
  }
  EXPECT_EQ(*ParseAction(" (0F3;3B1)OVERLAP_F_B "), pair);
  // Pairs differ by their backward half too.
  EXPECT_NE(pair, OverlapFB(F(0, 3), I(3, 1)));
  EXPECT_NE(pair, OverlapFB(F(0, 3), B(3, 2)));
  EXPECT_TRUE(IsCompute(ActionType::kOverlapFB));
  absl::StatusOr<std::vector<Action>> list = ParseActions("0F0 (0F1;1B0)OVERLAP_F_B,1W0");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(*list, (std::vector<Action>{F(0, 0), OverlapFB(F(0, 1), B(1, 0)), W(1, 0)}));
}

TEST(ActionTest, LeavesAreTheHalvesInOrder) {
  std::vector<Action> leaves;
  for (const Action& a : Leaves(OverlapFB(F(2, 5), I(1, 0)))) leaves.push_back(a);
  EXPECT_EQ(leaves, (std::vector<Action>{F(2, 5), I(1, 0)}));
  leaves.clear();
  for (const Action& a : Leaves(W(1, 0))) leaves.push_back(a);
  EXPECT_EQ(leaves, (std::vector<Action>{W(1, 0)}));
}

TEST(ActionTest, MalformedOverlapIsInvalidArgumentNamingTheRule) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"(0F3;3B1)", "followed by OVERLAP_F_B"},
      {"(0F3;3B1)OVERLAP", "followed by OVERLAP_F_B"},
      {"(0F3;3B1", "no closing parenthesis"},
      {"(0F3)OVERLAP_F_B", "exactly two actions, got 1"},
      {"(0F3;3B1;2F0)OVERLAP_F_B", "exactly two actions, got 3"},
      {"(3B1;0F3)OVERLAP_F_B", "first half of an OVERLAP_F_B must be an F"},
      {"(0F3;3W1)OVERLAP_F_B", "second half of an OVERLAP_F_B must be a B or an I"},
      {"(0F3;3F1)OVERLAP_F_B", "second half of an OVERLAP_F_B must be a B or an I"},
      {"(0F3;3B3)OVERLAP_F_B", "different micro-batches"},
      {"(0F3;3X1)OVERLAP_F_B", "unknown type"},
      {"0OVERLAP_F_B3", "is written (<forward>;<backward>)OVERLAP_F_B"},
  };
  for (const auto& [text, why] : cases) {
    absl::StatusOr<Action> a = ParseAction(text);
    ASSERT_FALSE(a.ok()) << "accepted \"" << text << "\"";
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(a.status().message()), HasSubstr("\"" + text + "\"")) << text;
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(why)) << text;
  }
}

TEST(ActionTest, PeerStages) {
  EXPECT_EQ(PeerStage({2, ActionType::kSendForward, 0}), 3);
  EXPECT_EQ(PeerStage({2, ActionType::kRecvBackward, 0}), 3);
  EXPECT_EQ(PeerStage({2, ActionType::kRecvForward, 0}), 1);
  EXPECT_EQ(PeerStage({2, ActionType::kSendBackward, 0}), 1);
}

TEST(ActionTest, Categories) {
  EXPECT_TRUE(IsCompute(ActionType::kBackwardWeight));
  EXPECT_FALSE(IsCompute(ActionType::kSendForward));
  EXPECT_TRUE(IsCommunication(ActionType::kRecvBackward));
  EXPECT_TRUE(IsReceive(ActionType::kRecvForward));
  EXPECT_TRUE(IsReceive(ActionType::kRecvBackward));
  EXPECT_FALSE(IsReceive(ActionType::kSendForward));
  EXPECT_FALSE(IsReceive(ActionType::kForward));
  EXPECT_TRUE(IsTail(ActionType::kOptimizerStep));
  EXPECT_FALSE(IsTail(ActionType::kForward));
}

}  // namespace
}  // namespace pp
