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
// (the collectives are Lower()'s, lowering.h). Both of the paper's output
// algorithms are available (Schedule::vocab_barriers):
//
//   2 barriers ("Vocab-2"): as drawn above; the last stage's B/I waits for
//     OUT_STATS, every rank's OUT_T and OUT_REDUCE.
//   1 barrier ("Vocab-1", the paper's default): OUT_S also computes the
//     rank's share of the hidden states' gradient relative to its own max,
//     OUT_REDUCE rescales it with the gathered statistics and sums it right
//     after OUT_STATS, and OUT_T only computes the rows' weight gradient, off
//     the critical path.
//
// AddVocabularyPasses places the passes into any schedule by its own
// timeline: with unit costs (lowering's), each pass goes on every rank before
// the first action that starts no earlier than the pass's input exists
// (OUT_S, and OUT_T with two barriers: the last stage's F has ended; OUT_T
// with one barrier: the last stage's B or I of the micro-batch has ended;
// IN_B: stage 0's backward has ended) or, for IN_F, one pass ahead of stage
// 0's F. So a collective waits at most for one action of each rank. The
// passes follow the base schedule, whichever it is, and the simulator costs
// the result, with blocking collectives or asynchronous ones
// (SimulationCosts::vocab.asynchronous: a rank waits only where it reads a
// result). PlaceVocabularyPasses puts them where a placement of its own
// times them.
//
// Registered: "1f1b_vocab", "zbv_vocab" and "vhalf_vocab" (two barriers),
// "1f1b_vocab1", "zbv_vocab1" and "vhalf_vocab1" (one barrier): the 1F1B and
// V-shaped schedules with their passes placed so; "1f1b_vocab_overlap" and
// "1f1b_vocab1_overlap": the paper's 1F1B, one more warm-up forward per
// barrier, so that the last stage runs the next forward while the passes'
// asynchronous collectives are under way; "vhalf_vocab_overlap" and
// "vhalf_vocab1_overlap": the paper's V-Half, each backward a period later
// per barrier, the passes at its authors' points (schedules/vocab_schedules.cc).
#ifndef PIPELINE_SCHEDULE_IR_VOCAB_PASSES_H_
#define PIPELINE_SCHEDULE_IR_VOCAB_PASSES_H_

#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {

// `base` with every rank's vocabulary passes inserted, vocab_parallel set and
// vocab_barriers = `barriers` (1 or 2); its name gets "+vocab" (two
// barriers) or "+vocab1" (one). InvalidArgument if `barriers` is neither,
// `base` already has vocabulary passes, is given as a lowered program (a CSV
// file with communication: write the passes into the file instead) or its
// compute order cannot run.
absl::StatusOr<Schedule> AddVocabularyPasses(const Schedule& base, int barriers = 2);

// A vocabulary pass and the time it goes at: on every rank, before the first
// action that starts at or after `time`.
struct TimedVocabPass {
  double time;
  Action action;  // Vocab(kVocabInputF | kVocabOutputS | kVocabOutputT | kVocabInputB, mb)
};

// `base` with `passes` inserted by their times (equal times keep the order
// given), vocab_parallel set and vocab_barriers = `barriers`, named as
// AddVocabularyPasses names it. `starts[r][i]` is when base.ranks[r][i]
// starts on the timeline the passes are timed on. InvalidArgument as
// AddVocabularyPasses, if `starts` is not shaped as base.ranks or
// nondecreasing along a rank, and if `passes` is not each micro-batch's IN_F
// and OUT_S (and unless forward_only, OUT_T and IN_B) once. Where the times
// put a pass before its input, the validator refuses the result.
absl::StatusOr<Schedule> PlaceVocabularyPasses(const Schedule& base, int barriers,
                                               std::vector<TimedVocabPass> passes,
                                               const std::vector<std::vector<double>>& starts);

// The form pipe places for a run that asks for `barriers` (TrainerOptions::
// vocabulary_barriers, parallelism.vocab_barriers): 0, not asked, is two
// barriers; 1 or 2 as asked.
constexpr int PlacedVocabBarriers(int barriers) { return barriers == 0 ? 2 : barriers; }

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_IR_VOCAB_PASSES_H_
