#include "pipeline/schedule/ir/chrome_trace.h"

#include <fstream>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/ir/action.h"

namespace pp {

TraceEvent InFlightEvent(int rank, const std::string& started_by, double start, double end) {
  TraceEvent e{rank, absl::StrCat(started_by, " in flight"), start, end};
  e.background = true;
  e.started_by = started_by;
  return e;
}

std::string ChromeTraceJson(const std::vector<TraceEvent>& events,
                            const ChromeTraceOptions& options) {
  nlohmann::json trace_events = nlohmann::json::array();
  trace_events.push_back({{"name", "process_name"},
                          {"ph", "M"},
                          {"pid", 0},
                          {"args", {{"name", options.process_name}}}});
  std::set<std::pair<int, int>> tracks;  // (pid, rank)
  bool any_background = false;
  for (const TraceEvent& e : events) {
    tracks.insert({e.background ? 1 : 0, e.rank});
    any_background |= e.background;
  }
  if (any_background) {
    trace_events.push_back({{"name", "process_name"},
                            {"ph", "M"},
                            {"pid", 1},
                            {"args", {{"name", "background collectives"}}}});
  }
  for (const auto& [pid, rank] : tracks) {
    trace_events.push_back({{"name", "thread_name"},
                            {"ph", "M"},
                            {"pid", pid},
                            {"tid", rank},
                            {"args", {{"name", absl::StrCat("rank ", rank)}}}});
    trace_events.push_back({{"name", "thread_sort_index"},
                            {"ph", "M"},
                            {"pid", pid},
                            {"tid", rank},
                            {"args", {{"sort_index", rank}}}});
  }
  for (const TraceEvent& e : events) {
    absl::StatusOr<Action> action =
        e.background ? absl::StatusOr<Action>(absl::NotFoundError("")) : ParseAction(e.name);
    std::string category = e.background  ? "background"
                           : action.ok() ? std::string(ActionTypeName(action->type))
                                         : "other";
    nlohmann::json event = {
        {"name", e.name},
        {"cat", category},
        {"ph", "X"},
        {"pid", e.background ? 1 : 0},
        {"tid", e.rank},
        {"ts", e.start * options.microseconds_per_unit},
        {"dur", (e.end - e.start) * options.microseconds_per_unit},
    };
    if (action.ok() && HasMicrobatch(action->type)) {
      event["args"] = {{"stage", action->stage}, {"microbatch", action->microbatch}};
    }
    if (!e.overlap.empty()) event["args"]["overlap_f_b"] = e.overlap;
    if (!e.started_by.empty()) {
      event["args"]["started_by"] = e.started_by;
      if (absl::StatusOr<Action> starter = ParseAction(e.started_by); starter.ok()) {
        event["args"]["stage"] = starter->stage;
        event["args"]["microbatch"] = starter->microbatch;
      }
    }
    trace_events.push_back(std::move(event));
  }
  nlohmann::json root = {{"traceEvents", trace_events}, {"displayTimeUnit", "ms"}};
  return root.dump(1);
}

absl::Status WriteChromeTrace(absl::string_view path, const std::vector<TraceEvent>& events,
                              const ChromeTraceOptions& options) {
  std::ofstream out{std::string(path)};
  out << ChromeTraceJson(events, options);
  out.close();
  if (!out) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write the Chrome trace to \"", path, "\""));
  }
  return absl::OkStatus();
}

}  // namespace pp
