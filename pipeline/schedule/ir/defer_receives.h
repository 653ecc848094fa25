// DeferReceives: a pure transform of a lowered program (lowering.h) that the
// runtime executes and the simulator and explorer can time, so what they
// report is what runs.
#ifndef PIPELINE_SCHEDULE_IR_DEFER_RECEIVES_H_
#define PIPELINE_SCHEDULE_IR_DEFER_RECEIVES_H_

#include "pipeline/schedule/ir/lowering.h"

namespace pp {

// The program with every RECV moved to just before the first action that
// needs its data (the F, or the B or I, of the same stage and micro-batch; all pending
// ones before the tail), keeping the receives' relative order. A rank then
// computes what it can before it blocks. Receives stay in program order, so
// each channel's messages still match in the order they were sent, and since
// sends are asynchronous a later receive cannot close a cycle of waits.
LoweredProgram DeferReceives(const LoweredProgram& program);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_IR_DEFER_RECEIVES_H_
