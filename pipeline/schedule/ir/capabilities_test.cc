#include "pipeline/schedule/ir/capabilities.h"

#include <string>

#include <gtest/gtest.h>

#include "pipeline/schedule/ir/action.h"

namespace pp {
namespace {

LoweredProgram TwoRankProgram(const std::string& rank0, const std::string& rank1) {
  LoweredProgram program;
  program.schedule_name = "zb";
  program.num_stages = 2;
  program.num_microbatches = 1;
  program.stage_to_rank = {0, 1};
  program.ranks = {*ParseActions(rank0), *ParseActions(rank1)};
  return program;
}

TEST(CheckRuntimeSupportsTest, AcceptsFullBackward) {
  LoweredProgram p =
      TwoRankProgram("0F0 0SEND_F0 0RECV_B0 0B0 STEP", "1RECV_F0 1F0 1B0 1SEND_B0 STEP");
  EXPECT_TRUE(CheckRuntimeSupports(p, RuntimeCapabilities{}).ok());
}

TEST(CheckRuntimeSupportsTest, RefusesSplitBackwardNamingActionRankAndSchedule) {
  LoweredProgram p =
      TwoRankProgram("0F0 0SEND_F0 0RECV_B0 0B0 STEP", "1RECV_F0 1F0 1I0 1SEND_B0 1W0 STEP");
  absl::Status s = CheckRuntimeSupports(p, RuntimeCapabilities{});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  const std::string message(s.message());
  EXPECT_NE(message.find("'zb'"), std::string::npos) << s;
  EXPECT_NE(message.find("1I0 on rank 1"), std::string::npos) << s;
}

TEST(CheckRuntimeSupportsTest, AcceptsSplitBackwardWhenSupported) {
  LoweredProgram p =
      TwoRankProgram("0F0 0SEND_F0 0RECV_B0 0B0 STEP", "1RECV_F0 1F0 1I0 1SEND_B0 1W0 STEP");
  RuntimeCapabilities caps;
  caps.split_backward = true;
  EXPECT_TRUE(CheckRuntimeSupports(p, caps).ok());
}

TEST(CheckRuntimeSupportsTest, RefusesVocabularyPassesUnlessSupported) {
  LoweredProgram p =
      TwoRankProgram("IN_F0 IN_REDUCE0 0F0 0SEND_F0", "IN_F0 IN_REDUCE0 1RECV_F0 1F0");
  p.vocab_parallel = true;
  absl::Status s = CheckRuntimeSupports(p, RuntimeCapabilities{});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(s.message()).find("IN_F0 on rank 0: vocabulary parallelism"),
            std::string::npos)
      << s;
  RuntimeCapabilities caps;
  caps.vocab_parallel = true;
  EXPECT_TRUE(CheckRuntimeSupports(p, caps).ok());
}

}  // namespace
}  // namespace pp
