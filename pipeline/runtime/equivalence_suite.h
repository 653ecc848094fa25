// The equivalence suite every registered training schedule runs (testonly):
// pipeline training equals ToSequential() trained on the same global batches.
// Link the `equivalence_suite` target next to the schedules to check into a
// cc_test with gtest_main; the suite is instantiated over the schedule
// registry, so a new schedule is covered by being linked in:
//
//   pp_cc_test(name = "my_schedule_equivalence_test", shard_count = 4,
//              deps = [":my_schedule", "//pipeline/runtime:equivalence_suite",
//                      "//third_party:gtest_main"])
//
// Matrix, for every registered training schedule: pp in {1, 2, 4} x dp in
// {1, 2} x {SGD with momentum, AdamW} x micro-batch counts {1, p - 1, p,
// 2p + 1} (those >= 1, each once; a count the schedule's own function
// rejects is skipped) x activation checkpointing off / every block
// (pipeline/autograd). Chunks: 2 where the schedule accepts them, else 1. The model is the toy
// model of equivalence_testing.h (tied embedding and output projection, so the tied gradient
// all-reduce is exercised whenever pp > 1). Three steps; per-step losses, grad norms and final
// parameters must match within 1e-5 relative. Each (schedule, pp, dp) also has two "_cuda" cases
// (AdamW, the largest micro-batch count, checkpointing off / on) whose ranks run on cuda:r with
// NCCL, within 1e-4 of the CPU reference; they GTEST_SKIP() naming the
// missing GPUs where fewer than pp * dp are visible.
// A schedule the runtime cannot execute (CheckRuntimeSupports; the executor
// supports every action type today, I/W included) must
// be refused with Unimplemented instead.
#ifndef PIPELINE_RUNTIME_EQUIVALENCE_SUITE_H_
#define PIPELINE_RUNTIME_EQUIVALENCE_SUITE_H_

#include <string>
#include <vector>

#include "pipeline/runtime/equivalence_testing.h"

namespace pp {
namespace testing_runtime {

struct EquivalenceCase {
  RunConfig config;
  std::string name;  // a valid gtest name, e.g. "1f1b_pp2_dp1_v1_m3_sgd_ckpt"
  bool runtime_supports = true;
};

// The suite's cases for every schedule registered in this binary.
std::vector<EquivalenceCase> RegisteredEquivalenceCases();

}  // namespace testing_runtime
}  // namespace pp

#endif  // PIPELINE_RUNTIME_EQUIVALENCE_SUITE_H_
