// Chrome-trace JSON (the "Trace Event Format" that chrome://tracing and
// Perfetto open) from a list of timed actions. Used for simulated timelines
// (simulator.h) and, by the runtime, for measured ones: record one TraceEvent
// per executed action and write them with ChromeTraceJson.
#ifndef PIPELINE_SCHEDULE_IR_CHROME_TRACE_H_
#define PIPELINE_SCHEDULE_IR_CHROME_TRACE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pp {

// One action of one rank over [start, end), in `time_unit`s (see below).
struct TraceEvent {
  int rank = 0;
  std::string name;  // an action string ("1F3", "0SEND_B2") or any label
  double start = 0;
  double end = 0;
  // The OVERLAP_F_B ("(0F3;3B1)OVERLAP_F_B") this action is a half of, if
  // any: Chrome traces show it in the event's args, SVGs outline the pair.
  std::string overlap;
  // Not an action of the rank's thread but work its communication backend
  // ran in the background (a distributed optimizer's early reduce-scatter):
  // shown in a process of its own, "background collectives", one track per
  // rank (pid 1; the actions are pid 0), category "background".
  bool background = false;
  // A background collective that an action started without waiting for it
  // (an asynchronous vocabulary collective): that action ("OUT_STATS3"), in
  // the event's args as "started_by" with its stage and micro-batch; the
  // span runs from the action's start to the collective's completion.
  std::string started_by;
};

// The span in flight of the collective `started_by` (an action string) began
// without waiting for it: "<started_by> in flight", in the background.
TraceEvent InFlightEvent(int rank, const std::string& started_by, double start, double end);

struct ChromeTraceOptions {
  // Microseconds per unit of TraceEvent time (Chrome traces are in us):
  // 1 for measured microseconds, 1e6 for seconds; simulated unit costs look
  // best at e.g. 1000 (one unit = 1 ms).
  double microseconds_per_unit = 1000;
  std::string process_name = "pipeline";
};

// A JSON object {"traceEvents": [...], "displayTimeUnit": "ms"} with one
// complete ("X") event per TraceEvent (pid 0, tid = rank, cat = the action
// type when the name parses as an action, else "other"; background events in
// pid 1) and thread names "rank N".
std::string ChromeTraceJson(const std::vector<TraceEvent>& events,
                            const ChromeTraceOptions& options = {});

// Writes ChromeTraceJson to `path`; InvalidArgument if it cannot be written.
absl::Status WriteChromeTrace(absl::string_view path, const std::vector<TraceEvent>& events,
                              const ChromeTraceOptions& options = {});

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_IR_CHROME_TRACE_H_
