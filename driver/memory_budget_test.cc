#include "driver/memory_budget.h"

#include <algorithm>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/gpt/gpt_config.pb.h"
#include "observability/memory_tracker.h"
#include "pipeline/runtime/optimizer.h"
#include "pipeline/runtime/vocab_layers.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

using driver::ExperimentConfig;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

constexpr double kMiB = 1024.0 * 1024.0;

// The README's GPT (width 128, 4 blocks, context 64) at pp = 2, m = 4.
ExperimentConfig SmallGpt(const std::string& schedule = "1f1b", int chunks = 1) {
  ExperimentConfig c;
  auto* gpt_config = c.mutable_model()->MutableExtension(gpt);
  gpt_config->set_context_length(64);
  gpt_config->set_width(128);
  gpt_config->set_num_heads(4);
  gpt_config->set_num_layers(4);
  gpt_config->set_mlp_ratio(4);
  auto* par = c.mutable_parallelism();
  par->set_pp(2);
  par->set_num_microbatches(4);
  par->set_micro_batch_size(8);
  par->set_schedule(schedule);
  par->set_chunks(chunks);
  return c;
}

Schedule Make(const ExperimentConfig& c) {
  const auto& par = c.parallelism();
  absl::StatusOr<Schedule> s =
      MakeSchedule(par.schedule(), {par.pp(), par.num_microbatches(), par.chunks(), 0});
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Schedule{};
}

MemoryPlan Plan(const ExperimentConfig& c) {
  absl::StatusOr<std::optional<MemoryPlan>> plan = PlanRunMemory(c, Make(c));
  EXPECT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan.ok() && plan->has_value());
  return plan.ok() && plan->has_value() ? **plan : MemoryPlan{};
}

// Parameters: 2 blocks per stage of (4 + 8) 128^2 + 13 x 128 = 198272 each;
// the first stage adds the token and position embeddings (260 + 64) x 128,
// the last the final norm and its copy of the tied embedding 260 x 128.
TEST(MemoryBudgetTest, StagesHoldTheirBlocksEmbeddingAndHead) {
  std::optional<RunMemoryInputs> in = RunMemoryInputsOf(SmallGpt(), 2);
  ASSERT_TRUE(in.has_value());
  ASSERT_EQ(in->stages.size(), 2u);
  EXPECT_DOUBLE_EQ(in->stages[0].parameter_bytes, (2 * 198272.0 + 324 * 128) * 4);
  EXPECT_DOUBLE_EQ(in->stages[1].parameter_bytes, (2 * 198272.0 + 256 + 260 * 128) * 4);
  // One micro-batch: 8 x 64 tokens, (7 + 8) x 128 fp32 values per token and
  // block plus 2 x 4 x 64 attention probabilities.
  const double block = 8 * 64 * (15 * 128 * 4 + 2 * 4 * 64 * 4.0);
  EXPECT_DOUBLE_EQ(in->stages[0].activation_bytes, 2 * block + 8 * 64 * 128 * 4);
  EXPECT_DOUBLE_EQ(in->stages[1].activation_bytes, 2 * block + 2 * 8 * 64 * 260 * 4);
  EXPECT_DOUBLE_EQ(in->stages[0].boundary_bytes, 8 * 64 * 128 * 4);
  EXPECT_EQ(in->stages[1].boundary_bytes, 0);
  // A split backward's I leaves 1.7 times the stage's activations for its
  // W; the first stage's I (no input gradients) leaves all of the backward.
  EXPECT_DOUBLE_EQ(in->stages[1].weight_pending_bytes, 1.7 * in->stages[1].activation_bytes);
  EXPECT_DOUBLE_EQ(in->stages[0].weight_pending_bytes, in->stages[0].activation_bytes);
  EXPECT_EQ(in->options.optimizer, OptimizerKind::kAdamW);
  EXPECT_FALSE(in->options.fp32_master_weights);
}

// tp = 2: each rank holds half of every block's matrices and
// column-parallel biases, the norms and row-parallel biases whole, half of
// the vocabulary (embedding, head, logits); 4 of a block's 15 activation
// widths whole and the attention probabilities halved; with sequence
// parallelism 2 widths whole, and the messages and the embedding's output
// half as long.
TEST(MemoryBudgetTest, TensorParallelRanksHoldTheirShare) {
  ExperimentConfig tp2 = SmallGpt();
  tp2.mutable_parallelism()->set_tp(2);
  std::optional<RunMemoryInputs> in = RunMemoryInputsOf(tp2, 2);
  ASSERT_TRUE(in.has_value());
  const double block_params = (12 * 128 * 128 + 7 * 128) / 2.0 + 6 * 128;
  EXPECT_DOUBLE_EQ(in->stages[0].parameter_bytes, (2 * block_params + (130 + 64) * 128) * 4);
  EXPECT_DOUBLE_EQ(in->stages[1].parameter_bytes, (2 * block_params + 256 + 130 * 128) * 4);
  const double block = 8 * 64 * ((4 + 11 / 2.0) * 128 * 4 + 2 * 4 * 64 * 4 / 2.0);
  EXPECT_DOUBLE_EQ(in->stages[0].activation_bytes, 2 * block + 8 * 64 * 128 * 4);
  EXPECT_DOUBLE_EQ(in->stages[1].activation_bytes, 2 * block + 2 * 8 * 64 * 130 * 4);
  EXPECT_DOUBLE_EQ(in->stages[0].boundary_bytes, 8 * 64 * 128 * 4);

  tp2.mutable_parallelism()->set_sequence_parallel(true);
  std::optional<RunMemoryInputs> sp = RunMemoryInputsOf(tp2, 2);
  ASSERT_TRUE(sp.has_value());
  const double sp_block = 8 * 64 * ((2 + 13 / 2.0) * 128 * 4 + 2 * 4 * 64 * 4 / 2.0);
  EXPECT_DOUBLE_EQ(sp->stages[0].activation_bytes, 2 * sp_block + 8 * 64 * 128 * 4 / 2.0);
  EXPECT_DOUBLE_EQ(sp->stages[0].boundary_bytes, 8 * 64 * 128 * 4 / 2.0);
  EXPECT_DOUBLE_EQ(sp->stages[0].parameter_bytes, in->stages[0].parameter_bytes);
}

// Vocabulary parallelism: the first stage keeps the position embedding, the
// last the final norm; every rank holds its 130 rows of the tied table and,
// per micro-batch between OUT_S and OUT_T, its logits' exps (130 per token,
// fp32), the head's input and 3 statistics. The planned schedule carries the
// passes, and the two ranks' planned parameters differ only by the positions
// and the norm.
TEST(MemoryBudgetTest, VocabularyParallelPutsTheTablesOnEveryRank) {
  ExperimentConfig vocab = SmallGpt();
  vocab.mutable_parallelism()->set_vocab_parallel(true);
  std::optional<RunMemoryInputs> in = RunMemoryInputsOf(vocab, 2);
  ASSERT_TRUE(in.has_value());
  EXPECT_DOUBLE_EQ(in->stages[0].parameter_bytes, (2 * 198272.0 + 64 * 128) * 4);
  EXPECT_DOUBLE_EQ(in->stages[1].parameter_bytes, (2 * 198272.0 + 256) * 4);
  const double block = 8 * 64 * (15 * 128 * 4 + 2 * 4 * 64 * 4.0);
  EXPECT_DOUBLE_EQ(in->stages[1].activation_bytes, 2 * block);
  EXPECT_DOUBLE_EQ(in->options.vocab.parameter_bytes, 130 * 128 * 4);
  EXPECT_DOUBLE_EQ(in->options.vocab.pending_bytes, 8 * 64 * (130 * 4 + 128 * 4 + 12));
  // The first stage's input, the summed embedding, has a gradient: its I
  // computes it and leaves W as much as any stage's I does.
  EXPECT_FALSE(in->stages[0].backward_in_weight);
  EXPECT_DOUBLE_EQ(in->stages[0].weight_pending_bytes, 1.7 * in->stages[0].activation_bytes);

  absl::StatusOr<Schedule> schedule = PlannedSchedule(vocab);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_TRUE(schedule->vocab_parallel);
  absl::StatusOr<std::optional<MemoryPlan>> plan = PlanRunMemory(vocab, *schedule);
  ASSERT_TRUE(plan.ok() && plan->has_value()) << plan.status();
  const MemoryPlan& p = **plan;
  ASSERT_EQ(p.ranks.size(), 2u);
  EXPECT_DOUBLE_EQ(p.ranks[0].parameters - p.ranks[1].parameters, (64 * 128 - 2 * 128) * 4);
  EXPECT_DOUBLE_EQ(p.ranks[1].parameters, (2 * 198272.0 + 256 + 130 * 128) * 4);
  EXPECT_GT(p.ranks[0].vocab_pending + p.ranks[1].vocab_pending, 0);
}

// The bytes a rank holds all step in `rank`'s plan.
double FixedBytes(const RankMemoryPlan& rank) {
  return rank.parameters + rank.master_weights + rank.gradients + rank.optimizer_state +
         rank.p2p_buffers;
}

// The most bytes `run` allocates beyond what was live before it (the CPU
// memory tracker's).
template <typename Fn>
double MeasuredBytes(Fn run) {
  const int64_t before = CpuMemoryStats().current_bytes;
  ResetCpuPeakMemory();
  run();
  return static_cast<double>(CpuMemoryStats().peak_bytes - before);
}

// Under vocabulary parallelism a rank whose vocabulary shard outweighs its
// blocks peaks inside a vocabulary pass or the optimizer step, beside what it
// holds all step. Measured here with the runtime's own code on a table of
// 65536 rows (32768 per rank at pp = 2), width 128, one sequence of 64
// tokens per micro-batch: OUT_S and OUT_T of one micro-batch (its logits'
// exps kept between them, the logits, their gradient, the rows' gradient),
// IN_B (the rows' gradient), and the AdamW step over the rank's planned
// parameters (its denominators). Every rank's planned peak must hold each
// beside the rank's fixed bytes, and the plan's own terms for them be near
// what was measured (not padded).
TEST(MemoryBudgetTest, VocabularyPassesAndOptimizerStepFitThePlannedPeak) {
  ASSERT_TRUE(InstallCpuMemoryTracking().ok());
  constexpr int64_t kVocab = 65536, kWidth = 128, kBatch = 1, kContext = 64;
  ExperimentConfig c = SmallGpt("1f1b");
  c.mutable_model()->MutableExtension(gpt)->set_vocab_size(kVocab);
  c.mutable_parallelism()->set_vocab_parallel(true);
  c.mutable_parallelism()->set_micro_batch_size(kBatch);
  ASSERT_EQ(c.optimizer().name(), "adamw");
  absl::StatusOr<Schedule> schedule = PlannedSchedule(c);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  absl::StatusOr<std::optional<MemoryPlan>> plan = PlanRunMemory(c, *schedule);
  ASSERT_TRUE(plan.ok() && plan->has_value()) << plan.status();
  const MemoryPlan& p = **plan;
  ASSERT_EQ(p.ranks.size(), 2u);

  torch::manual_seed(7);
  const torch::Tensor table = torch::randn({kVocab, kWidth}) * 0.02;
  VocabularyLayers rank0(table, table, /*tied=*/true, ModelParallelGroup{.rank = 0, .size = 2});
  VocabularyLayers rank1(table, table, /*tied=*/true, ModelParallelGroup{.rank = 1, .size = 2});
  const torch::Tensor hidden = torch::randn({kBatch, kContext, kWidth});
  const torch::Tensor labels = torch::randint(kVocab, {kBatch, kContext});
  const torch::Tensor scale = torch::full({kBatch, kContext}, 1.0 / (kBatch * kContext));
  // OUT_S to OUT_T of micro-batch mb on rank 0 (rank 1's statistics are
  // computed before, outside the measurement).
  auto output_passes = [&](int mb) {
    const torch::Tensor other = rank1.OutputS(mb, hidden, labels);
    return MeasuredBytes([&] {
      const torch::Tensor stats = rank0.OutputS(mb, hidden, labels);
      rank0.Combine(mb, torch::stack({stats, other}));
      rank0.OutputT(mb, scale);
    });
  };
  const torch::Tensor grad = torch::randn({kBatch, kContext, kWidth});
  auto input_pass = [&] { return MeasuredBytes([&] { rank0.EmbedBackward(labels, grad); }); };
  output_passes(0);  // the first ones allocate the rows' .grad
  input_pass();
  const double output_bytes = output_passes(1);
  const double input_bytes = input_pass();

  // The step over as many fp32 parameters as rank 0 plans, with gradients
  // and state (the first step allocates the moments).
  OptimizerConfig adamw;
  adamw.name = "adamw";
  torch::Tensor weights = torch::zeros({static_cast<int64_t>(p.ranks[0].parameters / 4)});
  weights.mutable_grad() = torch::ones_like(weights);
  std::unique_ptr<torch::optim::Optimizer> optimizer = MakeOptimizer(adamw, {weights});
  optimizer->step();
  const double step_bytes = MeasuredBytes([&] { optimizer->step(); });
  ASSERT_GT(output_bytes, 0);
  ASSERT_GT(step_bytes, 0);

  for (size_t r = 0; r < p.ranks.size(); ++r) {
    const RankMemoryPlan& rank = p.ranks[r];
    const double fixed = FixedBytes(rank);
    EXPECT_GE(rank.peak_bytes, fixed + output_bytes) << "rank " << r << ": OUT_S to OUT_T";
    EXPECT_GE(rank.peak_bytes, fixed + input_bytes) << "rank " << r << ": IN_B";
  }
  EXPECT_GE(p.ranks[0].peak_bytes, FixedBytes(p.ranks[0]) + step_bytes) << "the optimizer step";
  // The step alone, where the passes allocate nothing: it still fits.
  std::optional<RunMemoryInputs> in = RunMemoryInputsOf(c, 2);
  ASSERT_TRUE(in.has_value());
  MemoryPlanOptions no_passes = in->options;
  no_passes.vocab.output_s_workspace_bytes = 0;
  no_passes.vocab.output_t_workspace_bytes = 0;
  no_passes.vocab.input_b_workspace_bytes = 0;
  absl::StatusOr<MemoryPlan> step_only = PlanMemory(*schedule, in->stages, no_passes);
  ASSERT_TRUE(step_only.ok()) << step_only.status();
  // (The step also allocates a few bytes of scalars the plan leaves out.)
  constexpr double kScalars = 1024;
  EXPECT_GE(step_only->ranks[0].peak_bytes,
            FixedBytes(step_only->ranks[0]) + step_bytes - kScalars);
  // The plan's terms for them: within 5% of what was measured.
  const VocabMemory& vocab = in->options.vocab;
  EXPECT_NEAR((vocab.pending_bytes + vocab.output_t_workspace_bytes) / output_bytes, 1, 0.05);
  EXPECT_NEAR(vocab.input_b_workspace_bytes / input_bytes, 1, 0.05);
  EXPECT_NEAR(in->options.step_temporary_factor * p.ranks[0].parameters / step_bytes, 1, 0.05);
}

TEST(MemoryBudgetTest, Bf16HalvesActivationsAndAddsMasters) {
  ExperimentConfig bf16 = SmallGpt();
  bf16.set_precision("bf16");
  std::optional<RunMemoryInputs> fp = RunMemoryInputsOf(SmallGpt(), 2);
  std::optional<RunMemoryInputs> bf = RunMemoryInputsOf(bf16, 2);
  ASSERT_TRUE(fp.has_value() && bf.has_value());
  EXPECT_TRUE(bf->options.fp32_master_weights);
  EXPECT_EQ(bf->stages[0].boundary_bytes, fp->stages[0].boundary_bytes / 2);
  EXPECT_LT(bf->stages[0].activation_bytes, 0.7 * fp->stages[0].activation_bytes);
  const MemoryPlan plan = Plan(bf16);
  EXPECT_GT(plan.ranks[0].master_weights, 0);
  EXPECT_DOUBLE_EQ(plan.ranks[0].master_weights, 2 * plan.ranks[0].parameters);
}

// Checkpointing every block: a stage keeps each range's input and its own
// output, and regenerates one block during the backward, beside the gradient
// of its MLP's hidden layer (4 widths). Its first range's input is the
// stage's (a receive buffer, or on stage 0 the embedding's output, counted
// once): stage 0 of 2 keeps 3 widths per token (block 1's input, its output,
// the embedding's output), the last stage 1 (block 3's input) besides its
// logits.
TEST(MemoryBudgetTest, CheckpointingKeepsRangeInputsAndRegeneratesOneRange) {
  ExperimentConfig c = SmallGpt();
  c.mutable_parallelism()->mutable_activation_checkpointing()->set_interval(1);
  std::optional<RunMemoryInputs> in = RunMemoryInputsOf(c, 2);
  ASSERT_TRUE(in.has_value());
  const double block = 8 * 64 * (15 * 128 * 4 + 2 * 4 * 64 * 4.0);
  const double width = 8 * 64 * 128 * 4.0;
  EXPECT_DOUBLE_EQ(in->stages[0].activation_bytes, 3 * width);
  EXPECT_DOUBLE_EQ(in->stages[1].activation_bytes, width + 2 * 8 * 64 * 260 * 4);
  EXPECT_DOUBLE_EQ(in->stages[0].recompute_bytes, block + 4 * width);
}

TEST(MemoryBudgetTest, ScheduleDecidesMicroBatchesInFlight) {
  const MemoryPlan one_f_one_b = Plan(SmallGpt("1f1b"));
  const MemoryPlan gpipe = Plan(SmallGpt("gpipe"));
  ASSERT_EQ(one_f_one_b.ranks.size(), 2u);
  // Rank 0 holds 2 of 4 micro-batches under 1F1B, all 4 under GPipe.
  EXPECT_NEAR(gpipe.ranks[0].activations, 2 * one_f_one_b.ranks[0].activations, 1);
  EXPECT_GT(gpipe.ranks[0].peak_bytes, one_f_one_b.ranks[0].peak_bytes);
}

TEST(MemoryBudgetTest, NoCapOrAGenerousCapPasses) {
  EXPECT_TRUE(CheckMemoryCap(SmallGpt()).ok());
  ExperimentConfig c = SmallGpt("gpipe");
  c.mutable_parallelism()->set_memory_cap_mib(1024);
  EXPECT_TRUE(CheckMemoryCap(c).ok()) << CheckMemoryCap(c);
}

// A cap between 1F1B's and GPipe's predicted peaks: GPipe is refused naming
// the rank, its bytes and terms, and 1F1B is offered.
TEST(MemoryBudgetTest, RefusalNamesRankBytesTermsAndWhatFits) {
  const double cap_mib =
      (Plan(SmallGpt("1f1b")).ranks[0].peak_bytes + Plan(SmallGpt("gpipe")).ranks[0].peak_bytes) /
      2 / kMiB;
  ExperimentConfig c = SmallGpt("gpipe");
  c.mutable_parallelism()->set_memory_cap_mib(cap_mib);
  const absl::Status s = CheckMemoryCap(c);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS(s.message(), "parallelism.memory_cap_mib=");
  EXPECT_HAS(s.message(), "pipeline rank ");
  EXPECT_HAS(s.message(), "under schedule 'gpipe' (activations ");
  EXPECT_HAS(s.message(), "over the cap");
  EXPECT_HAS(s.message(), "Would fit: ");
  EXPECT_HAS(s.message(), "schedule '1f1b'");
  EXPECT_HAS(s.message(), "activation checkpointing of every layer");
  EXPECT_HAS(s.message(), "micro_batch_size=");
  EXPECT_HAS(s.message(), "a partition with fewer layers on rank ");
  // The same cap holds 1F1B.
  c.mutable_parallelism()->set_schedule("1f1b");
  EXPECT_TRUE(CheckMemoryCap(c).ok()) << CheckMemoryCap(c);
}

// The largest rank's planned peak of `c` under the schedule the run trains
// (PlannedSchedule: with the vocabulary passes the Trainer places).
double PlannedRunPeak(const ExperimentConfig& c) {
  absl::StatusOr<Schedule> schedule = PlannedSchedule(c);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  if (!schedule.ok()) return 0;
  absl::StatusOr<std::optional<MemoryPlan>> plan = PlanRunMemory(c, *schedule);
  EXPECT_TRUE(plan.ok() && plan->has_value()) << plan.status();
  double peak = 0;
  if (plan.ok() && plan->has_value()) {
    for (const RankMemoryPlan& r : (*plan)->ranks) peak = std::max(peak, r.peak_bytes);
  }
  return peak;
}

// Under vocabulary parallelism the registered schedules with their own
// passes are offered too (1f1b_vocab, 1f1b_vocab1), only those of the form
// parallelism.vocab_barriers asks for when it is 1 or 2; without vocabulary
// parallelism none is.
TEST(MemoryBudgetTest, VocabularySchedulesAreOfferedToAVocabularyRun) {
  ExperimentConfig c = SmallGpt("gpipe");
  c.mutable_parallelism()->set_vocab_parallel(true);
  double fitting = 0;
  for (const char* name : {"1f1b_vocab", "1f1b_vocab1"}) {
    ExperimentConfig other = c;
    other.mutable_parallelism()->set_schedule(name);
    fitting = std::max(fitting, PlannedRunPeak(other));
  }
  const double gpipe = PlannedRunPeak(c);
  ASSERT_LT(fitting, gpipe);
  c.mutable_parallelism()->set_memory_cap_mib((fitting + gpipe) / 2 / kMiB);
  absl::Status s = CheckMemoryCap(c);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS(s.message(), "schedule '1f1b_vocab'");
  EXPECT_HAS(s.message(), "schedule '1f1b_vocab1'");
  EXPECT_HAS(s.message(), "schedule '1f1b'");  // the passes placed
  for (int barriers : {1, 2}) {
    c.mutable_parallelism()->set_vocab_barriers(barriers);
    s = CheckMemoryCap(c);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    const std::string message(s.message());
    EXPECT_EQ(message.find("schedule '1f1b_vocab'") != std::string::npos, barriers == 2) << message;
    EXPECT_EQ(message.find("schedule '1f1b_vocab1'") != std::string::npos, barriers == 1)
        << message;
  }
  // A run without vocabulary parallelism is offered none of them.
  ExperimentConfig dense = SmallGpt("gpipe");
  dense.mutable_parallelism()->set_memory_cap_mib(
      (Plan(SmallGpt("1f1b")).ranks[0].peak_bytes + Plan(dense).ranks[0].peak_bytes) / 2 / kMiB);
  s = CheckMemoryCap(dense);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(std::string(s.message()).find("_vocab"), std::string::npos) << s.message();
}

// dp = 2: a cap between the peaks with and without the distributed
// optimizer is refused with the distributed optimizer in the "would fit"
// list, and holds with it.
TEST(MemoryBudgetTest, CapThatFitsOnlyShardedSaysSo) {
  ExperimentConfig c = SmallGpt("1f1b");
  c.mutable_parallelism()->set_dp(2);
  ExperimentConfig sharded = c;
  sharded.mutable_parallelism()->set_distributed_optimizer(true);
  const RankMemoryPlan whole = Plan(c).ranks[0];
  const RankMemoryPlan sliced = Plan(sharded).ranks[0];
  EXPECT_DOUBLE_EQ(sliced.optimizer_state, whole.optimizer_state / 2);
  ASSERT_LT(sliced.peak_bytes, whole.peak_bytes);
  c.mutable_parallelism()->set_memory_cap_mib((sliced.peak_bytes + whole.peak_bytes) / 2 / kMiB);
  const absl::Status s = CheckMemoryCap(c);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS(s.message(), "the distributed optimizer (parallelism.distributed_optimizer=true");
  c.mutable_parallelism()->set_distributed_optimizer(true);
  EXPECT_TRUE(CheckMemoryCap(c).ok()) << CheckMemoryCap(c);
}

TEST(MemoryBudgetTest, BadCapIsRefused) {
  ExperimentConfig c = SmallGpt();
  c.mutable_parallelism()->set_memory_cap_mib(-1);
  EXPECT_HAS(CheckMemoryCap(c).message(), "parallelism.memory_cap_mib is -1");
  // Below the fixed bytes: nothing fits, and the synthesiser has no room.
  c.mutable_parallelism()->set_memory_cap_mib(0.5);
  EXPECT_EQ(CheckMemoryCap(c).code(), absl::StatusCode::kInvalidArgument);
  c.mutable_parallelism()->set_schedule("auto");
  absl::StatusOr<std::optional<double>> units = SynthesisMemoryCap(c);
  EXPECT_EQ(units.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(units.status().message(), "a schedule needs at least 1");
}

// The synthesiser's cap in units of one virtual stage's micro-batch
// activations: 1F1B's peak bytes give about p = 2 units on rank 0, a larger
// cap more; no cap gives none.
TEST(MemoryBudgetTest, SynthesisCapInActivationUnits) {
  ExperimentConfig c = SmallGpt("auto");
  absl::StatusOr<std::optional<double>> none = SynthesisMemoryCap(c);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  const MemoryPlan plan = Plan(SmallGpt("1f1b"));
  const double peak = std::max(plan.ranks[0].peak_bytes, plan.ranks[1].peak_bytes);
  c.mutable_parallelism()->set_memory_cap_mib(peak / kMiB);
  absl::StatusOr<std::optional<double>> at_peak = SynthesisMemoryCap(c);
  ASSERT_TRUE(at_peak.ok()) << at_peak.status();
  ASSERT_TRUE(at_peak->has_value());
  EXPECT_GE(**at_peak, 1.5);
  EXPECT_LE(**at_peak, 2.5);
  c.mutable_parallelism()->set_memory_cap_mib(2 * peak / kMiB);
  absl::StatusOr<std::optional<double>> doubled = SynthesisMemoryCap(c);
  ASSERT_TRUE(doubled.ok() && doubled->has_value());
  EXPECT_GT(**doubled, **at_peak + 1);
}

}  // namespace
}  // namespace pp
