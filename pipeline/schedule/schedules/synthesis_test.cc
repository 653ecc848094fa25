#include "pipeline/schedule/schedules/synthesis.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/analysis/validator.h"
#include "pipeline/schedule/ir/defer_receives.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

using ::testing::HasSubstr;

// Cost shapes of the grid: uniform, W half of I, a last stage 1.5x
// heavier, a first stage 1.3x heavier (per virtual stage, B = I + W).
SimulationCosts Costs(int num_virtual, const std::string& shape, double comm) {
  SimulationCosts costs;
  costs.forward = 1;
  costs.backward_input = 1;
  costs.backward_weight = shape == "w_half" ? 0.5 : 1;
  costs.backward = costs.backward_input + costs.backward_weight;
  costs.comm = comm;
  costs.stage_multiplier.assign(num_virtual, 1.0);
  if (shape == "last_heavy") costs.stage_multiplier.back() = 1.5;
  if (shape == "first_heavy") costs.stage_multiplier.front() = 1.3;
  return costs;
}

SynthesisOptions Options(int p, int m, int v, SynthesisPlacement placement,
                         const std::string& shape, double comm, double cap) {
  SynthesisOptions o;
  o.num_stages = p;
  o.num_microbatches = m;
  o.num_chunks = v;
  o.placement = placement;
  o.costs = Costs(p * v, shape, comm);
  o.memory_cap = cap;
  o.max_evaluations = 300;
  return o;
}

double MaxOf(const std::vector<double>& xs) {
  double out = 0;
  for (double x : xs) out = std::max(out, x);
  return out;
}

// The result is valid, its makespan is the simulator's, it fits the cap and
// it is not below the lower bound.
void ExpectSound(const SynthesisOptions& o, const SynthesisResult& r) {
  ASSERT_TRUE(ValidateSchedule(r.schedule).ok()) << ValidateSchedule(r.schedule);
  absl::StatusOr<SimulationResult> sim = SimulateAsExecuted(r.schedule, o.costs, o.defer_receives);
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_DOUBLE_EQ(sim->makespan, r.makespan);
  EXPECT_LE(MaxOf(sim->peak_memory), r.memory_cap + 1e-9);
  EXPECT_DOUBLE_EQ(MaxOf(sim->peak_memory), r.peak_memory);
  EXPECT_GE(r.makespan, r.lower_bound - 1e-9);
  EXPECT_EQ(r.schedule.num_stages, o.num_stages);
  EXPECT_EQ(r.schedule.num_microbatches, o.num_microbatches);
  EXPECT_EQ(r.schedule.num_chunks, o.num_chunks);
}

TEST(SynthesisTest, ValidFitsTheCapAndReportsTheSimulatorsMakespan) {
  struct Case {
    int p, m, v;
    SynthesisPlacement placement;
    const char* shape;
    double comm, cap;
  };
  for (const Case& c : std::vector<Case>{
           {1, 3, 1, SynthesisPlacement::kLooped, "uniform", 0, 3},
           {2, 4, 1, SynthesisPlacement::kLooped, "uniform", 0, 2},
           {4, 8, 1, SynthesisPlacement::kLooped, "last_heavy", 0.1, 4},
           {4, 8, 1, SynthesisPlacement::kLooped, "w_half", 0, 1},
           {3, 5, 2, SynthesisPlacement::kLooped, "first_heavy", 0.1, 4},
           {4, 8, 2, SynthesisPlacement::kV, "uniform", 0, 8},
           {4, 8, 2, SynthesisPlacement::kV, "uniform", 0.1, 2},
           {4, 4, 3, SynthesisPlacement::kLooped, "uniform", 0, 3},
       }) {
    SynthesisOptions o = Options(c.p, c.m, c.v, c.placement, c.shape, c.comm, c.cap);
    SCOPED_TRACE(absl::StrCat("p=", c.p, " m=", c.m, " v=", c.v, " ", c.shape, " cap ", c.cap));
    absl::StatusOr<SynthesisResult> r = Synthesize(o);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectSound(o, *r);
    EXPECT_GT(r->evaluations, 0);
  }
}

// Synthesised for the step's actual micro-batches (variable lengths: the
// compute multipliers of SimulationCosts::microbatch_multiplier), the
// schedule is sound under them, no slower than 1F1B simulated with the same
// multipliers, and the bounds stay bounds.
TEST(SynthesisTest, VariableMicroBatchesAreSynthesisedFor) {
  SynthesisOptions o = Options(4, 8, 1, SynthesisPlacement::kLooped, "uniform", 0.05, 4);
  o.costs.microbatch_multiplier = {2.5, 0.4, 1.0, 0.6, 1.8, 0.3, 0.9, 0.5};
  absl::StatusOr<SynthesisResult> r = Synthesize(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectSound(o, *r);
  ScheduleOptions so;
  so.num_stages = 4;
  so.num_microbatches = 8;
  absl::StatusOr<SimulationResult> one_f_one_b =
      SimulateAsExecuted(*MakeSchedule("1f1b", so), o.costs, o.defer_receives);
  ASSERT_TRUE(one_f_one_b.ok()) << one_f_one_b.status();
  EXPECT_LE(r->makespan, one_f_one_b->makespan + 1e-9);
  o.costs.microbatch_multiplier = {1.0, 2.0};
  absl::StatusOr<SynthesisResult> bad = Synthesize(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("microbatch_multiplier has 2 entries"), std::string::npos)
      << bad.status();
}

// With defer_receives the search times what the CPU runtime runs
// (DeferReceives): a first stage whose I is free and W the whole backward
// (issue #27's measured embedding stage) leaves Lower()'s unit-cost receive
// placement far off, and the result is no slower than any registered start
// as executed, which the lowered model misjudged by 10%.
TEST(SynthesisTest, DeferReceivesSearchesTheProgramAsExecuted) {
  SynthesisOptions o = Options(2, 8, 2, SynthesisPlacement::kV, "uniform", 0, 4);
  o.costs.stage_costs[0] =
      StageCosts{.forward = 1, .backward = 2, .backward_input = 0.001, .backward_weight = 2};
  o.defer_receives = true;
  absl::StatusOr<SynthesisResult> r = Synthesize(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectSound(o, *r);
  absl::StatusOr<LoweredProgram> program = Lower(r->schedule);
  ASSERT_TRUE(program.ok()) << program.status();
  absl::StatusOr<SimulationResult> executed = SimulateProgram(DeferReceives(*program), o.costs);
  ASSERT_TRUE(executed.ok()) << executed.status();
  EXPECT_DOUBLE_EQ(r->makespan, executed->makespan);
  absl::StatusOr<Schedule> zbv = MakeSchedule("zbv", {2, 8, 2, 0});
  ASSERT_TRUE(zbv.ok()) << zbv.status();
  absl::StatusOr<SimulationResult> zbv_lowered = SimulateAsExecuted(*zbv, o.costs, false);
  absl::StatusOr<SimulationResult> zbv_executed = SimulateAsExecuted(*zbv, o.costs, true);
  ASSERT_TRUE(zbv_lowered.ok() && zbv_executed.ok());
  EXPECT_GT(zbv_lowered->makespan, 1.05 * zbv_executed->makespan);
  EXPECT_LE(r->makespan, zbv_executed->makespan + 1e-9);
}

TEST(SynthesisTest, BackwardNotSplitUsesBOnly) {
  SynthesisOptions o = Options(4, 8, 1, SynthesisPlacement::kLooped, "uniform", 0, 4);
  o.split_backward = false;
  absl::StatusOr<SynthesisResult> r = Synthesize(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectSound(o, *r);
  for (const auto& actions : r->schedule.ranks) {
    for (const Action& a : actions) {
      for (const Action& leaf : Leaves(a)) {
        EXPECT_TRUE(leaf.type == ActionType::kForward || leaf.type == ActionType::kBackward) << a;
      }
    }
  }
  // 1F1B's (p - 1 + m) (F + B); the bound (rank 3: 3 F, then 8 (F + B))
  // does not see that a full B cannot fill the warm-up.
  EXPECT_DOUBLE_EQ(r->makespan, 33);
  EXPECT_DOUBLE_EQ(r->lower_bound, 27);
}

// The best registered schedule with this placement and v whose simulated peak
// fits the cap, or infinity.
double BestRegistered(const SynthesisOptions& o, std::string* which) {
  double best = std::numeric_limits<double>::infinity();
  const std::vector<int> placement = o.placement == SynthesisPlacement::kV
                                         ? VPlacement(o.num_stages)
                                         : LoopedPlacement(o.num_stages, o.num_chunks);
  for (const std::string& name : RegisteredScheduleNames()) {
    if (name.rfind("synth", 0) == 0) continue;
    absl::StatusOr<Schedule> s =
        MakeSchedule(name, {o.num_stages, o.num_microbatches, o.num_chunks, 0});
    if (!s.ok() || s->forward_only || s->stage_to_rank != placement) continue;
    absl::StatusOr<SimulationResult> sim = Simulate(*s, o.costs);
    if (!sim.ok() || MaxOf(sim->peak_memory) > *o.memory_cap + 1e-9) continue;
    if (sim->makespan < best) {
      best = sim->makespan;
      *which = name;
    }
  }
  return best;
}

// A subset of bench_synthesis's grid (which runs the full synthesis on all of
// it): never worse than the best registered schedule under the same cap, here
// with the quick start set and a short search to keep the test fast.
TEST(SynthesisTest, NeverWorseThanAnyRegisteredScheduleUnderTheSameCap) {
  int compared = 0;
  for (int p : {2, 4}) {
    for (int m : {p, 2 * p}) {
      for (const char* shape : {"uniform", "w_half", "last_heavy", "first_heavy"}) {
        for (double comm : {0.0, 0.1}) {
          for (double factor : {1.0, 2.0}) {
            for (auto [v, placement] : std::vector<std::pair<int, SynthesisPlacement>>{
                     {1, SynthesisPlacement::kLooped}, {2, SynthesisPlacement::kV}}) {
              // Caps in one rank's share of the model: 1F1B's peak is p (m >= p).
              SynthesisOptions o =
                  Options(p, m, v, placement, shape, comm, factor * std::min(p, m) * v);
              o.max_evaluations = 20;
              o.all_variants = false;
              SCOPED_TRACE(absl::StrCat("p=", p, " m=", m, " v=", v, " ", shape, " comm ", comm,
                                        " cap ", *o.memory_cap));
              absl::StatusOr<SynthesisResult> r = Synthesize(o);
              ASSERT_TRUE(r.ok()) << r.status();
              ExpectSound(o, *r);
              std::string which;
              const double best = BestRegistered(o, &which);
              if (best == std::numeric_limits<double>::infinity()) continue;
              ++compared;
              EXPECT_LE(r->makespan, best + 1e-9) << "beaten by " << which;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 100);
}

// Without the registered schedules as starts, list scheduling and the search
// alone beat 1F1B at its memory and reach the lower bound with twice the memory at p = 4, m = 4
// (the zero-bubble authors' ZB-2p makespan 15, issue #27).
TEST(SynthesisTest, HeuristicAloneFindsTheZeroBubbleSchedules) {
  SynthesisOptions o = Options(4, 8, 1, SynthesisPlacement::kLooped, "uniform", 0, 4);
  o.seed_with_registered = false;
  absl::StatusOr<SynthesisResult> r = Synthesize(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectSound(o, *r);
  // 1f1b: 33; zb_h1: 27, which the list starts miss by one unit here (28):
  // the registered starts close that gap in the full synthesis.
  EXPECT_LE(r->makespan, 28);

  o = Options(4, 4, 1, SynthesisPlacement::kLooped, "uniform", 0, 8);
  o.seed_with_registered = false;
  r = Synthesize(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectSound(o, *r);
  EXPECT_DOUBLE_EQ(r->lower_bound, 15);
  EXPECT_DOUBLE_EQ(r->makespan, 15);
}

TEST(SynthesisTest, DeterministicForASeed) {
  SynthesisOptions o = Options(4, 8, 2, SynthesisPlacement::kLooped, "last_heavy", 0.1, 6);
  o.seed = 7;
  absl::StatusOr<SynthesisResult> a = Synthesize(o);
  absl::StatusOr<SynthesisResult> b = Synthesize(o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->schedule.ranks, b->schedule.ranks);
  EXPECT_EQ(a->makespan, b->makespan);
  EXPECT_EQ(a->evaluations, b->evaluations);
}

TEST(SynthesisTest, LowerBoundIsTheBusiestRankOrTheCriticalPath) {
  SynthesisOptions o = Options(4, 8, 1, SynthesisPlacement::kLooped, "uniform", 0, 4);
  absl::StatusOr<SynthesisResult> b = SynthesisLowerBound(o);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_DOUBLE_EQ(b->rank_work_bound, 3 + 8 * 3);          // rank 3 starts after 3 F
  EXPECT_DOUBLE_EQ(b->critical_path_bound, 8 + 3 + 4 + 1);  // 8 F0, F1..F3, I3..I0, W0
  EXPECT_DOUBLE_EQ(b->lower_bound, 27);
  o.costs.comm = 0.5;
  b = SynthesisLowerBound(o);
  ASSERT_TRUE(b.ok());
  EXPECT_DOUBLE_EQ(b->rank_work_bound, 3 + 1.5 + 24);
  EXPECT_DOUBLE_EQ(b->critical_path_bound, 16 + 6 * 0.5);
}

TEST(SynthesisTest, BadInputsNameTheValue) {
  struct Case {
    SynthesisOptions options;
    const char* expected;
  };
  std::vector<Case> cases;
  SynthesisOptions o = Options(4, 8, 1, SynthesisPlacement::kLooped, "uniform", 0, 4);
  {
    SynthesisOptions bad = o;
    bad.memory_cap = 0.5;
    cases.push_back({bad, "memory_cap (0.5) is below the minimum any schedule needs: 1"});
  }
  {
    SynthesisOptions bad = Options(4, 8, 3, SynthesisPlacement::kLooped, "uniform", 0, 2.5);
    cases.push_back({bad, "memory_cap (2.5) is below the minimum any schedule needs: 3"});
  }
  {
    SynthesisOptions bad = Options(4, 8, 2, SynthesisPlacement::kV, "uniform", 0, 1);
    cases.push_back({bad, "memory_cap (1) is below the minimum any schedule needs: 2"});
  }
  {
    SynthesisOptions bad = o;
    bad.num_stages = 0;
    cases.push_back({bad, "num_stages (0)"});
  }
  {
    SynthesisOptions bad = o;
    bad.num_microbatches = -2;
    cases.push_back({bad, "num_microbatches (-2)"});
  }
  {
    SynthesisOptions bad = o;
    bad.num_chunks = 0;
    cases.push_back({bad, "num_chunks (0)"});
  }
  {
    SynthesisOptions bad = Options(4, 8, 3, SynthesisPlacement::kV, "uniform", 0, 8);
    cases.push_back({bad, "num_chunks (3) must be 2"});
  }
  {
    SynthesisOptions bad = o;
    bad.max_evaluations = -1;
    cases.push_back({bad, "max_evaluations (-1)"});
  }
  {
    SynthesisOptions bad = o;
    bad.costs.comm = -1;
    cases.push_back({bad, "comm (-1)"});
  }
  {
    SynthesisOptions bad = o;
    bad.costs.stage_multiplier = {1, 1};
    cases.push_back({bad, "stage_multiplier has 2 entries"});
  }
  {
    SynthesisOptions bad = o;
    bad.extra_starts.push_back(*MakeSchedule("1f1b", {4, 4, 1, 0}));
    cases.push_back({bad, "extra start '1f1b' has p=4 m=4"});
  }
  for (const Case& c : cases) {
    absl::StatusOr<SynthesisResult> r = Synthesize(c.options);
    ASSERT_FALSE(r.ok()) << c.expected;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.expected));
  }
}

// The smallest cap is feasible: one micro-batch at a time.
TEST(SynthesisTest, TheMinimumCapIsFeasible) {
  for (auto [v, placement] :
       std::vector<std::pair<int, SynthesisPlacement>>{{1, SynthesisPlacement::kLooped},
                                                       {3, SynthesisPlacement::kLooped},
                                                       {2, SynthesisPlacement::kV}}) {
    SynthesisOptions o = Options(3, 4, v, placement, "uniform", 0.1, 0);
    o.memory_cap = MinimumMemoryCap(o);
    SCOPED_TRACE(absl::StrCat("v=", v, " cap ", *o.memory_cap));
    absl::StatusOr<SynthesisResult> r = Synthesize(o);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectSound(o, *r);
  }
}

TEST(SynthesisTest, RegisteredAsSynth) {
  absl::StatusOr<Schedule> s = MakeSchedule("synth", {4, 8, 1, 0});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(ValidateSchedule(*s).ok());
  SimulationCosts costs;  // F = 1, B = 2, I = W = 1
  absl::StatusOr<SimulationResult> sim = Simulate(*s, costs);
  ASSERT_TRUE(sim.ok());
  EXPECT_LE(MaxOf(sim->peak_memory), 4 + 1e-9);  // 1F1B's peak
  EXPECT_LT(sim->makespan, 33);                  // 1F1B's
}

}  // namespace
}  // namespace pp
