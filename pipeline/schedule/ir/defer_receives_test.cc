#include "pipeline/schedule/ir/defer_receives.h"

#include <string>

#include <gtest/gtest.h>

#include "pipeline/schedule/ir/action.h"

namespace pp {
namespace {

// DeferReceives moves each RECV to just before the compute that needs it,
// keeping the receives' order and flushing the rest before the tail.
TEST(DeferReceivesTest, MovesReceivesToTheirConsumers) {
  LoweredProgram program;
  program.num_stages = 2;
  program.num_microbatches = 2;
  program.stage_to_rank = {0, 1};
  auto parse = [](const std::string& text) { return *ParseActions(text); };
  program.ranks = {parse("0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0RECV_B1 0B0 0B1 REDUCE_TIED STEP"),
                   parse("1RECV_F0 1F0 1RECV_F1 1B0 1SEND_B0 1F1 1B1 1SEND_B1 REDUCE_TIED STEP")};
  LoweredProgram d = DeferReceives(program);
  EXPECT_EQ(ActionsToString(d.ranks[0]),
            "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 REDUCE_TIED STEP");
  EXPECT_EQ(ActionsToString(d.ranks[1]),
            "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 REDUCE_TIED STEP");
}

// I (split backward) needs the output gradient as B does; W needs nothing.
TEST(DeferReceivesTest, BackwardInputConsumesTheGradientReceive) {
  LoweredProgram program;
  program.num_stages = 2;
  program.num_microbatches = 2;
  program.stage_to_rank = {0, 1};
  auto parse = [](const std::string& text) { return *ParseActions(text); };
  program.ranks = {
      parse("0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0RECV_B1 0I0 0W0 0I1 0W1 REDUCE_TIED STEP"),
      parse("1RECV_F0 1RECV_F1 1F0 1I0 1SEND_B0 1F1 1I1 1SEND_B1 1W0 1W1 REDUCE_TIED STEP")};
  LoweredProgram d = DeferReceives(program);
  EXPECT_EQ(ActionsToString(d.ranks[0]),
            "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0I0 0W0 0RECV_B1 0I1 0W1 REDUCE_TIED STEP");
  EXPECT_EQ(ActionsToString(d.ranks[1]),
            "1RECV_F0 1F0 1I0 1SEND_B0 1RECV_F1 1F1 1I1 1SEND_B1 1W0 1W1 REDUCE_TIED STEP");
}

// Receives nobody consumes before the end (a forward-only program's last
// receives) are flushed at the end, in order.
TEST(DeferReceivesTest, FlushesPendingReceivesAtTheEnd) {
  LoweredProgram program;
  program.num_stages = 2;
  program.num_microbatches = 2;
  program.stage_to_rank = {0, 1};
  program.forward_only = true;
  auto parse = [](const std::string& text) { return *ParseActions(text); };
  program.ranks = {parse("0F0 0SEND_F0 0F1 0SEND_F1"), parse("1RECV_F0 1RECV_F1 1F0")};
  LoweredProgram d = DeferReceives(program);
  EXPECT_EQ(ActionsToString(d.ranks[0]), "0F0 0SEND_F0 0F1 0SEND_F1");
  EXPECT_EQ(ActionsToString(d.ranks[1]), "1RECV_F0 1F0 1RECV_F1");
}

}  // namespace
}  // namespace pp
