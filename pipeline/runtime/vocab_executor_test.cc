// The StageExecutor running vocabulary-parallel programs (issue #40): the
// embedding and the head split over all pipeline ranks (real Gloo groups,
// ranks as threads), every parameter's gradient and the loss equal to the
// dense model's autograd. Covering set: 1f1b_vocab at p 2 and 4 (tied and
// untied), zbv_vocab at p 2 (V placement, split backward I/W) with a
// vocabulary that leaves padding rows; planted: a missing sum of the shares
// (the IN_REDUCE/OUT_REDUCE all-reduces) and a shard off by one row; an
// evaluation program reports the dense loss. Asynchronous collectives
// (StageExecutorOptions::vocabulary_async_collectives): 1f1b_vocab and
// zbv_vocab at p 2 in both output algorithms, and at p 4 tied, give the
// blocking run's bits; the planted missing sum is caught with them too.
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "pipeline/runtime/action_observer.h"
#include "pipeline/runtime/stage_executor.h"
#include "pipeline/runtime/vocab_layers.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/ir/vocab_passes.h"
#include "pipeline/schedule/schedules/registry.h"
#include "pipeline/tensor_parallel/planted_fault.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

constexpr int64_t kDim = 4, kBatch = 2, kSeq = 3;
constexpr int64_t kIgnore = -100;

// The dense model: embedding, one tanh(Linear) per virtual stage, a head.
struct Dense {
  torch::Tensor embedding, head;      // [vocab, D]
  std::vector<torch::Tensor> blocks;  // [D, D] per virtual stage
};

Dense MakeDense(int64_t vocab, int stages, bool tied) {
  torch::manual_seed(7);
  Dense d;
  d.embedding = torch::randn({vocab, kDim});
  d.head = tied ? d.embedding : torch::randn({vocab, kDim});
  for (int s = 0; s < stages; ++s) d.blocks.push_back(torch::randn({kDim, kDim}) * 0.7);
  return d;
}

// Micro-batch `index`: token ids and labels (two of them ignored), seeded.
MicroBatchData Batch(int64_t vocab, int64_t index) {
  torch::Generator gen = at::detail::createCPUGenerator(1000 + index);
  MicroBatchData data;
  data.inputs = {torch::randint(vocab, {kBatch, kSeq}, gen)};
  torch::Tensor labels = torch::randint(vocab, {kBatch, kSeq}, gen);
  labels[0][index % kSeq] = kIgnore;
  labels[1][(index + 1) % kSeq] = kIgnore;
  data.batch.id = index;
  data.batch.tensors["labels"] = labels;
  return data;
}

class Source : public MicroBatchSource {
 public:
  explicit Source(int64_t vocab) : vocab_(vocab) {}
  absl::StatusOr<MicroBatchData> Get(int64_t, int64_t index) override {
    return Batch(vocab_, index);
  }

 private:
  int64_t vocab_;
};

torch::Tensor Block(const torch::Tensor& x, const torch::Tensor& w) {
  return torch::tanh(torch::matmul(x, w.t()));
}

// Dense autograd: the step's loss (mean of micro-batch means) and every
// parameter's gradient.
struct DenseResult {
  double loss = 0;
  torch::Tensor embedding_grad, head_grad;
  std::vector<torch::Tensor> block_grads;
};

DenseResult DenseStep(const Dense& d, int64_t vocab, int m, bool tied) {
  torch::Tensor e = d.embedding.clone().requires_grad_(true);
  torch::Tensor h = tied ? e : d.head.clone().requires_grad_(true);
  std::vector<torch::Tensor> w;
  for (const torch::Tensor& b : d.blocks) w.push_back(b.clone().requires_grad_(true));
  torch::Tensor total = torch::zeros({});
  for (int mb = 0; mb < m; ++mb) {
    MicroBatchData data = Batch(vocab, mb);
    torch::Tensor x = torch::embedding(e, data.inputs[0]);
    for (const torch::Tensor& wi : w) x = Block(x, wi);
    torch::Tensor logits = torch::matmul(x, h.t());
    total = total + torch::nn::functional::cross_entropy(
                        logits.reshape({-1, vocab}), data.batch.Get("labels").reshape({-1}),
                        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnore)) /
                        m;
  }
  total.backward();
  DenseResult r;
  r.loss = total.item<double>();
  r.embedding_grad = e.grad();
  r.head_grad = tied ? e.grad() : h.grad();
  for (const torch::Tensor& wi : w) r.block_grads.push_back(wi.grad());
  return r;
}

absl::Status Near(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  if (!got.defined()) return absl::InternalError(absl::StrCat(what, ": no gradient"));
  const double diff = (got - want).abs().max().item<double>();
  if (diff > 1e-5) {
    return absl::InternalError(absl::StrCat(what, ": max |pipeline - dense| = ", diff));
  }
  return absl::OkStatus();
}

struct Case {
  std::string schedule;
  int p, m, v;
  int64_t vocab;
  bool tied;
  // Planted: rank 1's shards cut from the table shifted by one row.
  bool shard_off_by_one = false;
  // StageExecutorOptions::vocabulary_async_collectives.
  bool async = false;
  // > 0: rank 1 reaches micro-batch 0's IN_REDUCE this late, and rank 0
  // writes how long that action and its reader, stage 0's F, took it into
  // *in_reduce_ms and *reader_ms.
  int late_ms = 0;
  double* in_reduce_ms = nullptr;
  double* reader_ms = nullptr;
  // With late_ms: rank 0 writes how long after its IN_REDUCE's start the
  // collective completed (ActionObserver::CollectiveCompleted; -1 if never
  // told), and how many completions it was told of, of how many collectives.
  double* in_reduce_flight_ms = nullptr;
  int* completions_told = nullptr;
  int* collectives_run = nullptr;
};

// Makes rank 1 late for micro-batch 0's IN_REDUCE; times that action and
// stage 0's F of the micro-batch (its reader) on rank 0, as observed.
class LateInputReduce : public ActionObserver {
 public:
  LateInputReduce(int rank, const Case& c) : rank_(rank), c_(c) {}
  void ActionStart(const ObservedStep&, const Action& a) override {
    if (a == F(0, 0)) start_ = std::chrono::steady_clock::now();
    if (rank_ == 0 && IsVocabCollective(a.type) && c_.collectives_run != nullptr) {
      ++*c_.collectives_run;
    }
    if (a.type != ActionType::kVocabInputReduce || a.microbatch != 0) return;
    if (rank_ == 1) std::this_thread::sleep_for(std::chrono::milliseconds(c_.late_ms));
    start_ = std::chrono::steady_clock::now();
    in_reduce_start_ = start_;
  }
  void ActionEnd(const ObservedStep&, const Action& a) override {
    if (rank_ != 0) return;
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
            .count();
    if (a == F(0, 0)) *c_.reader_ms = ms;
    if (a.type == ActionType::kVocabInputReduce && a.microbatch == 0) *c_.in_reduce_ms = ms;
  }
  void CollectiveCompleted(const ObservedStep&, const Action& started,
                           int64_t completed_us) override {
    if (rank_ != 0 || c_.completions_told == nullptr) return;
    ++*c_.completions_told;
    if (started.type != ActionType::kVocabInputReduce || started.microbatch != 0) return;
    const int64_t start_us =
        std::chrono::duration_cast<std::chrono::microseconds>(in_reduce_start_.time_since_epoch())
            .count();
    *c_.in_reduce_flight_ms = (completed_us - start_us) / 1000.0;
  }

 private:
  int rank_;
  const Case& c_;
  std::chrono::steady_clock::time_point start_, in_reduce_start_;
};

// What one rank's step produced, for a bitwise comparison of two runs.
struct RankResult {
  double loss_sum = 0.0;
  int64_t losses_computed = 0;
  std::map<int, torch::Tensor> block_grads;
  torch::Tensor embedding_grad, head_grad;
};

// Runs `c` and checks it against the dense model; with `results`, also
// keeps each rank's step there (by rank).
absl::Status RunCase(const Case& c, std::map<int, RankResult>* results = nullptr) {
  std::mutex results_mutex;
  const int stages = c.p * c.v;
  const Dense dense = MakeDense(c.vocab, stages, c.tied);
  const DenseResult want = DenseStep(dense, c.vocab, c.m, c.tied);
  return RunOnThreadRanks(c.p, std::chrono::milliseconds(60000), [&](World& world) -> absl::Status {
    absl::StatusOr<Schedule> schedule = MakeSchedule(c.schedule, {c.p, c.m, c.v, 0});
    PP_RETURN_IF_ERROR(schedule.status());
    PP_ASSIGN_OR_RETURN(LoweredProgram program, Lower(*schedule));
    ModelParallelGroup pipe{world.rank, world.size, world.group};
    torch::Tensor embedding = dense.embedding, head = dense.head;
    if (c.shard_off_by_one && world.rank == 1) {
      embedding = dense.embedding.roll(1, 0);
      head = dense.head.roll(1, 0);
    }
    VocabularyLayers vocab(embedding, head, c.tied, pipe, kIgnore);
    std::map<int, torch::Tensor> weights;
    std::map<int, std::function<Activations(const Activations&, const MicroBatch&)>> fns;
    for (int s = 0; s < stages; ++s) {
      if (program.stage_to_rank[s] != world.rank) continue;
      weights[s] = dense.blocks[s].clone().requires_grad_(true);
      torch::Tensor w = weights[s];
      fns[s] = [w](const Activations& in, const MicroBatch&) {
        return Activations{Block(in[0], w)};
      };
    }
    Source source(c.vocab);
    StageExecutorOptions options;
    options.vocabulary_async_collectives = c.async;
    StageExecutor exec(world.rank, fns, LossFn(), &source, world.group, options);
    exec.set_vocabulary(&vocab);
    LateInputReduce late(world.rank, c);
    if (c.late_ms > 0) exec.set_observer(&late);
    PP_ASSIGN_OR_RETURN(StepStats stats,
                        exec.Run(program, 0, [](const Action&) { return absl::OkStatus(); }));
    if (results != nullptr) {
      RankResult mine{
          stats.loss_sum, stats.losses_computed, {}, vocab.embedding().grad(), vocab.head().grad()};
      for (const auto& [s, w] : weights) mine.block_grads[s] = w.grad();
      std::lock_guard<std::mutex> lock(results_mutex);
      (*results)[world.rank] = std::move(mine);
    }
    for (const auto& [s, w] : weights) {
      PP_RETURN_IF_ERROR(Near(w.grad(), want.block_grads[s], absl::StrCat("block ", s)));
    }
    const tensor_parallel::VocabRange range = vocab.range();
    auto rows = [&](const torch::Tensor& full) {
      return tensor_parallel::LocalVocabRows(full, pipe);
    };
    PP_RETURN_IF_ERROR(Near(vocab.embedding().grad(), rows(want.embedding_grad),
                            absl::StrCat("embedding rows [", range.begin, ", ", range.end, ")",
                                         c.tied ? " (tied: both uses)" : "")));
    if (!c.tied) {
      PP_RETURN_IF_ERROR(Near(vocab.head().grad(), rows(want.head_grad), "head rows"));
    }
    if (world.rank == program.stage_to_rank[stages - 1]) {
      const double loss = stats.loss_sum / c.m;
      if (stats.losses_computed != c.m || std::abs(loss - want.loss) > 1e-5) {
        return absl::InternalError(absl::StrCat("loss ", loss, " over ", stats.losses_computed,
                                                " micro-batches; dense ", want.loss));
      }
    }
    return absl::OkStatus();
  });
}

TEST(VocabExecutorTest, GradientsAndLossEqualTheDenseModel) {
  for (const Case& c :
       {Case{"1f1b_vocab", 2, 4, 1, 11, true}, Case{"1f1b_vocab", 2, 3, 1, 10, false},
        Case{"1f1b_vocab", 4, 6, 1, 13, true}, Case{"zbv_vocab", 2, 4, 2, 9, false},
        // One barrier: OUT_T after the last stage's backward.
        Case{"1f1b_vocab1", 2, 3, 1, 10, false}, Case{"1f1b_vocab1", 4, 6, 1, 13, true},
        Case{"zbv_vocab1", 2, 4, 2, 9, false}}) {
    SCOPED_TRACE(absl::StrCat(c.schedule, " p=", c.p, " m=", c.m, " vocab=", c.vocab,
                              c.tied ? " tied" : " untied"));
    absl::Status s = RunCase(c);
    EXPECT_TRUE(s.ok()) << s;
  }
}

// Asynchronous collectives (started by their action, waited for where their
// result is first read) train the same bits as blocking ones: every rank's
// loss sum and every gradient torch::equal, for both output algorithms, with
// V placement and split backward, tied and untied; and still the dense
// model's.
TEST(VocabExecutorTest, AsynchronousCollectivesGiveTheBlockingBits) {
  for (Case c : {Case{"1f1b_vocab", 2, 4, 1, 11, false}, Case{"1f1b_vocab1", 2, 4, 1, 11, false},
                 Case{"zbv_vocab", 2, 4, 2, 9, false}, Case{"zbv_vocab1", 2, 4, 2, 9, false},
                 Case{"1f1b_vocab", 4, 6, 1, 13, true}, Case{"1f1b_vocab1", 4, 6, 1, 13, true}}) {
    SCOPED_TRACE(absl::StrCat(c.schedule, " p=", c.p, " m=", c.m, " vocab=", c.vocab,
                              c.tied ? " tied" : " untied"));
    std::map<int, RankResult> blocking, async;
    c.async = false;
    absl::Status s = RunCase(c, &blocking);
    ASSERT_TRUE(s.ok()) << s;
    c.async = true;
    s = RunCase(c, &async);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(async.size(), blocking.size());
    for (const auto& [rank, want] : blocking) {
      SCOPED_TRACE(absl::StrCat("rank ", rank));
      const RankResult& got = async.at(rank);
      EXPECT_EQ(got.loss_sum, want.loss_sum);
      EXPECT_EQ(got.losses_computed, want.losses_computed);
      EXPECT_TRUE(torch::equal(got.embedding_grad, want.embedding_grad));
      if (!c.tied) {
        EXPECT_TRUE(torch::equal(got.head_grad, want.head_grad));
      }
      ASSERT_EQ(got.block_grads.size(), want.block_grads.size());
      for (const auto& [stage, grad] : want.block_grads) {
        EXPECT_TRUE(torch::equal(got.block_grads.at(stage), grad)) << "block " << stage;
      }
    }
  }
}

// The asynchronous form does not wait in the collective's action: with rank
// 1 late by 400 ms for micro-batch 0's IN_REDUCE, rank 0's IN_REDUCE returns
// at once and the wait comes before stage 0's F, outside its observed span
// (idle time, not the F's compute), and the observer learns when the
// collective completed; the blocking one waits for rank 1 in the IN_REDUCE.
// Both still train the dense model's gradients.
TEST(VocabExecutorTest, AsynchronousCollectivesDoNotWaitInTheirAction) {
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "asynchronous" : "blocking");
    double in_reduce_ms = -1, reader_ms = -1, flight_ms = -1;
    int told = 0, collectives = 0;
    Case c{"1f1b_vocab", 2, 2, 1, 11, false};
    c.async = async;
    c.late_ms = 400;
    c.in_reduce_ms = &in_reduce_ms;
    c.reader_ms = &reader_ms;
    c.in_reduce_flight_ms = &flight_ms;
    c.completions_told = &told;
    c.collectives_run = &collectives;
    absl::Status s = RunCase(c);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_GE(reader_ms, 0);
    EXPECT_LT(reader_ms, 200);
    EXPECT_GT(collectives, 0);
    if (async) {
      EXPECT_GE(in_reduce_ms, 0);
      EXPECT_LT(in_reduce_ms, 200);
      // The observer is told when each collective completed: the late
      // IN_REDUCE only once rank 1 came, long after its start returned.
      EXPECT_EQ(told, collectives);
      EXPECT_GT(flight_ms, 200);
      EXPECT_LT(flight_ms, 2000);
    } else {
      EXPECT_GT(in_reduce_ms, 200);
      EXPECT_EQ(told, 0);  // blocking: the action's span is the collective
    }
  }
}

// Evaluation: an inference program with the passes (IN_F, OUT_S and their
// collectives, no backward) reports the dense loss and keeps nothing.
TEST(VocabExecutorTest, ForwardOnlyReportsTheDenseLoss) {
  const int p = 2, m = 3;
  const int64_t vocab_size = 11;
  const Dense dense = MakeDense(vocab_size, p, /*tied=*/true);
  const DenseResult want = DenseStep(dense, vocab_size, m, /*tied=*/true);
  absl::Status s = RunOnThreadRanks(p, std::chrono::milliseconds(20000), [&](World& world) {
    absl::StatusOr<Schedule> base = MakeSchedule("inference", {p, m, 1, 0});
    PP_RETURN_IF_ERROR(base.status());
    PP_ASSIGN_OR_RETURN(Schedule schedule, AddVocabularyPasses(*base));
    PP_ASSIGN_OR_RETURN(LoweredProgram program, Lower(schedule));
    VocabularyLayers vocab(dense.embedding, dense.head, true,
                           ModelParallelGroup{world.rank, world.size, world.group}, kIgnore);
    torch::Tensor w = dense.blocks[world.rank];
    std::map<int, std::function<Activations(const Activations&, const MicroBatch&)>> fns = {
        {world.rank,
         [w](const Activations& in, const MicroBatch&) { return Activations{Block(in[0], w)}; }}};
    Source source(vocab_size);
    StageExecutor exec(world.rank, fns, LossFn(), &source, world.group, StageExecutorOptions{});
    exec.set_vocabulary(&vocab);
    PP_ASSIGN_OR_RETURN(StepStats stats,
                        exec.Run(program, 0, [](const Action&) { return absl::OkStatus(); }));
    if (vocab.pending() != 0) {
      return absl::InternalError(absl::StrCat(vocab.pending(), " micro-batches left pending"));
    }
    if (world.rank == p - 1 &&
        (stats.losses_computed != m || std::abs(stats.loss_sum / m - want.loss) > 1e-5)) {
      return absl::InternalError(absl::StrCat("evaluation loss ", stats.loss_sum / m, " over ",
                                              stats.losses_computed, "; dense ", want.loss));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(VocabExecutorTest, PlantedFaultsAreCaught) {
  const Case base{"1f1b_vocab", 2, 4, 1, 11, true};
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "asynchronous collectives" : "blocking collectives");
    Case c = base;
    c.async = async;
    // The shares are not summed: stage 0 sees one rank's rows of the
    // embedding, the last stage one rank's share of its output gradient.
    tensor_parallel::internal::PlantedFault before = tensor_parallel::internal::PlantFault(
        tensor_parallel::internal::PlantedFault::kSkipAllReduce);
    absl::Status s = RunCase(c);
    tensor_parallel::internal::PlantFault(before);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(std::string(s.message()).find("max |pipeline - dense|"), std::string::npos) << s;
  }
  Case shifted = base;
  shifted.shard_off_by_one = true;
  absl::Status s = RunCase(shifted);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("max |pipeline - dense|"), std::string::npos) << s;
}

TEST(VocabExecutorTest, AVocabularyProgramNeedsTheVocabularyLayers) {
  absl::Status s = RunOnThreadRanks(2, std::chrono::milliseconds(20000), [&](World& world) {
    absl::StatusOr<Schedule> schedule = MakeSchedule("1f1b_vocab", {2, 2, 1, 0});
    PP_RETURN_IF_ERROR(schedule.status());
    PP_ASSIGN_OR_RETURN(LoweredProgram program, Lower(*schedule));
    std::map<int, std::function<Activations(const Activations&, const MicroBatch&)>> fns = {
        {world.rank, [](const Activations& in, const MicroBatch&) { return in; }}};
    Source source(5);
    StageExecutor exec(world.rank, fns, LossFn(), &source, world.group, StageExecutorOptions{});
    absl::Status v = exec.Validate(program);
    if (v.code() != absl::StatusCode::kUnimplemented ||
        std::string(v.message()).find("vocabulary parallelism") == std::string::npos) {
      return absl::InternalError(
          absl::StrCat("expected Unimplemented naming vocabulary "
                       "parallelism, got ",
                       v.ToString()));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace pp
