#include "pipeline/schedule/analysis/memory_plan.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/ir/vocab_passes.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

Schedule Make(const std::string& name, int p, int m, int v = 1) {
  ScheduleOptions options;
  options.num_stages = p;
  options.num_microbatches = m;
  options.num_chunks = v;
  absl::StatusOr<Schedule> schedule = MakeSchedule(name, options);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  return schedule.ok() ? *schedule : Schedule{};
}

// Every virtual stage: 10 parameter bytes, 100 activation bytes per
// micro-batch, 1 boundary byte.
std::vector<StageMemory> Uniform(int virtual_stages) {
  return std::vector<StageMemory>(virtual_stages, StageMemory{10, 100, 0, 1});
}

std::vector<double> Peaks(const Schedule& schedule, const std::vector<StageMemory>& stages,
                          const MemoryPlanOptions& options = {}) {
  absl::StatusOr<MemoryPlan> plan = PlanMemory(schedule, stages, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  std::vector<double> peaks;
  if (plan.ok()) {
    for (const RankMemoryPlan& r : plan->ranks) peaks.push_back(r.peak_bytes);
  }
  return peaks;
}

// AdamW, one stage per rank: fixed = 10 parameters + 10 gradients + 20
// optimizer state = 40, plus the p2p buffers: the most received tensors (1
// byte each) in use at once (inputs kept from F to B, an output gradient
// during B), plus the messages sent to other ranks, kept until the step's
// tail (an F's output once its B is done, each B's input gradient).
// p = 2, m = 4, 1F1B (F0 F1 B0 F2 B1 F3 B2 B3 on rank 0): rank 0 peaks at F3
// with 2 x 100 held, 1 gradient buffer and 2 outputs sent: 243; rank 1 (F0
// B0 F1 B1 ...) at F3 with 100, 1 input buffer and 3 gradients sent: 144.
// GPipe peaks at B0, before anything is sent: 441 and 40 + 4 inputs + 400.
TEST(MemoryPlanTest, OneFOneBAndGPipeAtTwoStages) {
  EXPECT_EQ(Peaks(Make("1f1b", 2, 4), Uniform(2)), (std::vector<double>{243, 144}));
  EXPECT_EQ(Peaks(Make("gpipe", 2, 4), Uniform(2)), (std::vector<double>{441, 444}));
}

// p = 4, m = 8. 1F1B: 4, 3, 2, 1 in flight, each rank peaking at F7: rank 0
// 40 + 1 + 400 + 4 outputs sent = 445; rank 1 (3 inputs and a gradient in
// use during a B, 5 backwards done, 2 messages each) 40 + 4 + 300 + 10 = 354;
// rank 2 40 + 3 + 200 + 12 = 255; rank 3 40 + 1 + 100 + 7 = 148. GPipe: 8
// each, the middle ranks with 8 inputs and a gradient: 841, 849, 849, 848.
TEST(MemoryPlanTest, OneFOneBAndGPipeAtFourStages) {
  EXPECT_EQ(Peaks(Make("1f1b", 4, 8), Uniform(4)), (std::vector<double>{445, 354, 255, 148}));
  EXPECT_EQ(Peaks(Make("gpipe", 4, 8), Uniform(4)), (std::vector<double>{841, 849, 849, 848}));
}

// What a rank sent to another one stays live until the step's tail (a Gloo
// send completes only when the tail waits for it: pipeline/runtime/p2p.h),
// so 1F1B's peak grows with every backward done. Activations 100, no
// parameters: rank 1 at F7 holds 3 x 100, 4 buffers and 10 sent messages;
// the last rank sends only input gradients (7 by F7).
TEST(MemoryPlanTest, SentMessagesLiveUntilTheStepsTail) {
  absl::StatusOr<MemoryPlan> plan =
      PlanMemory(Make("1f1b", 4, 8), std::vector<StageMemory>(4, StageMemory{0, 100, 0, 1}));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ranks[1].sent_messages, 10);
  EXPECT_EQ(plan->ranks[1].peak_bytes, 300 + 4 + 10);
  EXPECT_EQ(plan->ranks[3].sent_messages, 7);
  EXPECT_EQ(plan->ranks[3].peak_bytes, 100 + 1 + 7);
  bool named = false;
  for (const auto& [name, bytes] : plan->ranks[1].Terms()) named |= name == "sent messages";
  EXPECT_TRUE(named);
}

// Forward-only (evaluation): a received input goes back to the pool as soon
// as its F is done, so one buffer; the outputs sent still wait for the tail.
// Rank 0 peaks at F3 with one micro-batch (100) and 3 outputs sent; rank 1
// with one buffer.
TEST(MemoryPlanTest, ForwardOnlyRecyclesInputsAndKeepsItsSends) {
  absl::StatusOr<MemoryPlan> plan = PlanMemory(Make("inference", 2, 4), Uniform(2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ranks[0].peak_bytes, 10 + 100 + 3);
  EXPECT_EQ(plan->ranks[1].p2p_buffers, 1);
  EXPECT_EQ(plan->ranks[1].peak_bytes, 10 + 1 + 100);
}

// The receive buffer pool keeps the most received tensors a rank uses at
// once: GPipe's middle ranks keep all 8 inputs and receive a gradient during
// B0 (9); 1F1B's rank 1 keeps 3 inputs (4); a V's first rank only gradients
// for stage 0 and inputs for its last stage.
TEST(MemoryPlanTest, ReceiveBuffersAreTheMostInUseAtOnce) {
  const std::vector<StageMemory> stages(4, StageMemory{0, 0, 0, 1});
  absl::StatusOr<MemoryPlan> gpipe = PlanMemory(Make("gpipe", 4, 8), stages);
  absl::StatusOr<MemoryPlan> one_f_one_b = PlanMemory(Make("1f1b", 4, 8), stages);
  ASSERT_TRUE(gpipe.ok() && one_f_one_b.ok());
  EXPECT_EQ(gpipe->ranks[1].p2p_buffers, 9);
  EXPECT_EQ(gpipe->ranks[3].p2p_buffers, 8);
  EXPECT_EQ(one_f_one_b->ranks[1].p2p_buffers, 4);
  EXPECT_EQ(one_f_one_b->ranks[0].p2p_buffers, 1);
}

// ZB-V (V placement, 2 chunks of half a 1F1B stage each: 50 activation bytes
// and 5 parameter bytes per chunk; no boundary bytes, so activations alone).
// Fixed per rank: 2 chunks x (5 + 5 + 10) = 40. With I freeing everything
// (split I:1,W:0) ZB-V holds at most 2p chunks = p micro-batches of a 1F1B
// stage on rank 0, the same as 1F1B's first stage: 40 + 2p x 50.
TEST(MemoryPlanTest, ZbvMatchesOneFOneBsFirstStageWhenIFreesAll) {
  MemoryPlanOptions options;
  options.split = MemorySplit{1, 0};
  for (int p : {2, 4}) {
    SCOPED_TRACE(p);
    const Schedule zbv = Make("zbv", p, 2 * p, 2);
    std::vector<StageMemory> stages(2 * p, StageMemory{5, 50, 0, 0});
    const std::vector<double> peaks = Peaks(zbv, stages, options);
    ASSERT_EQ(peaks.size(), static_cast<size_t>(p));
    EXPECT_EQ(peaks[0], 40 + 2 * p * 50);
    const std::vector<double> one_f_one_b = Peaks(
        Make("1f1b", p, 2 * p), std::vector<StageMemory>(p, StageMemory{10, 100, 0, 0}), options);
    EXPECT_EQ(peaks[0], one_f_one_b[0]);
  }
}

// The planner's activation liveness is the simulator's memory model in bytes:
// with no parameters or buffers, its peak is the simulated peak (in units)
// times the activation bytes, for every registered training schedule that
// builds at p = 2 and 4.
TEST(MemoryPlanTest, ActivationPeakIsTheSimulatorsTimesTheBytes) {
  int checked = 0;
  for (const std::string& name : RegisteredScheduleNames()) {
    for (int p : {2, 4}) {
      for (int v : {1, 2}) {
        ScheduleOptions options;
        options.num_stages = p;
        options.num_microbatches = 2 * p;
        options.num_chunks = v;
        absl::StatusOr<Schedule> schedule = MakeSchedule(name, options);
        if (!schedule.ok() || schedule->forward_only) continue;
        SCOPED_TRACE(name + " p=" + std::to_string(p) + " v=" + std::to_string(v));
        absl::StatusOr<SimulationResult> sim = Simulate(*schedule, SimulationCosts{});
        ASSERT_TRUE(sim.ok()) << sim.status();
        std::vector<StageMemory> stages(schedule->num_virtual_stages(), StageMemory{0, 74, 0, 0});
        const std::vector<double> peaks = Peaks(*schedule, stages);
        ASSERT_EQ(peaks.size(), sim->peak_memory.size());
        for (size_t r = 0; r < peaks.size(); ++r) {
          EXPECT_NEAR(peaks[r], sim->peak_memory[r] * 74, 1e-6) << "rank " << r;
        }
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 8);
}

// Checkpointing: activation_bytes are the checkpointed inputs (10) and the
// range's 100 bytes are live again during each backward. 1F1B p = 2, m = 4,
// no parameters: rank 0 holds 2 x 10 and recomputes 100 at its B: 120.
TEST(MemoryPlanTest, RecomputeKeepsInputsAndRegeneratesDuringBackward) {
  std::vector<StageMemory> stages(2, StageMemory{0, 10, 100, 0});
  absl::StatusOr<MemoryPlan> plan = PlanMemory(Make("1f1b", 2, 4), stages);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ranks[0].peak_bytes, 120);
  EXPECT_EQ(plan->ranks[0].recompute, 100);
  EXPECT_EQ(plan->ranks[0].activations, 20);
  EXPECT_EQ(plan->ranks[1].peak_bytes, 110);
}

// A stage whose I computes nothing (the first stage: no input gradient)
// regenerates its checkpointed range in W. One rank, F0 I0 F1 W0 I1 W1, the
// checkpointed inputs (10) kept from F to W: the range's 100 bytes are live
// at each I (peak 110, at I0 and I1), or with backward_in_weight at each W
// instead, where W0 runs beside F1's inputs (peak 120).
TEST(MemoryPlanTest, RecomputeInWeightWhenTheInputPassIsEmpty) {
  Schedule schedule = Make("zb_h1", 1, 2);
  schedule.ranks[0] = {F(0, 0), I(0, 0), F(0, 1), W(0, 0), I(0, 1), W(0, 1)};
  StageMemory stage{0, 10, 100, 0, 10};
  MemoryPlanOptions options;
  options.split = MemorySplit{1, 0};
  EXPECT_EQ(Peaks(schedule, {stage}, options), std::vector<double>{110});
  stage.backward_in_weight = true;
  EXPECT_EQ(Peaks(schedule, {stage}, options), std::vector<double>{120});
}

TEST(MemoryPlanTest, OptimizersAndTerms) {
  std::vector<StageMemory> stages(2, StageMemory{1000, 100, 0, 0});
  MemoryPlanOptions sgd;
  sgd.optimizer = OptimizerKind::kSgd;
  MemoryPlanOptions momentum;
  momentum.optimizer = OptimizerKind::kSgdMomentum;
  const Schedule schedule = Make("1f1b", 2, 4);
  EXPECT_EQ(Peaks(schedule, stages, sgd)[0], 2000 + 200);
  EXPECT_EQ(Peaks(schedule, stages, momentum)[0], 3000 + 200);
  absl::StatusOr<MemoryPlan> plan = PlanMemory(schedule, stages);
  ASSERT_TRUE(plan.ok());
  const auto terms = plan->ranks[0].Terms();
  ASSERT_EQ(terms.size(), 4u);
  EXPECT_EQ(terms[0].first, "optimizer state");
  EXPECT_EQ(terms[0].second, 2000);
  EXPECT_EQ(terms[3].first, "activations");
  EXPECT_EQ(FormatMemoryPlan(*plan).substr(0, 40), "rank 0: peak 4.10 KiB = optimizer state ");
  EXPECT_EQ(*ParseOptimizerKind("AdamW"), OptimizerKind::kAdamW);
  EXPECT_FALSE(ParseOptimizerKind("adam").ok());
}

// bf16 with fp32 masters, 1000 fp32 parameter bytes per stage: the module's
// bf16 500, masters 1000, gradients 1500 (fp32 buffer + bf16 grads), AdamW
// 2000; 1F1B's rank 0 holds 2 micro-batches of 100 (bf16, as given).
TEST(MemoryPlanTest, Fp32MasterWeights) {
  std::vector<StageMemory> stages(2, StageMemory{1000, 100, 0, 0});
  MemoryPlanOptions bf16;
  bf16.fp32_master_weights = true;
  absl::StatusOr<MemoryPlan> plan = PlanMemory(Make("1f1b", 2, 4), stages, bf16);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const RankMemoryPlan& r0 = plan->ranks[0];
  EXPECT_EQ(r0.parameters, 500);
  EXPECT_EQ(r0.master_weights, 1000);
  EXPECT_EQ(r0.gradients, 1500);
  EXPECT_EQ(r0.optimizer_state, 2000);
  EXPECT_EQ(r0.peak_bytes, 500 + 1000 + 1500 + 2000 + 200);
  EXPECT_EQ(r0.Terms()[2].first, "master weights");
  // Forward-only: the bf16 module and one micro-batch's activations.
  absl::StatusOr<MemoryPlan> inference = PlanMemory(Make("inference", 2, 4), stages, bf16);
  ASSERT_TRUE(inference.ok()) << inference.status();
  EXPECT_EQ(inference->ranks[0].peak_bytes, 500 + 100);
}

// The distributed optimizer at dp = 4: AdamW's state and the fp32 masters
// are a quarter; the tail holds the gradients flattened in fp32 (1000) and
// the slice (250), which makes the peak only when it exceeds the activations.
TEST(MemoryPlanTest, DistributedOptimizerDividesStateAndAddsTailBuffers) {
  std::vector<StageMemory> stages(2, StageMemory{1000, 100, 0, 0});
  MemoryPlanOptions bf16;
  bf16.fp32_master_weights = true;
  bf16.distributed_optimizer_dp = 4;
  absl::StatusOr<MemoryPlan> plan = PlanMemory(Make("1f1b", 2, 4), stages, bf16);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const RankMemoryPlan& r0 = plan->ranks[0];
  EXPECT_EQ(r0.master_weights, 250);
  EXPECT_EQ(r0.optimizer_state, 500);
  const double fixed = 500 + 250 + 1500 + 500;
  // Tail 1250 > 1F1B's 200 of activations on rank 0.
  EXPECT_EQ(r0.reduce_buffers, 1250);
  EXPECT_EQ(r0.activations, 0);
  EXPECT_EQ(r0.peak_bytes, fixed + 1250);
  // Activations above the tail's bytes keep the peak where they are.
  std::vector<StageMemory> heavy(2, StageMemory{1000, 2000, 0, 0});
  plan = PlanMemory(Make("1f1b", 2, 4), heavy, bf16);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ranks[0].reduce_buffers, 0);
  EXPECT_EQ(plan->ranks[0].peak_bytes, fixed + 4000);
  bf16.distributed_optimizer_dp = 0;
  EXPECT_FALSE(PlanMemory(Make("1f1b", 2, 4), stages, bf16).ok());
}

// A split backward's weight_pending_bytes live from I to W: ZB-H1's last
// rank (p = 2) holds one W back (F0 I0 F1 I1 W0 ...), so after I1 both I0's
// and I1's pending bytes are live. With I freeing all of F's activations
// (I:1,W:0) and no boundary bytes: 2 x 250 + fixed 40.
TEST(MemoryPlanTest, WeightPendingBytesLiveFromIToW) {
  std::vector<StageMemory> stages(2, StageMemory{10, 100, 0, 0, 250});
  MemoryPlanOptions options;
  options.split = MemorySplit{1, 0};
  const std::vector<double> zb = Peaks(Make("zb_h1", 2, 4), stages, options);
  const std::vector<double> plain = Peaks(Make("1f1b", 2, 4), stages, options);
  ASSERT_EQ(zb.size(), 2u);
  EXPECT_EQ(plain[1], 140);  // B never leaves anything pending
  EXPECT_EQ(zb[1], 40 + 2 * 250);
}

// A lowered program (sends, receives, the tail's REDUCE_TIED of stage -1)
// plans like its compute actions.
TEST(MemoryPlanTest, LoweredProgramPlansLikeItsComputeActions) {
  Schedule schedule = Make("1f1b", 2, 4);
  absl::StatusOr<LoweredProgram> program = Lower(schedule);
  ASSERT_TRUE(program.ok()) << program.status();
  Schedule lowered = schedule;
  lowered.ranks = program->ranks;
  Action reduce_tied;
  reduce_tied.type = ActionType::kReduceTiedGrads;
  lowered.ranks[0].push_back(reduce_tied);
  EXPECT_EQ(Peaks(lowered, Uniform(2)), Peaks(schedule, Uniform(2)));
}

TEST(MemoryPlanTest, BadInputNamesIt) {
  absl::StatusOr<MemoryPlan> few = PlanMemory(Make("1f1b", 2, 4), Uniform(1));
  ASSERT_FALSE(few.ok());
  EXPECT_NE(few.status().message().find("1 stage byte costs"), std::string::npos);
  std::vector<StageMemory> negative = Uniform(2);
  negative[1].activation_bytes = -1;
  absl::StatusOr<MemoryPlan> bad = PlanMemory(Make("1f1b", 2, 4), negative);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("stage 1 activation_bytes is -1"), std::string::npos);
}

// Vocabulary parallelism: every rank holds its rows (5 bytes: + 5 gradients
// + 10 AdamW state) and, between a micro-batch's OUT_S and OUT_T, their
// result (1000 bytes, larger than anything else, so the peak is there).
TEST(MemoryPlanTest, VocabularyRowsOnEveryRankAndOutputsHeldFromSToT) {
  const Schedule vocab = Make("1f1b_vocab", 2, 4);
  const std::vector<double> plain = Peaks(vocab, Uniform(2));
  MemoryPlanOptions options;
  options.vocab = {5, 1000};
  absl::StatusOr<MemoryPlan> plan = PlanMemory(vocab, Uniform(2), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int r = 0; r < 2; ++r) {
    const RankMemoryPlan& rank = plan->ranks[r];
    EXPECT_EQ(rank.parameters, 15) << "rank " << r;
    EXPECT_EQ(rank.optimizer_state, 30) << "rank " << r;
    EXPECT_EQ(rank.vocab_pending, 1000) << "rank " << r;  // one micro-batch at a time
    EXPECT_GT(rank.peak_bytes, plain[r] + 20 + 1000 - 300) << "rank " << r;
    EXPECT_LE(rank.peak_bytes, plain[r] + 20 + 1000) << "rank " << r;
    EXPECT_EQ(rank.Terms().front().first, "vocabulary passes");
  }
  // Forward only: OUT_S's result is dropped at once (no OUT_T).
  absl::StatusOr<Schedule> eval = AddVocabularyPasses(Make("inference", 2, 4));
  ASSERT_TRUE(eval.ok());
  plan = PlanMemory(*eval, Uniform(2), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ranks[1].vocab_pending, 1000);
  // Vocabulary bytes for a schedule without the passes are a caller's error.
  absl::StatusOr<MemoryPlan> wrong = PlanMemory(Make("1f1b", 2, 4), Uniform(2), options);
  EXPECT_FALSE(wrong.ok());
  EXPECT_NE(std::string(wrong.status().message()).find("has no vocabulary passes"),
            std::string::npos)
      << wrong.status();
}

// One barrier: OUT_S also keeps the partial hidden-state gradient (300
// bytes) until OUT_REDUCE, and its exps (1000) until an OUT_T that now runs
// after the last stage's backward. A two-barrier schedule ignores the
// partial bytes.
TEST(MemoryPlanTest, OneBarrierHoldsThePartialUntilOutReduce) {
  MemoryPlanOptions options;
  options.vocab = {5, 1000, 300};
  absl::StatusOr<MemoryPlan> two = PlanMemory(Make("1f1b_vocab", 2, 4), Uniform(2), options);
  ASSERT_TRUE(two.ok()) << two.status();
  const Schedule one = Make("1f1b_vocab1", 2, 4);
  absl::StatusOr<LoweredProgram> lowered = Lower(one);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  for (const Schedule& s : {one, ScheduleOf(*lowered)}) {
    absl::StatusOr<MemoryPlan> plan = PlanMemory(s, Uniform(2), options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(two->ranks[r].vocab_pending, 1000) << "rank " << r;
      EXPECT_GE(plan->ranks[r].vocab_pending, 1300) << "rank " << r;
      EXPECT_GE(plan->ranks[r].peak_bytes, two->ranks[r].peak_bytes + 300) << "rank " << r;
    }
  }
}

// With asynchronous collectives Lower() puts the one-barrier OUT_REDUCE
// before its reader, as late as the micro-batch's OUT_T, so the partial may
// outlive the next micro-batches' OUT_S. A compute-only schedule planned
// with async_collectives counts it until OUT_T: never below the plan of the
// program as lowered (whose OUT_REDUCE is where it runs), where counting it
// at OUT_S only falls below on some rank.
TEST(MemoryPlanTest, AsyncOneBarrierHoldsThePartialUntilOutputT) {
  MemoryPlanOptions blocking;
  blocking.vocab = {5, 1000, 300};
  MemoryPlanOptions async = blocking;
  async.vocab.async_collectives = true;
  LoweringOptions lowering;
  lowering.vocab_async_collectives = true;
  int below = 0;
  for (const auto& [name, v] : {std::pair<std::string, int>{"1f1b_vocab1", 1},
                                {"1f1b_vocab1_overlap", 1},
                                {"zbv_vocab1", 2},
                                {"vhalf_vocab1_overlap", 2}}) {
    const int p = 4;
    const Schedule s = Make(name, p, 8, v);
    absl::StatusOr<LoweredProgram> lowered = Lower(s, lowering);
    ASSERT_TRUE(lowered.ok()) << name << ": " << lowered.status();
    absl::StatusOr<MemoryPlan> as_lowered = PlanMemory(ScheduleOf(*lowered), Uniform(p * v), async);
    absl::StatusOr<MemoryPlan> planned = PlanMemory(s, Uniform(p * v), async);
    absl::StatusOr<MemoryPlan> at_out_s = PlanMemory(s, Uniform(p * v), blocking);
    ASSERT_TRUE(as_lowered.ok() && planned.ok() && at_out_s.ok()) << name;
    for (int r = 0; r < p; ++r) {
      EXPECT_GE(planned->ranks[r].peak_bytes, as_lowered->ranks[r].peak_bytes)
          << name << " rank " << r;
      below += at_out_s->ranks[r].peak_bytes < as_lowered->ranks[r].peak_bytes;
    }
  }
  EXPECT_GT(below, 0);
}

}  // namespace
}  // namespace pp
