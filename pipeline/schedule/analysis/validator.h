// Static checks of schedules and lowered programs, run before anything
// touches a process group. Errors are InvalidArgument whose message names the
// rule, then prints the step x rank grid with the offending cell in brackets.
#ifndef PIPELINE_SCHEDULE_ANALYSIS_VALIDATOR_H_
#define PIPELINE_SCHEDULE_ANALYSIS_VALIDATOR_H_

#include "absl/status/status.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {

// Checks a schedule:
//  - shape: one list per rank, placement of every virtual stage on a rank;
//  - every action is a compute action (F, B, I, W) of a stage placed on that
//    rank, with stage and micro-batch in range;
//  - each (stage, mb) has exactly one F and, unless forward_only, exactly one
//    B, or exactly one I and one W (never both B and I/W); forward_only
//    schedules have no backward at all;
//  - on one rank: F before its own B/I, I before its W, F on stage s before F
//    on s + 1, B/I on s + 1 before B/I on s;
//  - with vocabulary parallelism, every rank runs IN_F and OUT_S and, unless
//    forward_only, OUT_T and IN_B once per micro-batch (none without it);
//  - across ranks the per-rank orders can all make progress (data
//    dependencies), and the lowered program (Lower with default options)
//    passes ValidateLoweredProgram.
absl::Status ValidateSchedule(const Schedule& schedule);

// Executes the program with blocking (rendezvous) send/recv, unit-free: every
// SEND must meet its RECV, every compute must find its input (received, or
// handed over locally by the previous stage on the same rank), every send must
// send something already computed, and no rank may wait forever (deadlock):
// a collective (the tail's, the vocabulary's) waits until each of its ranks
// is at the same collective, so ranks that order two collectives differently
// are a deadlock. With vocabulary parallelism every rank runs each of the
// vocabulary's passes and collectives once per micro-batch.
absl::Status ValidateLoweredProgram(const LoweredProgram& program);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_ANALYSIS_VALIDATOR_H_
