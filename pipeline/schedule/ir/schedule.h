// A schedule as data: for each rank (physical pipeline stage) its ordered list
// of compute actions, plus the placement of virtual stages on ranks.
//
// Schedules are made by name through the registry (registry.h); Lower()
// (lowering.h) turns one into a per-rank program with communication; the
// validator (validator.h) and simulator (simulator.h) check and time it;
// render.h draws it. FormatGrid prints any per-rank action lists as a
// step x rank grid, with an optional marked cell for error messages.
#ifndef PIPELINE_SCHEDULE_IR_SCHEDULE_H_
#define PIPELINE_SCHEDULE_IR_SCHEDULE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "pipeline/schedule/ir/action.h"

namespace pp {

// What a schedule is asked for. Plain value type.
struct ScheduleOptions {
  int num_stages = 1;        // p: pipeline ranks.
  int num_microbatches = 1;  // m
  int num_chunks = 1;        // v: virtual stages (model chunks) per rank.
  // Micro-batches per group for interleaved schedules; 0 = the schedule's
  // default (num_stages for interleaved_1f1b). Ignored by other schedules.
  int group_size = 0;
};

// Per-rank lists of actions: ranks[r] is rank r's program, in order.
using RankActions = std::vector<std::vector<Action>>;

// A schedule's output. Plain value type.
struct Schedule {
  std::string name;
  int num_stages = 0;        // p (ranks)
  int num_microbatches = 0;  // m
  int num_chunks = 1;        // v
  // True for evaluation schedules: only F actions, no backward, no tail.
  bool forward_only = false;
  // Vocabulary parallelism (vocab_passes.h): the embedding and the output
  // layer are split over all ranks, and every rank's list holds, once per
  // micro-batch, IN_F and OUT_S and, unless forward_only, IN_B and OUT_T.
  // Stage 0's F then takes its input from IN_REDUCE, the last stage's B or I
  // its output gradient from OUT_REDUCE (lowering.h).
  bool vocab_parallel = false;
  // The output layer's algorithm under vocab_parallel (the paper's naming):
  // 2 ("Vocab-2"): OUT_T computes the hidden states' gradient, so the last
  // stage's B or I waits for OUT_STATS, every rank's OUT_T and OUT_REDUCE.
  // 1 ("Vocab-1"): OUT_S computes it relative to the rank's own max and
  // OUT_REDUCE rescales and sums it once OUT_STATS is done (lowered right
  // after it, or with asynchronous collectives before its reader:
  // LoweringOptions::vocab_async_collectives); the last stage's
  // B or I waits for every rank's OUT_S and the two collectives, and OUT_T
  // (the rows' weight gradient only) may run after it. Ignored without
  // vocab_parallel.
  int vocab_barriers = 2;
  // stage_to_rank[s] for every virtual stage s in [0, p * v).
  std::vector<int> stage_to_rank;
  // ranks[r]: rank r's compute actions (F, B, I, W) in execution order.
  RankActions ranks;
  // Optional, normally empty: the lowered program as given, with its
  // communication and tail (a CSV file in the compute + comms form, csv.h).
  // When set, Lower() returns it instead of deriving one from `ranks` (which
  // must be its compute actions); the validator checks it like any program.
  RankActions given_program;

  int num_virtual_stages() const { return num_stages * num_chunks; }
};

// Looped placement: virtual stage c * p + r lives on rank r.
std::vector<int> LoopedPlacement(int num_stages, int num_chunks);

// V placement (ZB-V, DualPipeV): 2 chunks, rank r holds virtual stages r and
// 2p - 1 - r, so the two stages at the bottom of the V share rank p - 1.
std::vector<int> VPlacement(int num_stages);

// Checks the option ranges every schedule shares (p >= 1, m >= 1, v >= 1,
// group_size >= 0) and returns InvalidArgument naming the bad value.
absl::Status CheckCommonOptions(const ScheduleOptions& options);

// A Schedule with name, sizes and looped placement filled in and empty rank
// lists, for schedule functions to append to.
Schedule EmptyLoopedSchedule(absl::string_view name, const ScheduleOptions& options);

// Cell to highlight in FormatGrid: rank and position in that rank's list.
struct GridMark {
  int rank = -1;
  int step = -1;
};

// Step x rank grid, one column per rank, one row per position in the lists:
//
//   step  rank 0   rank 1
//      0  0F0      1F0
//      1  0F1     [1B0]   <- marked cell
//
// Short lists leave blank cells. With a mark, only the 10 steps either side
// of it are shown, and a line says which steps are left out.
std::string FormatGrid(const RankActions& ranks, std::optional<GridMark> mark = std::nullopt);

// InvalidArgument naming the schedule, the cell and `message`, followed by the
// schedule's grid with that cell marked.
absl::Status ScheduleCellError(const Schedule& schedule, int rank, int step,
                               absl::string_view message);

// Checks the cell ranks[rank][step] on its own: a compute action whose stage
// and micro-batch are in range and whose stage is placed on `rank` (both
// halves of an OVERLAP_F_B, which must be a valid pair: CheckOverlapPair), or
// a vocabulary pass of a micro-batch in range in a vocab_parallel schedule.
absl::Status CheckComputeCell(const Schedule& schedule, int rank, int step);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_IR_SCHEDULE_H_
