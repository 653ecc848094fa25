// Schedules as CSV files, in PyTorch pipelining's layout: one row per rank,
// one action per cell, an empty cell is an idle step. Two forms, as PyTorch's
// _dump_csv/_load_csv (torch/distributed/pipelining/schedules.py):
//
//   compute only ("compute_only"):         0F0,0F1,0B0,0B1
//                                          ,1F0,1B0,1F1,1B1
//   compute + comms ("compute_comms"):     0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,...
//                                          1RECV_F0,1F0,1B0,1SEND_B0,...,1REDUCE_GRAD
//
// A file in the compute + comms form is the lowered program itself: the
// loaded Schedule carries it in `given_program` and Lower() returns it instead
// of deriving one (the validator still executes it with blocking sends). A
// file is in that form when any cell is not a compute action (F, B, I, W and
// whatever else ParseAction accepts as compute).
//
// Read, beyond pipe's own action strings (PyTorch 2.15's compute + comms
// form loads both ways):
//   - `<s>UNSHARD`, `<s>RESHARD` (PyTorch's FSDP prefetch; pipe has no FSDP):
//     skipped (their stage must be on the row's rank).
//   - `<s>WAIT_SEND_F<mb>`, `<s>WAIT_SEND_B<mb>` (PyTorch retires a send at its
//     wait; pipe's runtime posts sends asynchronously and joins them itself):
//     checked to follow their `<s>SEND_F<mb>`/`<s>SEND_B<mb>` on the row, then
//     skipped.
//   - `<s>WAIT_REDUCE_GRAD` (pipe's REDUCE_GRAD completes in place): checked
//     to follow a `<s>REDUCE_GRAD` on the row, then skipped.
//   - the tail (`<s>REDUCE_GRAD`, and pipe's `REDUCE_TIED`, `STEP`, which
//     PyTorch cannot read): dropped and rebuilt as Lower() builds it (after
//     every compute and message of the rank: REDUCE_TIED, REDUCE_GRAD per
//     local stage in the order its last backward runs, STEP), so a file
//     without any tail trains too.
//   - cells in double quotes (Python's csv module quotes some fields), `\r\n`.
//   - lines starting with `#` are comments; one of them may give the
//     placement (PyTorch's reader does not know comments: drop the line
//     there; PyTorch infers the placement from the cells):
//
//         # stage_to_rank: looped | v | 0,1,1,0
//
//     `looped`: virtual stage s on rank s % p; `v`: rank r holds stages r
//     and 2p-1-r (VPlacement); a list: stage s on rank list[s]. Without the
//     line (and without CsvReadOptions::stage_to_rank) the placement is
//     the one the cells imply, as PyTorch infers it: stage s on the rank
//     whose row names it (an error names two cells that put one stage on two
//     ranks). The writer adds the line only when the placement is not looped.
//
// Vocabulary parallelism (vocab_passes.h) is pipe's own and PyTorch's reader
// does not know it: a file with any vocabulary action (OUT_S<mb>, OUT_T<mb>,
// IN_F<mb>, IN_B<mb> in either form, and the collectives OUT_BCAST<mb>,
// OUT_STATS<mb>, OUT_REDUCE<mb>, IN_REDUCE<mb>, IN_BCAST<mb> in the compute +
// comms form; no stage number: every rank runs them) is a vocab_parallel
// schedule. Every rank's row then holds each pass once per micro-batch.
// The output layer's algorithm (Schedule::vocab_barriers) is a comment line,
// written for the one-barrier form only:
//
//         # vocab_barriers: 1
//
// A file without it is the two-barrier form (files written before the marker
// existed mean that); "# vocab_barriers: 2" says so explicitly. The line in
// a file without vocabulary actions is refused.
//
// The shape comes from the file: p = rows, virtual stages = the placement's
// size (looped/v: from the largest stage in any cell), v = stages / p, m =
// largest micro-batch + 1; forward_only when no cell is a backward.
//
// Errors are InvalidArgument naming the file (CsvReadOptions::source), the
// line and column (1-based, as an editor shows them), the cell's text and what
// is valid, followed by the cells as a column x rank grid with the bad cell
// marked. Rule violations found by the validator (ValidateSchedule: order,
// counts, dependencies, deadlock) keep its step x rank grid and name the CSV
// line and column of the cell it marks.
#ifndef PIPELINE_SCHEDULE_FORMATS_CSV_H_
#define PIPELINE_SCHEDULE_FORMATS_CSV_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {

// The prefix that names a CSV file where a schedule name is expected
// (MakeSchedule, --schedule=csv:FILE, parallelism.schedule: "csv:FILE").
inline constexpr absl::string_view kCsvSchedulePrefix = "csv:";

struct CsvReadOptions {
  // Shown in errors and used as the schedule's name ("csv:<source>").
  std::string source = "<csv>";
  // Placement: "" (the file's `# stage_to_rank:` line, else looped),
  // "looped", "v" or a comma-separated rank per virtual stage. A file line
  // that disagrees with a non-empty value is an error naming both.
  std::string stage_to_rank;
};

// The compute-only form of `schedule`: its compute actions, one row per rank
// (no idle cells; the lists are orders, not time steps), preceded by the
// `# stage_to_rank:` line when the placement is not looped.
std::string ScheduleToCsv(const Schedule& schedule);

// The compute + comms form of `program`, as PyTorch 2.15's loader takes it:
// each rank's actions in program order; a `<s>WAIT_SEND_F<mb>` after the
// local backward of each forward send's micro-batch and the other sends'
// waits at the end (PyTorch's _add_wait_send); the tail as
// `<s>REDUCE_GRAD,<s>WAIT_REDUCE_GRAD` pairs (REDUCE_TIED and STEP are
// rebuilt on reading); preceded by the `# stage_to_rank:` line when the
// placement is not looped (drop it for PyTorch, which infers placement).
std::string ProgramToCsv(const LoweredProgram& program);

// Parses either form (see above) into a Schedule named "csv:<source>". The
// result has passed ValidateSchedule (and so lowers); with comms,
// `given_program` holds the program with its tail rebuilt.
absl::StatusOr<Schedule> ParseCsvSchedule(absl::string_view text,
                                          const CsvReadOptions& options = {});

// Largest schedule file read (LoadCsvScheduleFile).
inline constexpr std::uintmax_t kMaxCsvFileBytes = std::uintmax_t{64} << 20;

// Reads the file at `path` and parses it (source = path). NotFound/
// InvalidArgument name the path; a FIFO, device or directory is refused
// before it is opened (a FIFO would block, /dev/zero never ends), and so is a
// file over kMaxCsvFileBytes.
absl::StatusOr<Schedule> LoadCsvScheduleFile(const std::string& path, CsvReadOptions options = {});

// Parses a placement value ("looped", "v", "0,1,1,0") for `num_stages` ranks;
// for looped/v the number of virtual stages is `num_virtual_stages`.
absl::StatusOr<std::vector<int>> ParseStageToRank(absl::string_view text, int num_stages,
                                                  int num_virtual_stages);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_FORMATS_CSV_H_
