// What a runtime can execute, and the check that a lowered program needs
// nothing more. Pure, so an experiment can refuse an unsupported schedule
// while validating its config, before any worker process starts; the
// runtime (pipeline/runtime/stage_executor.h) states its own capabilities and
// runs the same check.
#ifndef PIPELINE_SCHEDULE_IR_CAPABILITIES_H_
#define PIPELINE_SCHEDULE_IR_CAPABILITIES_H_

#include "absl/status/status.h"
#include "pipeline/schedule/ir/lowering.h"

namespace pp {

// Features beyond F/B, SEND/RECV and the tail that a program may use.
struct RuntimeCapabilities {
  // I (input-gradient backward) and W (weight-gradient backward): the split
  // backward of zero-bubble schedules.
  bool split_backward = false;
  // OVERLAP_F_B (a forward and a backward of two micro-batches, paired:
  // DualPipeV), executed back to back or overlapped.
  bool overlap_f_b = false;
  // The vocabulary passes and their collectives (OUT_S, OUT_T, IN_F, IN_B,
  // OUT_BCAST, ...; vocab_passes.h): the embedding and the head split over
  // all pipeline ranks.
  bool vocab_parallel = false;
};

// OK if a runtime with `capabilities` can execute every rank's program, else
// Unimplemented naming the schedule, the first unsupported action and its
// rank, and what is missing.
absl::Status CheckRuntimeSupports(const LoweredProgram& program,
                                  const RuntimeCapabilities& capabilities);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_IR_CAPABILITIES_H_
