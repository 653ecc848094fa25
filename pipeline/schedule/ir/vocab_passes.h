// Vocabulary parallelism in a schedule (arXiv 2411.05288, "Balancing Pipeline
// Parallelism with Vocabulary Parallelism"): the input embedding and the
// output layer are split by vocabulary rows over all p ranks, so the last
// stage no longer carries the whole head. Each rank runs, per micro-batch:
//
//   IN_F   its rows of the embedding lookup       -> IN_REDUCE onto stage 0
//   OUT_S  its logits and softmax statistics      <- OUT_BCAST of the last F
//   OUT_T  softmax, loss, its rows' gradient       <- OUT_STATS (all-gather)
//                                                  -> OUT_REDUCE onto the last B/I
//   IN_B   its rows' embedding gradient            <- IN_BCAST of stage 0's B/I
//
// (the collectives are Lower()'s, lowering.h). AddVocabularyPasses places the
// passes into any schedule by its own timeline: with unit costs (lowering's),
// each pass goes on every rank before the first action that starts no earlier
// than the pass's input exists (OUT_S, OUT_T: the last stage's F has ended;
// IN_B: stage 0's backward has ended) or, for IN_F, one pass ahead of stage
// 0's F. So a collective waits at most for one action of each rank, and the
// last stage's backward starts one OUT_S + OUT_T after its forward. This is
// not the paper's hand-made Vocab-1/Vocab-2 placement: the passes follow the
// base schedule, whichever it is, and the simulator costs the result.
//
// Registered: "1f1b_vocab" and "zbv_vocab" (the 1F1B and V-shaped schedules
// with their passes placed so).
#ifndef PIPELINE_SCHEDULE_IR_VOCAB_PASSES_H_
#define PIPELINE_SCHEDULE_IR_VOCAB_PASSES_H_

#include "absl/status/statusor.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {

// `base` with every rank's vocabulary passes inserted and vocab_parallel set;
// its name gets "+vocab". InvalidArgument if `base` already has vocabulary
// passes, is given as a lowered program (a CSV file with communication:
// write the passes into the file instead) or its compute order cannot run.
absl::StatusOr<Schedule> AddVocabularyPasses(const Schedule& base);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_IR_VOCAB_PASSES_H_
