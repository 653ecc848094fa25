// Failure behaviour with real processes: a rank that dies (or goes silent)
// mid-step makes the other rank fail within its timeout, with an error naming
// the peer rank and the action, and exit non-zero instead of hanging.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/equivalence_testing.h"
#include "pipeline/runtime/trainer.h"
#include "topology/parallel_grid.h"
#include "topology/rendezvous.h"

namespace pp {
namespace testing_runtime {
namespace {

enum class Fault { kExit, kHang };

// Rank 1's data source misbehaves when it is asked for micro-batch 1 of step
// 1: after step 0 completed and in the middle of step 1.
class FaultySource : public MicroBatchSource {
 public:
  FaultySource(int rank, Fault fault) : rank_(rank), fault_(fault) {}
  absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) override {
    if (rank_ == 1 && step == 1 && index == 1) {
      if (fault_ == Fault::kExit) _exit(7);
      std::this_thread::sleep_for(std::chrono::minutes(10));
    }
    return inner_.Get(step, index);
  }

 private:
  int rank_;
  Fault fault_;
  ToySource inner_;
};

absl::Status RunRank(int rank, const std::string& store_path, Fault fault, bool post_ahead) {
  DistEnv env;
  env.rank = rank;
  env.world_size = 2;
  env.local_rank = rank;
  env.local_world_size = 2;
  RendezvousOptions ro;
  ro.timeout = std::chrono::seconds(3);
  ro.file_store_path = store_path;
  PP_ASSIGN_OR_RETURN(World world, Rendezvous(env, ro));
  PP_ASSIGN_OR_RETURN(ProcessTopology topo, PipeDataParallelTopology(2, 1));
  PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world, topo));
  PipelineModelOptions mo;
  mo.num_stages = 2;
  mo.partition_method = "uniform";
  PP_ASSIGN_OR_RETURN(auto model, PipelineModel::Create(ToySpecs(2), mo, grid.stage_id()));
  FaultySource source(rank, fault);
  TrainerOptions to;
  to.schedule = "1f1b";
  to.num_microbatches = 4;
  to.executor.p2p.timeout = std::chrono::seconds(3);
  to.executor.post_receives_ahead = post_ahead;
  PP_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(&grid, model.get(), ToyLoss, &source, to));
  for (int step = 0; step < 3; ++step) {
    absl::StatusOr<StepResult> r = trainer->Step();
    if (!r.ok() && post_ahead) {
      // What the failed step left posted (the test wants none).
      const P2PStats p2p = trainer->p2p_stats();
      return absl::Status(
          r.status().code(),
          absl::StrCat(r.status().message(), " [posted receives left ", p2p.receives_posted_now,
                       ", aborted ", p2p.posted_receives_aborted, ", received ahead ",
                       p2p.payloads_posted_ahead, "]"));
    }
    PP_RETURN_IF_ERROR(r.status());
  }
  return absl::OkStatus();
}

// Forks one process per rank; returns rank 0's exit code and error text.
void RunScenario(Fault fault, int* rank0_exit, std::string* rank0_error, double* seconds,
                 bool post_ahead = false) {
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string store =
      absl::StrCat(dir, "/failure_store_", getpid(), "_", static_cast<int>(fault), "_", post_ahead);
  const std::string err_file =
      absl::StrCat(dir, "/rank0_error_", static_cast<int>(fault), "_", post_ahead);
  ::unlink(store.c_str());
  pid_t pids[2];
  const auto start = std::chrono::steady_clock::now();
  for (int rank = 0; rank < 2; ++rank) {
    pids[rank] = fork();
    ASSERT_GE(pids[rank], 0);
    if (pids[rank] == 0) {
      at::set_num_threads(1);
      absl::Status s = RunRank(rank, store, fault, post_ahead);
      if (!s.ok()) {
        std::ofstream(err_file) << s.ToString();
        _exit(1);
      }
      _exit(0);
    }
  }
  // Rank 0 must end on its own well within the test's budget.
  int status = 0;
  bool done = false;
  for (int i = 0; i < 600 && !done; ++i) {
    done = waitpid(pids[0], &status, WNOHANG) == pids[0];
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!done) kill(pids[0], SIGKILL), waitpid(pids[0], &status, 0);
  kill(pids[1], SIGKILL);
  waitpid(pids[1], nullptr, 0);
  *rank0_exit = done && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_file);
  std::stringstream ss;
  ss << in.rdbuf();
  *rank0_error = ss.str();
}

TEST(FailureTest, PeerExitMidStepFailsOtherRankNamingPeerAndAction) {
  int code = 0;
  std::string error;
  double seconds = 0;
  RunScenario(Fault::kExit, &code, &error, &seconds);
  std::cerr << "rank 0 (" << seconds << " s): " << error << "\n";
  EXPECT_EQ(code, 1) << error;
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
  EXPECT_TRUE(error.find("RECV_B") != std::string::npos ||
              error.find("SEND_F") != std::string::npos ||
              error.find("RECV_F") != std::string::npos)
      << error;
  EXPECT_LT(seconds, 20.0);
}

TEST(FailureTest, SilentPeerTimesOutNamingPeerAndAction) {
  int code = 0;
  std::string error;
  double seconds = 0;
  RunScenario(Fault::kHang, &code, &error, &seconds);
  std::cerr << "rank 0 (" << seconds << " s): " << error << "\n";
  EXPECT_EQ(code, 1) << error;
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
  EXPECT_NE(error.find("RECV_B"), std::string::npos) << error;
  EXPECT_LT(seconds, 20.0);
}

// With receives posted ahead (StageExecutorOptions::post_receives_ahead) the
// same failures end the same way, and the failed step leaves no receive
// posted: the one waited for and any other posted are aborted (their buffers
// kept, so nothing lands in freed memory).
TEST(FailureTest, ReceivesPostedAheadSilentPeerTimesOutLeavingNothingPosted) {
  int code = 0;
  std::string error;
  double seconds = 0;
  RunScenario(Fault::kHang, &code, &error, &seconds, /*post_ahead=*/true);
  std::cerr << "rank 0 (" << seconds << " s): " << error << "\n";
  EXPECT_EQ(code, 1) << error;
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
  EXPECT_NE(error.find("RECV_B"), std::string::npos) << error;
  EXPECT_NE(error.find("posted receive from"), std::string::npos) << error;
  EXPECT_NE(error.find("[posted receives left 0, aborted "), std::string::npos) << error;
  EXPECT_EQ(error.find("aborted 0,"), std::string::npos) << error;
  EXPECT_LT(seconds, 20.0);
}

TEST(FailureTest, ReceivesPostedAheadPeerExitLeavesNothingPosted) {
  int code = 0;
  std::string error;
  double seconds = 0;
  RunScenario(Fault::kExit, &code, &error, &seconds, /*post_ahead=*/true);
  std::cerr << "rank 0 (" << seconds << " s): " << error << "\n";
  EXPECT_EQ(code, 1) << error;
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
  EXPECT_NE(error.find("[posted receives left 0, "), std::string::npos) << error;
  EXPECT_LT(seconds, 20.0);
}

}  // namespace
}  // namespace testing_runtime
}  // namespace pp
