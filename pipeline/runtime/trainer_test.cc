#include "pipeline/runtime/trainer.h"

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/status_macros.h"
#include "common/torch_compat.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/equivalence_testing.h"
#include "pipeline/schedule/schedules/registry.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace testing_runtime {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

absl::Status Check(bool cond, const std::string& what) {
  return cond ? absl::OkStatus() : absl::InternalError(what);
}

absl::StatusOr<std::unique_ptr<PipelineModel>> ToyModel(const ParallelGrid& grid, int chunks = 1) {
  PipelineModelOptions mo;
  mo.num_stages = grid.num_stages();
  mo.chunks = chunks;
  mo.partition_method = "uniform";
  mo.base_seed = kSeed;
  return PipelineModel::Create(ToySpecs(2), mo, grid.stage_id());
}

// DeepSpeed's smallest case through the whole stack (PipelineModel, Trainer):
// two Linear(1,1) with weight 1 on two stages, MSE against 0 for input 1, SGD
// lr 0.1, two micro-batches: both weights become 0.8.
TEST(TrainerTest, DeepSpeedTwoLinearLayers) {
  class Ones : public MicroBatchSource {
   public:
    absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) override {
      MicroBatchData d;
      d.inputs = {torch::ones({1, 1})};
      d.batch.id = index;
      d.batch.tensors["labels"] = torch::zeros({1, 1});
      return d;
    }
  };
  auto linear = [](const LayerContext&) {
    torch::nn::Linear l(torch::nn::LinearOptions(1, 1).bias(false));
    torch::NoGradGuard g;
    l->weight.fill_(1.0);
    return MakeModuleLayer(l);
  };
  absl::Status s = RunOnGrid(2, 1, seconds(20), [&](ParallelGrid& grid) -> absl::Status {
    PipelineModelOptions mo;
    mo.num_stages = 2;
    mo.partition_method = "uniform";
    PP_ASSIGN_OR_RETURN(auto model, PipelineModel::Create(
                                        {LayerSpec("Linear", linear), LayerSpec("Linear", linear)},
                                        mo, grid.stage_id()));
    Ones source;
    TrainerOptions o;
    o.num_microbatches = 2;
    o.optimizer.lr = 0.1;
    auto mse = [](const Activations& out, const MicroBatch& b) {
      return torch::mse_loss(out[0], b.Get("labels"));
    };
    PP_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(&grid, model.get(), mse, &source, o));
    PP_ASSIGN_OR_RETURN(StepResult r, trainer->Step());
    PP_RETURN_IF_ERROR(Check(std::abs(r.loss - 1.0) < 1e-6, "loss 1 reported on every rank"));
    PP_RETURN_IF_ERROR(
        Check(std::abs(r.grad_norm - std::sqrt(8.0)) < 1e-5, "grad norm sqrt(2^2 + 2^2)"));
    const float w = model->parameters()[0].item<float>();
    return Check(std::abs(w - 0.8f) < 1e-6, "weight " + std::to_string(w));
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Evaluate runs the forward-only schedule under no-grad: the mean loss of the
// sequential model on the same batches, and no parameter changes.
TEST(TrainerTest, EvaluateMatchesSequentialForward) {
  RunConfig config;
  config.blocks = 2;
  config.dp = 2;
  auto seq = BuildSequential(ToySpecs(2), kSeed);
  ASSERT_TRUE(seq.ok()) << seq.status();
  ToySource source;
  double want = 0;
  {
    torch::NoGradGuard g;
    for (int i = 0; i < 2 * 4; ++i) {
      MicroBatchData d = *source.Get(/*step=*/9, i);
      want += ToyLoss((*seq)->Forward(d.inputs, d.batch), d.batch).item<double>();
    }
    want /= 8;
  }
  absl::Status s = RunOnGrid(2, 2, seconds(20), [&](ParallelGrid& grid) -> absl::Status {
    PP_ASSIGN_OR_RETURN(auto model, ToyModel(grid));
    ToySource train;
    TrainerOptions o;
    o.num_microbatches = 4;
    PP_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(&grid, model.get(), ToyLoss, &train, o));
    torch::Tensor before = model->parameters()[0].detach().clone();
    ToySource eval;
    PP_ASSIGN_OR_RETURN(double loss, trainer->Evaluate(&eval, 9));
    PP_RETURN_IF_ERROR(Check(std::abs(loss - want) <= 1e-5 * std::abs(want),
                             "eval loss " + std::to_string(loss) + " vs " + std::to_string(want)));
    return Check(torch::equal(before, model->parameters()[0]), "evaluation changed parameters");
  });
  EXPECT_TRUE(s.ok()) << s;
}

// The merged trace of an observed step holds every executed action of every
// rank; step results carry the scheduled learning rate and, when asked for,
// busy/idle time per rank.
TEST(TrainerTest, TraceAndStepResult) {
  absl::Status s = RunOnGrid(2, 1, seconds(20), [&](ParallelGrid& grid) -> absl::Status {
    PP_ASSIGN_OR_RETURN(auto model, ToyModel(grid, 2));
    ToySource source;
    TrainerOptions o;
    o.schedule = "interleaved_1f1b";
    o.num_microbatches = 4;
    o.optimizer.lr = 0.2;
    o.lr_schedule.name = "warmup_cosine";
    o.lr_schedule.warmup_steps = 2;
    o.lr_schedule.total_steps = 10;
    PP_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(&grid, model.get(), ToyLoss, &source, o));
    // An unobserved step measures nothing.
    PP_ASSIGN_OR_RETURN(StepResult plain, trainer->Step());
    PP_RETURN_IF_ERROR(Check(plain.busy_seconds.empty() && plain.step_seconds == 0 &&
                                 trainer->last_step_timings().empty(),
                             "an unobserved step has no busy/idle or timings"));
    PP_ASSIGN_OR_RETURN(StepResult r, trainer->Step({.trace = true, .busy_idle = true}));
    PP_RETURN_IF_ERROR(Check(std::abs(r.learning_rate - 0.2) < 1e-12, "warm-up lr"));
    PP_RETURN_IF_ERROR(Check(r.step_seconds > 0, "step_seconds > 0"));
    PP_RETURN_IF_ERROR(
        Check(r.busy_seconds.size() == 2 && r.idle_seconds.size() == 2, "per-rank busy/idle"));
    PP_RETURN_IF_ERROR(Check(r.busy_seconds[0] > 0 && r.busy_seconds[1] > 0, "busy > 0"));
    PP_ASSIGN_OR_RETURN(std::string json, trainer->LastStepTrace());
    nlohmann::json doc = nlohmann::json::parse(json);
    size_t complete = 0;
    for (const auto& e : doc["traceEvents"]) complete += e["ph"] == "X";
    const size_t want =
        trainer->train_program().ranks[0].size() + trainer->train_program().ranks[1].size();
    return Check(complete == want, "trace events " + std::to_string(complete) + " != actions " +
                                       std::to_string(want));
  });
  EXPECT_TRUE(s.ok()) << s;
}

// The distributed optimizer's reduce-scatters appear in the trace as
// background windows (process 1, a track per rank): one per bucket of each
// of the rank's stages, from posting to the backend's completion. Under
// interleaved zero-bubble the chunk that finishes its backward first starts
// its bucket while the rank still computes the other's W passes: some window
// opens before the rank's last action ends.
TEST(TrainerTest, TraceShowsTheReduceScattersInTheBackground) {
  absl::Status s = RunOnGrid(2, 2, seconds(30), [&](ParallelGrid& grid) -> absl::Status {
    PP_ASSIGN_OR_RETURN(auto model, ToyModel(grid, 2));
    ToySource source;
    TrainerOptions o;
    o.schedule = "interleaved_zb";
    o.num_microbatches = 4;
    o.distributed_optimizer = true;
    PP_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(&grid, model.get(), ToyLoss, &source, o));
    PP_ASSIGN_OR_RETURN(StepResult r, trainer->Step({.trace = true}));
    (void)r;
    PP_ASSIGN_OR_RETURN(std::string json, trainer->LastStepTrace());
    const nlohmann::json doc = nlohmann::json::parse(json);
    std::map<int, double> last_action_end;
    std::map<int, std::vector<std::pair<double, double>>> windows;
    for (const auto& e : doc["traceEvents"]) {
      if (e["ph"] != "X") continue;
      const double start = e["ts"].get<double>(), end = start + e["dur"].get<double>();
      if (e["pid"] == 1) {
        // LibTorch 1.13's Gloo reduces per owner, and those works have
        // futures: no window ends at the wait there. 2.x's Gloo has a
        // reduce_scatter whose work implements no future ("Work::getFuture
        // not implemented", seen under 2.11), so its windows end at the wait
        // and say so.
        const std::string name = e["name"].get<std::string>();
        const bool at_wait = name.find("(end: the wait)") != std::string::npos;
        PP_RETURN_IF_ERROR(Check(e["cat"] == "background" &&
                                     name.rfind("gradient reduce-scatter, stage ", 0) == 0 &&
                                     (!at_wait || torch_compat::LibTorchMajorVersion() >= 2),
                                 "a background event: " + e.dump()));
        windows[e["tid"].get<int>()].push_back({start, end});
      } else {
        double& last = last_action_end[e["tid"].get<int>()];
        last = std::max(last, end);
      }
    }
    bool overlaps = false;
    for (int rank = 0; rank < grid.world_size(); ++rank) {
      // Two stages per rank, one bucket each (the toy's few parameters).
      PP_RETURN_IF_ERROR(Check(windows[rank].size() == 2, "rank " + std::to_string(rank) + " has " +
                                                              std::to_string(windows[rank].size()) +
                                                              " windows"));
      for (const auto& [start, end] : windows[rank]) {
        PP_RETURN_IF_ERROR(Check(start <= end && end <= last_action_end[rank],
                                 "a window ends after the step's last action (STEP waits)"));
        overlaps |= start < last_action_end[rank];
      }
    }
    return Check(overlaps, "no reduce-scatter started before a rank's last action ended");
  });
  EXPECT_TRUE(s.ok()) << s;
}

// The LayerRunner given in the options runs every chunk's layers.
TEST(TrainerTest, UsesGivenLayerRunner) {
  std::atomic<int> calls{0};
  absl::Status s = RunOnGrid(2, 1, seconds(20), [&](ParallelGrid& grid) -> absl::Status {
    PP_ASSIGN_OR_RETURN(auto model, ToyModel(grid));
    ToySource source;
    TrainerOptions o;
    o.num_microbatches = 3;
    o.layer_runner = [&](const std::vector<Layer>& layers, Activations in, const MicroBatch& b) {
      calls.fetch_add(1);
      return RunLayers(layers, std::move(in), b);
    };
    PP_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(&grid, model.get(), ToyLoss, &source, o));
    PP_ASSIGN_OR_RETURN(StepResult r, trainer->Step());
    (void)r;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls.load(), 2 * 3);  // two stages x three micro-batches
}

TEST(TrainerTest, RejectsBadScheduleNames) {
  absl::Status s = RunOnGrid(1, 1, seconds(20), [&](ParallelGrid& grid) -> absl::Status {
    PP_ASSIGN_OR_RETURN(auto model, ToyModel(grid));
    ToySource source;
    TrainerOptions o;
    o.schedule = "no_such_schedule";
    auto t = Trainer::Create(&grid, model.get(), ToyLoss, &source, o);
    PP_RETURN_IF_ERROR(
        Check(t.status().code() == absl::StatusCode::kNotFound &&
                  std::string(t.status().message()).find("1f1b") != std::string::npos,
              "unknown schedule lists the registered ones: " + t.status().ToString()));
    o.schedule = "inference";
    t = Trainer::Create(&grid, model.get(), ToyLoss, &source, o);
    PP_RETURN_IF_ERROR(Check(t.status().code() == absl::StatusCode::kInvalidArgument,
                             "forward-only for training"));
    o.schedule = "1f1b";
    o.eval_schedule = "gpipe";
    t = Trainer::Create(&grid, model.get(), ToyLoss, &source, o);
    return Check(t.status().code() == absl::StatusCode::kInvalidArgument,
                 "training schedule for evaluation");
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Asynchronous vocabulary collectives need vocabulary layers: refused
// before anything runs, naming the option and the fix.
TEST(TrainerTest, RejectsAsyncVocabularyCollectivesWithoutVocabulary) {
  absl::Status s = RunOnGrid(1, 1, seconds(20), [&](ParallelGrid& grid) -> absl::Status {
    PP_ASSIGN_OR_RETURN(auto model, ToyModel(grid));
    ToySource source;
    TrainerOptions o;
    o.vocabulary_async_collectives = true;
    auto t = Trainer::Create(&grid, model.get(), ToyLoss, &source, o);
    return Check(t.status().code() == absl::StatusCode::kInvalidArgument &&
                     std::string(t.status().message())
                             .find("TrainerOptions::vocabulary_async_collectives (true)") !=
                         std::string::npos &&
                     std::string(t.status().message()).find("TrainerOptions::vocabulary)") !=
                         std::string::npos,
                 "expected a refusal naming the option: " + t.status().ToString());
  });
  EXPECT_TRUE(s.ok()) << s;
}

// A schedule replaced between steps trains on from where the old one left:
// 1F1B then ZB-H1 gives 1F1B's losses (both equal sequential training), and a
// schedule of another shape or placement is refused, the old one kept.
TEST(TrainerTest, ReplaceTrainScheduleTrainsOn) {
  std::vector<std::vector<double>> losses(2);
  for (int replace = 0; replace < 2; ++replace) {
    absl::Status s = RunOnGrid(2, 1, seconds(20), [&](ParallelGrid& grid) -> absl::Status {
      PP_ASSIGN_OR_RETURN(auto model, ToyModel(grid));
      ToySource source;
      TrainerOptions o;
      o.num_microbatches = 4;
      PP_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(&grid, model.get(), ToyLoss, &source, o));
      for (int step = 0; step < 3; ++step) {
        if (replace && step == 1) {
          PP_ASSIGN_OR_RETURN(Schedule zb, MakeSchedule("zb_h1", {2, 4, 1, 0}));
          PP_RETURN_IF_ERROR(trainer->ReplaceTrainSchedule(zb));
          PP_RETURN_IF_ERROR(
              Check(trainer->train_program().schedule_name == "zb_h1", "zb_h1 runs next"));
        }
        PP_ASSIGN_OR_RETURN(StepResult r, trainer->Step());
        if (grid.stage_id() == 0) losses[replace].push_back(r.loss);
      }
      PP_ASSIGN_OR_RETURN(Schedule other_m, MakeSchedule("1f1b", {2, 3, 1, 0}));
      absl::Status m = trainer->ReplaceTrainSchedule(other_m);
      PP_RETURN_IF_ERROR(
          Check(absl::IsInvalidArgument(m) && m.message().find("m=3") != std::string::npos,
                "another m refused: " + m.ToString()));
      PP_ASSIGN_OR_RETURN(Schedule v, MakeSchedule("zbv", {2, 4, 2, 0}));
      absl::Status chunks = trainer->ReplaceTrainSchedule(v);
      PP_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(chunks), "2 chunks refused"));
      PP_ASSIGN_OR_RETURN(Schedule eval, MakeSchedule("inference", {2, 4, 1, 0}));
      PP_RETURN_IF_ERROR(Check(absl::IsInvalidArgument(trainer->ReplaceTrainSchedule(eval)),
                               "forward-only refused"));
      return Check(trainer->train_program().schedule_name == (replace ? "zb_h1" : "1f1b"),
                   "a refused schedule keeps the old one");
    });
    ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_EQ(losses[0].size(), 3u);
  ASSERT_EQ(losses[1].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 1e-5 * losses[0][i]) << i;
}

// TrainerOptions::idle_cores: each training step sets the planned BLAS
// threads around the planned actions (1F1B at p = 2, m = 4: stage 0's first F
// and last B) and none on stage 1; evaluation sets none; a replaced schedule
// is planned afresh (GPipe: stage 1 lends too, to its last F and first B).
// Without a setter the option is refused.
TEST(TrainerTest, IdleCoresFollowThePlanAndAReplacedSchedule) {
  absl::Status s = RunOnGrid(2, 1, seconds(20), [&](ParallelGrid& grid) -> absl::Status {
    PP_ASSIGN_OR_RETURN(auto model, ToyModel(grid));
    ToySource source;
    TrainerOptions o;
    o.num_microbatches = 4;
    o.idle_cores = IdleCoreOptions{.machine_cores = 2,
                                   .machine_ranks = 2,
                                   .base_threads = 1,
                                   .pipe_peers_on_machine = {1 - grid.stage_id()}};
    PP_RETURN_IF_ERROR(Check(
        absl::IsInvalidArgument(Trainer::Create(&grid, model.get(), ToyLoss, &source, o).status()),
        "idle cores without a setter refused"));
    std::vector<int> calls;
    o.set_blas_threads = [&calls](int threads) {
      calls.push_back(threads);
      return true;
    };
    PP_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(&grid, model.get(), ToyLoss, &source, o));
    const IdleCoreLender* lender = trainer->idle_core_lender();
    PP_RETURN_IF_ERROR(Check(lender != nullptr, "a lender"));
    const bool first = grid.stage_id() == 0;
    using Plan = absl::flat_hash_map<Action, int>;
    PP_RETURN_IF_ERROR(Check(lender->plan() == (first ? Plan{{F(0, 0), 2}, {B(0, 3), 2}} : Plan{}),
                             "1f1b's plan"));
    PP_RETURN_IF_ERROR(trainer->Step().status());
    PP_RETURN_IF_ERROR(Check(calls == (first ? std::vector<int>{2, 1, 2, 1} : std::vector<int>{}),
                             "the threads set in a step"));
    PP_RETURN_IF_ERROR(trainer->Evaluate(&source, 0).status());
    PP_RETURN_IF_ERROR(Check(calls.size() == (first ? 4u : 0u), "none in evaluation"));
    PP_ASSIGN_OR_RETURN(Schedule gpipe, MakeSchedule("gpipe", {2, 4, 1, 0}));
    PP_RETURN_IF_ERROR(trainer->ReplaceTrainSchedule(gpipe));
    PP_RETURN_IF_ERROR(Check(lender->plan() == (first ? Plan{{F(0, 0), 2}, {B(0, 3), 2}}
                                                      : Plan{{F(1, 3), 2}, {B(1, 0), 2}}),
                             "gpipe's plan"));
    PP_RETURN_IF_ERROR(trainer->Step().status());
    return Check(lender->lent_actions() == (first ? 4 : 2), "lent actions");
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace testing_runtime
}  // namespace pp
