#include "pipeline/runtime/stage_executor.h"

#include <chrono>

#include <gtest/gtest.h>

#include "common/status_macros.h"
#include "pipeline/runtime/action_timer.h"
#include "pipeline/schedule/schedules/registry.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

using std::chrono::milliseconds;
using StageFn = std::function<Activations(const Activations&, const MicroBatch&)>;

absl::Status Check(bool cond, const std::string& what) {
  return cond ? absl::OkStatus() : absl::InternalError(what);
}

absl::StatusOr<LoweredProgram> Program(const std::string& name, int p, int m, int v = 1) {
  ScheduleOptions o;
  o.num_stages = p;
  o.num_microbatches = m;
  o.num_chunks = v;
  PP_ASSIGN_OR_RETURN(Schedule s, MakeSchedule(name, o));
  return Lower(s);
}

// Input 1 and target 0 for every micro-batch, ids step * 100 + index.
class ConstantSource : public MicroBatchSource {
 public:
  explicit ConstantSource(int64_t id_offset = 0) : id_offset_(id_offset) {}
  absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) override {
    MicroBatchData d;
    d.inputs = {torch::ones({1, 1})};
    d.batch.id = step * 100 + index + id_offset_;
    d.batch.tensors["labels"] = torch::zeros({1, 1});
    return d;
  }

 private:
  int64_t id_offset_;
};

torch::Tensor Mse(const Activations& out, const MicroBatch& batch) {
  return torch::mse_loss(out[0], batch.Get("labels"));
}

// DeepSpeed's smallest pipeline test: two Linear(1,1) with weight 1 on two
// stages, MSE against 0 for input 1, SGD lr 0.1, two micro-batches: the first
// weight becomes 0.8 after one step (d mean-loss / d w1 = 2 w1 w2^2 = 2).
TEST(StageExecutorTest, DeepSpeedTwoLinearStages) {
  for (const std::string schedule : {"gpipe", "1f1b", "zb_h1", "zb_h2"}) {
    absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [&](World& world) -> absl::Status {
      PP_ASSIGN_OR_RETURN(LoweredProgram program, Program(schedule, 2, 2));
      torch::nn::Linear linear(torch::nn::LinearOptions(1, 1).bias(false));
      {
        torch::NoGradGuard g;
        linear->weight.fill_(1.0);
      }
      ConstantSource source;
      std::map<int, StageFn> stages = {{world.rank, [&](const Activations& in, const MicroBatch&) {
                                          return Activations{linear(in[0])};
                                        }}};
      StageExecutor exec(world.rank, stages, Mse, &source, world.group, StageExecutorOptions{});
      torch::optim::SGD sgd(linear->parameters(), torch::optim::SGDOptions(0.1));
      int steps_seen = 0;
      PP_ASSIGN_OR_RETURN(StepStats stats, exec.Run(program, 0, [&](const Action& a) {
        if (a.type == ActionType::kOptimizerStep) {
          ++steps_seen;
          sgd.step();
        }
        return absl::OkStatus();
      }));
      PP_RETURN_IF_ERROR(Check(steps_seen == 1, "one STEP"));
      const float w = linear->weight.item<float>();
      PP_RETURN_IF_ERROR(
          Check(std::abs(w - 0.8f) < 1e-6, schedule + ": weight " + std::to_string(w) + " != 0.8"));
      if (world.rank == 1) {
        PP_RETURN_IF_ERROR(
            Check(stats.losses_computed == 2 && std::abs(stats.loss_sum - 2.0) < 1e-6, "losses"));
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << schedule << ": " << s;
  }
}

// A payload of a float activation, an integer mask and a float without grad
// crosses stages; gradients equal a single-process computation and nobody
// waits for a gradient of the mask or the no-grad float.
TEST(StageExecutorTest, MultiTensorPayloadMatchesSingleProcess) {
  torch::manual_seed(0);
  torch::Tensor w0_init = torch::randn({4, 4});
  torch::Tensor w1_init = torch::randn({4, 4});
  torch::Tensor x = torch::randn({3, 4});
  // Reference.
  torch::Tensor w0 = w0_init.clone().requires_grad_(true);
  torch::Tensor w1 = w1_init.clone().requires_grad_(true);
  torch::Tensor mask = torch::tensor({1, 0, 1}, torch::kLong);
  for (int mb = 0; mb < 3; ++mb) {
    torch::Tensor h = torch::tanh(torch::matmul(x + mb, w0));
    torch::Tensor y = torch::matmul(h, w1) * mask.unsqueeze(1).to(torch::kFloat) + (x + mb).sum();
    (y.pow(2).mean() / 3.0).backward();
  }
  class Source : public MicroBatchSource {
   public:
    explicit Source(torch::Tensor x) : x_(x) {}
    absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) override {
      MicroBatchData d;
      d.inputs = {x_ + index};
      d.batch.id = index;
      return d;
    }
    torch::Tensor x_;
  };
  for (const std::string schedule : {"1f1b", "zb_h1"}) {
    absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [&](World& world) -> absl::Status {
      PP_ASSIGN_OR_RETURN(LoweredProgram program, Program(schedule, 2, 3));
      torch::Tensor w = (world.rank == 0 ? w0_init : w1_init).clone().requires_grad_(true);
      Source source(x);
      std::map<int, StageFn> stages;
      if (world.rank == 0) {
        stages[0] = [&](const Activations& in, const MicroBatch&) {
          return Activations{torch::tanh(torch::matmul(in[0], w)),
                             torch::tensor({1, 0, 1}, torch::kLong), in[0].sum().reshape({1})};
        };
      } else {
        stages[1] = [&](const Activations& in, const MicroBatch&) {
          return Activations{torch::matmul(in[0], w) * in[1].unsqueeze(1).to(torch::kFloat) +
                             in[2]};
        };
      }
      auto loss = [](const Activations& out, const MicroBatch&) { return out[0].pow(2).mean(); };
      StageExecutor exec(world.rank, stages, loss, &source, world.group, StageExecutorOptions{});
      PP_RETURN_IF_ERROR(exec.Run(program, 0, nullptr).status());
      torch::Tensor want = world.rank == 0 ? w0.grad() : w1.grad();
      PP_RETURN_IF_ERROR(Check(torch::allclose(w.grad(), want, 1e-5, 1e-6),
                               "grad mismatch on rank " + std::to_string(world.rank)));
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << schedule << ": " << s;
  }
}

// Two virtual stages on one rank hand over locally (no process group
// traffic) and still give the single-module gradients.
TEST(StageExecutorTest, LocalHandOverBetweenChunksOfOneRank) {
  absl::Status s = RunOnThreadRanks(1, milliseconds(20000), [&](World& world) -> absl::Status {
    PP_ASSIGN_OR_RETURN(LoweredProgram program, Program("interleaved_1f1b", 1, 2, 2));
    torch::Tensor a = torch::full({1}, 2.0, torch::requires_grad());
    torch::Tensor b = torch::full({1}, 3.0, torch::requires_grad());
    std::map<int, StageFn> stages = {
        {0, [&](const Activations& in,
                const MicroBatch&) { return Activations{in[0].reshape({1}) * a}; }},
        {1, [&](const Activations& in, const MicroBatch&) { return Activations{in[0] * b}; }}};
    ConstantSource source;
    auto loss = [](const Activations& out, const MicroBatch&) { return out[0].sum(); };
    StageExecutor exec(0, stages, loss, &source, world.group, StageExecutorOptions{});
    PP_RETURN_IF_ERROR(exec.Run(program, 0, nullptr).status());
    // loss per mb = a*b*1, mean over 2 -> d/da = b = 3, d/db = a = 2.
    PP_RETURN_IF_ERROR(
        Check(a.grad().item<float>() == 3.0f && b.grad().item<float>() == 2.0f, "grads"));
    PP_RETURN_IF_ERROR(Check(exec.p2p().stats().tensor_messages == 0, "no messages"));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// The last stage refuses to compute a loss when the activations' micro-batch
// id differs from its labels' id (DeepSpeed #5729).
TEST(StageExecutorTest, MismatchedMicroBatchIdIsAnError) {
  absl::Status s = RunOnThreadRanks(2, milliseconds(20000), [&](World& world) -> absl::Status {
    PP_ASSIGN_OR_RETURN(LoweredProgram program, Program("gpipe", 2, 1));
    torch::nn::Linear linear(1, 1);
    ConstantSource source(/*id_offset=*/world.rank == 0 ? 0 : 7);  // ranks disagree
    std::map<int, StageFn> stages = {{world.rank, [&](const Activations& in, const MicroBatch&) {
                                        return Activations{linear(in[0])};
                                      }}};
    StageExecutor exec(world.rank, stages, Mse, &source, world.group,
                       StageExecutorOptions{P2POptions{milliseconds(2000)}, 0, true});
    absl::StatusOr<StepStats> r = exec.Run(program, 0, nullptr);
    if (world.rank == 1) {
      PP_RETURN_IF_ERROR(Check(
          !r.ok() && std::string(r.status().message()).find("mismatched") != std::string::npos,
          "expected the mismatch error, got " + r.status().ToString()));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

LoweredProgram OneRankProgram(std::vector<Action> actions, int m) {
  LoweredProgram program;
  program.schedule_name = "hand";
  program.num_stages = 1;
  program.num_microbatches = m;
  program.stage_to_rank = {0};
  program.ranks = {std::move(actions)};
  return program;
}

// I then W on one stage, in a zero-bubble order (I0 I1 W1 W0), gives the
// gradients of full B; the capabilities accept I/W.
TEST(StageExecutorTest, SplitBackwardEqualsFullBackward) {
  EXPECT_TRUE(StageExecutorCapabilities().split_backward);
  torch::manual_seed(3);
  torch::nn::Linear l1(1, 4), l2(4, 1);
  auto run = [&](std::vector<Action> actions) -> absl::StatusOr<std::vector<torch::Tensor>> {
    for (auto& p : l1->parameters()) p.mutable_grad().reset();
    for (auto& p : l2->parameters()) p.mutable_grad().reset();
    ConstantSource source;
    std::map<int, StageFn> stages = {{0, [&](const Activations& in, const MicroBatch&) {
                                        return Activations{l2(torch::tanh(l1(in[0])))};
                                      }}};
    StageExecutor exec(0, stages, Mse, &source, c10::intrusive_ptr<c10d::ProcessGroup>(),
                       StageExecutorOptions{});
    PP_RETURN_IF_ERROR(exec.Run(OneRankProgram(std::move(actions), 2), 0, nullptr).status());
    std::vector<torch::Tensor> grads;
    for (auto& p : l1->parameters()) grads.push_back(p.grad().clone());
    for (auto& p : l2->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  absl::StatusOr<std::vector<torch::Tensor>> full = run({F(0, 0), F(0, 1), B(0, 0), B(0, 1)});
  ASSERT_TRUE(full.ok()) << full.status();
  absl::StatusOr<std::vector<torch::Tensor>> split =
      run({F(0, 0), F(0, 1), I(0, 0), I(0, 1), W(0, 1), W(0, 0)});
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ(full->size(), split->size());
  for (size_t i = 0; i < full->size(); ++i) {
    EXPECT_TRUE(torch::allclose((*full)[i], (*split)[i], 1e-6, 1e-7)) << "parameter " << i;
  }
}

// OVERLAP_F_B runs its forward half, then its backward half (B or I), back
// to back: the gradients equal the unpaired order's, and each half is timed
// as its own action.
TEST(StageExecutorTest, OverlapFBRunsItsHalvesBackToBack) {
  EXPECT_TRUE(StageExecutorCapabilities().overlap_f_b);
  torch::manual_seed(5);
  torch::nn::Linear l1(1, 4), l2(4, 1);
  auto run = [&](std::vector<Action> actions,
                 std::vector<Action>* timed) -> absl::StatusOr<std::vector<torch::Tensor>> {
    for (auto& p : l1->parameters()) p.mutable_grad().reset();
    for (auto& p : l2->parameters()) p.mutable_grad().reset();
    ConstantSource source;
    std::map<int, StageFn> stages = {{0, [&](const Activations& in, const MicroBatch&) {
                                        return Activations{l2(torch::tanh(l1(in[0])))};
                                      }}};
    StageExecutor exec(0, stages, Mse, &source, c10::intrusive_ptr<c10d::ProcessGroup>(),
                       StageExecutorOptions{});
    ActionTimer timer(torch::kCPU, milliseconds(1000));
    exec.set_observer(&timer);
    PP_RETURN_IF_ERROR(exec.Run(OneRankProgram(std::move(actions), 3), 0, nullptr).status());
    for (const ActionTiming& t : timer.timings()) timed->push_back(t.action);
    std::vector<torch::Tensor> grads;
    for (auto& p : l1->parameters()) grads.push_back(p.grad().clone());
    for (auto& p : l2->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  std::vector<Action> timed_plain, timed_paired, timed_split;
  absl::StatusOr<std::vector<torch::Tensor>> plain =
      run({F(0, 0), F(0, 1), B(0, 0), F(0, 2), B(0, 1), B(0, 2)}, &timed_plain);
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<std::vector<torch::Tensor>> paired = run(
      {F(0, 0), OverlapFB(F(0, 1), B(0, 0)), OverlapFB(F(0, 2), B(0, 1)), B(0, 2)}, &timed_paired);
  ASSERT_TRUE(paired.ok()) << paired.status();
  absl::StatusOr<std::vector<torch::Tensor>> split =
      run({F(0, 0), OverlapFB(F(0, 1), I(0, 0)), W(0, 0), OverlapFB(F(0, 2), B(0, 1)), B(0, 2)},
          &timed_split);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(ActionsToString(timed_paired), "0F0 0F1 0B0 0F2 0B1 0B2");
  EXPECT_EQ(ActionsToString(timed_split), "0F0 0F1 0I0 0W0 0F2 0B1 0B2");
  for (size_t i = 0; i < plain->size(); ++i) {
    EXPECT_TRUE(torch::allclose((*plain)[i], (*paired)[i], 1e-6, 1e-7)) << "parameter " << i;
    EXPECT_TRUE(torch::allclose((*plain)[i], (*split)[i], 1e-6, 1e-7)) << "parameter " << i;
  }
}

TEST(StageExecutorTest, SplitBackwardOutOfOrderIsAnError) {
  ConstantSource source;
  torch::nn::Linear linear(1, 1);
  std::map<int, StageFn> stages = {
      {0, [&](const Activations& in, const MicroBatch&) { return Activations{linear(in[0])}; }}};
  StageExecutor exec(0, stages, Mse, &source, c10::intrusive_ptr<c10d::ProcessGroup>(),
                     StageExecutorOptions{});
  struct Case {
    std::vector<Action> actions;
    std::string error;
  };
  for (const Case& c : std::vector<Case>{{{F(0, 0), W(0, 0)}, "0W0 on rank 0: W before"},
                                         {{F(0, 0), I(0, 0), B(0, 0)}, "full B after"},
                                         {{F(0, 0), I(0, 0), I(0, 0)}, "a second I"},
                                         {{F(0, 0), I(0, 0)}, "without backward"}}) {
    absl::StatusOr<StepStats> r = exec.Run(OneRankProgram(c.actions, 1), 0, nullptr);
    ASSERT_FALSE(r.ok()) << c.error;
    EXPECT_NE(std::string(r.status().message()).find(c.error), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace pp
