#include "pipeline/runtime/idle_core_threads.h"

#include <vector>

#include <gtest/gtest.h>

#include "pipeline/schedule/ir/action.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

LoweredProgram Program(const std::string& name, int p, int m, int v = 1) {
  absl::StatusOr<Schedule> s = MakeSchedule(name, {p, m, v, 0});
  EXPECT_TRUE(s.ok()) << s.status();
  absl::StatusOr<LoweredProgram> program = Lower(*s);
  EXPECT_TRUE(program.ok()) << program.status();
  return *program;
}

IdleCoreOptions Machine(int cores, int ranks, std::vector<int> peers, int base = 1) {
  return IdleCoreOptions{.machine_cores = cores,
                         .machine_ranks = ranks,
                         .base_threads = base,
                         .pipe_peers_on_machine = std::move(peers)};
}

TEST(IdleCoreThreadsTest, OneFOneBLendsTheFirstStagesEnds) {
  const LoweredProgram program = Program("1f1b", 2, 4);
  absl::StatusOr<absl::flat_hash_map<Action, int>> first =
      PlanIdleCoreThreads(program, 0, Machine(2, 2, {1}));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, (absl::flat_hash_map<Action, int>{{F(0, 0), 2}, {B(0, 3), 2}}));
  absl::StatusOr<absl::flat_hash_map<Action, int>> last =
      PlanIdleCoreThreads(program, 1, Machine(2, 2, {0}));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->empty());
  // A second replica on the machine is busy whatever the schedule says:
  // 4 cores, 4 ranks, one pipeline peer idle -> 4 / 3 = 1, nothing lent.
  absl::StatusOr<absl::flat_hash_map<Action, int>> replicas =
      PlanIdleCoreThreads(program, 0, Machine(4, 4, {1}));
  ASSERT_TRUE(replicas.ok());
  EXPECT_TRUE(replicas->empty());
  // The peer on another machine: nothing to lend.
  absl::StatusOr<absl::flat_hash_map<Action, int>> alone =
      PlanIdleCoreThreads(program, 0, Machine(2, 1, {}));
  ASSERT_TRUE(alone.ok());
  EXPECT_TRUE(alone->empty());
}

TEST(IdleCoreThreadsTest, FourRanksOnTwoCoresAndGpipe) {
  // GPipe at p = 4: rank 0's first F and last B have every other rank idle.
  const LoweredProgram program = Program("gpipe", 4, 4);
  absl::StatusOr<absl::flat_hash_map<Action, int>> plan =
      PlanIdleCoreThreads(program, 0, Machine(2, 4, {1, 2, 3}));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->at(F(0, 0)), 2);
  EXPECT_EQ(plan->at(B(0, 3)), 2);
  EXPECT_FALSE(plan->contains(F(0, 1)));
  // 0F1 may meet every later stage's forward of micro-batch 0, so nothing.
  // 8 cores: 2F3 comes after ranks 0 and 1 sent their last forward and
  // before their first backward, but may meet 3F2: 2 ranks busy, 4 threads.
  absl::StatusOr<absl::flat_hash_map<Action, int>> eight =
      PlanIdleCoreThreads(program, 2, Machine(8, 4, {0, 1, 3}, 2));
  ASSERT_TRUE(eight.ok());
  EXPECT_EQ(eight->at(F(2, 3)), 4);
  EXPECT_FALSE(eight->contains(F(2, 2)));
  absl::StatusOr<absl::flat_hash_map<Action, int>> two =
      PlanIdleCoreThreads(program, 2, Machine(2, 4, {0, 1, 3}));
  ASSERT_TRUE(two.ok());
  EXPECT_FALSE(two->contains(F(2, 3)));
  // Evaluation programs are not planned.
  absl::StatusOr<absl::flat_hash_map<Action, int>> eval =
      PlanIdleCoreThreads(Program("inference", 4, 4), 0, Machine(2, 4, {1, 2, 3}));
  ASSERT_TRUE(eval.ok());
  EXPECT_TRUE(eval->empty());
}

TEST(IdleCoreThreadsTest, BadMachinesAreInvalidArgument) {
  const LoweredProgram program = Program("1f1b", 2, 4);
  for (const IdleCoreOptions& bad :
       {Machine(0, 2, {1}), Machine(2, 0, {}), Machine(2, 2, {1}, 0), Machine(2, 1, {1})}) {
    absl::StatusOr<absl::flat_hash_map<Action, int>> plan = PlanIdleCoreThreads(program, 0, bad);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(plan.status().message().empty());
  }
  EXPECT_EQ(PlanIdleCoreThreads(program, 0, Machine(2, 2, {0})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(IdleCoreThreadsTest, LenderSetsThreadsOnChangeOnlyAndRestoresAtStepEnd) {
  std::vector<int> calls;
  IdleCoreLender lender(Machine(2, 2, {1}), [&](int n) {
    calls.push_back(n);
    return true;
  });
  const LoweredProgram program = Program("1f1b", 2, 2);
  ASSERT_TRUE(lender.Plan(program, 0).ok());
  const ObservedStep step{.rank = 0, .step = 0, .program = &program};
  for (const Action& a : program.ranks[0]) lender.ActionStart(step, a);
  EXPECT_TRUE(lender.StepEnd(step, absl::OkStatus()).ok());
  // 0F0 with 2, back to 1 for what follows, 0B1 with 2, 1 at the end.
  EXPECT_EQ(calls, (std::vector<int>{2, 1, 2, 1}));
  EXPECT_EQ(lender.lent_actions(), 2);
  calls.clear();
  const ObservedStep eval{.rank = 0, .step = 0, .forward_only = true, .program = &program};
  for (const Action& a : program.ranks[0]) lender.ActionStart(eval, a);
  EXPECT_TRUE(lender.StepEnd(eval, absl::OkStatus()).ok());
  EXPECT_TRUE(calls.empty());
  // A failed plan keeps the old one.
  Schedule stuck = EmptyLoopedSchedule("stuck", {.num_stages = 2, .num_microbatches = 1});
  stuck.ranks = {{B(0, 0), F(0, 0)}, {F(1, 0), B(1, 0)}};
  LoweredProgram bad = EmptyProgramOf(stuck);
  bad.ranks = stuck.ranks;
  EXPECT_FALSE(lender.Plan(bad, 0).ok());
  EXPECT_EQ(lender.plan().size(), 2u);
}

}  // namespace
}  // namespace pp
