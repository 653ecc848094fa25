// One Chrome trace of a profiled run: each rank a process lane, pipe's own
// schedule actions (F, B, SEND_*, RECV_*, the tail) in the lane's top track,
// and below it the LibTorch operators that rank ran, each tagged with the
// action it ran in. Open it in Perfetto (ui.perfetto.dev) or chrome://tracing.
//
// Inputs:
//  - per-rank operator traces: OperatorProfiler::ChromeTraceJson
//    (operator_profiler.h), timestamps in steady_clock microseconds;
//  - pipe's action trace: the format of pipeline/schedule/ir/chrome_trace.h
//    (complete "X" events, tid = global rank, name = the action, "1F3").
// No LibTorch here, so any package may merge.
#ifndef OBSERVABILITY_TRACE_MERGE_H_
#define OBSERVABILITY_TRACE_MERGE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pp {

struct TraceMergeOptions {
  // Added to every action timestamp to put it on steady_clock microseconds.
  // 0 for an action trace written from ActionTiming's steady-clock times with
  // ChromeTraceOptions::microseconds_per_unit = 1; Trainer::LastStepTrace
  // subtracts the step's earliest start, which must then be passed here.
  double action_time_offset_us = 0;
};

// Merges the operator traces (at most one per rank) with `action_trace` (may be
// empty: operators only). InvalidArgument, naming the input, for text that is
// not a Chrome trace, an operator trace without otherData.rank or not on the
// steady clock, two traces of one rank, or a rank whose actions and operators
// do not overlap in time at all (wrong offset, or traces of different steps).
absl::StatusOr<std::string> MergeTraces(const std::vector<std::string>& operator_traces,
                                        absl::string_view action_trace,
                                        const TraceMergeOptions& options = {});

// MergeTraces over files; writes the result to `output_path`. NotFound for an
// unreadable input, Internal for an unwritable output.
absl::Status MergeTraceFiles(const std::vector<std::string>& operator_trace_paths,
                             absl::string_view action_trace_path, absl::string_view output_path,
                             const TraceMergeOptions& options = {});

}  // namespace pp

#endif  // OBSERVABILITY_TRACE_MERGE_H_
