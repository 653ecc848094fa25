#include "observability/trace_merge.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace pp {
namespace {

using nlohmann::json;

// The action track sits on top of each rank's lane.
constexpr int kActionTid = 0;
constexpr int kBackgroundTid = 1;

absl::StatusOr<json> ParseTrace(absl::string_view text, absl::string_view what) {
  json trace;
  try {
    trace = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not JSON: ", e.what()));
  }
  // Chrome's format allows a bare array of events, too.
  if (trace.is_array()) trace = json{{"traceEvents", trace}};
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not a Chrome trace (no \"traceEvents\" array)"));
  }
  return trace;
}

bool IsComplete(const json& e) {
  return e.is_object() && e.value("ph", "") == "X" && e.contains("ts") && e["ts"].is_number();
}

struct Span {
  double start = 0;
  double end = 0;
};

// Everything known about one rank's lane.
struct Lane {
  std::vector<json> actions;  // on kActionTid, ts shifted, sorted by start
  // The action trace's background events (pid 1: a distributed optimizer's
  // reduce-scatters), on kBackgroundTid, ts shifted.
  std::vector<json> background;
  std::vector<json> operators;  // original tids, mapped when written
  std::map<uint64_t, int> thread_tids;
  Span action_span{std::numeric_limits<double>::max(), std::numeric_limits<double>::lowest()};
  Span operator_span{std::numeric_limits<double>::max(), std::numeric_limits<double>::lowest()};
};

void Extend(Span& span, double start, double end) {
  span.start = std::min(span.start, start);
  span.end = std::max(span.end, end);
}

double End(const json& e) { return e["ts"].get<double>() + e.value("dur", 0.0); }

// The action of `actions` (sorted by start) whose interval contains `ts`, the
// latest-starting one if several do; nullptr if none. `max_end[i]` is the
// largest end among actions[0..i], so the backward scan stops early.
const json* ContainingAction(const std::vector<json>& actions, const std::vector<double>& max_end,
                             double ts) {
  auto after = std::upper_bound(actions.begin(), actions.end(), ts,
                                [](double t, const json& a) { return t < a["ts"].get<double>(); });
  for (int i = static_cast<int>(after - actions.begin()) - 1; i >= 0 && max_end[i] >= ts; --i) {
    if (End(actions[i]) >= ts) return &actions[i];
  }
  return nullptr;
}

json Metadata(const char* name, int pid, int tid, json args) {
  json m = {{"name", name}, {"ph", "M"}, {"pid", pid}, {"args", std::move(args)}};
  if (tid >= 0) m["tid"] = tid;
  return m;
}

absl::StatusOr<std::string> ReadFile(absl::string_view path) {
  std::ifstream in{std::string(path)};
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read trace \"", path, "\""));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

namespace {

// MergeOrThrow's steps: read the operator traces into their ranks' lanes, add
// the action trace, then write each lane.

// One lane per operator trace's rank (at most one trace per rank).
absl::Status AddOperatorTraces(const std::vector<std::string>& operator_traces,
                               std::map<int, Lane>& lanes) {
  std::set<int> ranks_with_operators;
  for (size_t i = 0; i < operator_traces.size(); ++i) {
    const std::string what = absl::StrCat("operator trace #", i);
    PP_ASSIGN_OR_RETURN(json trace, ParseTrace(operator_traces[i], what));
    const json other = trace.value("otherData", json::object());
    if (!other.contains("rank") || !other["rank"].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what,
          " has no integer otherData.rank (write it with OperatorProfiler::ChromeTraceJson)"));
    }
    if (other.value("clock", "") != "steady_clock_us") {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is not on the steady clock (otherData.clock is \"",
                       other.value("clock", ""), "\", need \"steady_clock_us\")"));
    }
    const int rank = other["rank"].get<int>();
    if (rank < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": rank ", rank, " < 0"));
    if (!ranks_with_operators.insert(rank).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is a second operator trace of rank ", rank));
    }
    Lane& lane = lanes[rank];
    for (const json& e : trace["traceEvents"]) {
      if (!e.is_object() || e.value("ph", "") == "M") continue;  // metadata is rewritten
      const uint64_t thread = e.value("tid", uint64_t{0});
      lane.thread_tids.emplace(thread, 0);
      if (IsComplete(e)) Extend(lane.operator_span, e["ts"].get<double>(), End(e));
      lane.operators.push_back(e);
    }
  }
  return absl::OkStatus();
}

// Each complete event of the action trace goes to the lane of its rank (its
// tid), shifted onto the operators' clock.
absl::Status AddActionTrace(absl::string_view action_trace, const TraceMergeOptions& options,
                            std::map<int, Lane>& lanes) {
  PP_ASSIGN_OR_RETURN(json trace, ParseTrace(action_trace, "the action trace"));
  for (const json& e : trace["traceEvents"]) {
    if (!IsComplete(e)) continue;
    if (!e.contains("tid") || !e["tid"].is_number_integer() || e["tid"].get<int>() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the action trace's event ", e.dump(), " has no rank (tid) >= 0"));
    }
    Lane& lane = lanes[e["tid"].get<int>()];
    json action = e;
    action["ts"] = e["ts"].get<double>() + options.action_time_offset_us;
    if (e.value("pid", 0) != 0) {
      lane.background.push_back(std::move(action));
      continue;
    }
    Extend(lane.action_span, action["ts"].get<double>(), End(action));
    lane.actions.push_back(std::move(action));
  }
  return absl::OkStatus();
}

// Rank `rank`'s lane as events of process `rank`: names and order, the
// actions on their own track on top, then each operator with the action it
// ran in (args.pipe_action). Fails when actions and operators never overlap.
absl::Status WriteLane(int rank, Lane& lane, const TraceMergeOptions& options, json& out) {
  if (!lane.actions.empty() && !lane.operators.empty() &&
      (lane.action_span.end < lane.operator_span.start ||
       lane.operator_span.end < lane.action_span.start)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d: its actions span [%.0f, %.0f] us but its operators [%.0f, %.0f] us; they "
        "never overlap, so the action trace is from other steps or its clock offset is wrong "
        "(action_time_offset_us = %.0f)",
        rank, lane.action_span.start, lane.action_span.end, lane.operator_span.start,
        lane.operator_span.end, options.action_time_offset_us));
  }
  out.push_back(Metadata("process_name", rank, -1, {{"name", absl::StrCat("rank ", rank)}}));
  out.push_back(Metadata("process_sort_index", rank, -1, {{"sort_index", rank}}));
  out.push_back(Metadata("thread_name", rank, kActionTid, {{"name", "pipe actions"}}));
  out.push_back(Metadata("thread_sort_index", rank, kActionTid, {{"sort_index", kActionTid}}));
  if (!lane.background.empty()) {
    out.push_back(
        Metadata("thread_name", rank, kBackgroundTid, {{"name", "background collectives"}}));
    out.push_back(
        Metadata("thread_sort_index", rank, kBackgroundTid, {{"sort_index", kBackgroundTid}}));
  }
  // Operators' tracks follow (their first is kBackgroundTid without one).
  int next_tid = lane.background.empty() ? kActionTid + 1 : kBackgroundTid + 1;
  for (auto& [thread, tid] : lane.thread_tids) {
    tid = next_tid++;
    out.push_back(Metadata("thread_name", rank, tid,
                           {{"name", absl::StrCat("operators (LibTorch thread ", thread, ")")}}));
    out.push_back(Metadata("thread_sort_index", rank, tid, {{"sort_index", tid}}));
  }

  std::stable_sort(lane.actions.begin(), lane.actions.end(), [](const json& a, const json& b) {
    return a["ts"].get<double>() < b["ts"].get<double>();
  });
  std::vector<double> max_end(lane.actions.size());
  for (size_t i = 0; i < lane.actions.size(); ++i) {
    max_end[i] = std::max(i == 0 ? End(lane.actions[i]) : max_end[i - 1], End(lane.actions[i]));
  }
  for (json& action : lane.actions) {
    action["pid"] = rank;
    action["tid"] = kActionTid;
    out.push_back(action);
  }
  for (json& event : lane.background) {
    event["pid"] = rank;
    event["tid"] = kBackgroundTid;
    out.push_back(std::move(event));
  }
  for (json& op : lane.operators) {
    op["pid"] = rank;
    op["tid"] = lane.thread_tids.at(op.value("tid", uint64_t{0}));
    if (IsComplete(op) && op.value("cat", "") != "step") {
      if (const json* action = ContainingAction(lane.actions, max_end, op["ts"].get<double>())) {
        if (!op.contains("args") || !op["args"].is_object()) op["args"] = json::object();
        op["args"]["pipe_action"] = (*action)["name"];
      }
    }
    out.push_back(std::move(op));
  }
  return absl::OkStatus();
}

// MergeTraces, less the conversion of nlohmann's type errors (a field of the
// wrong type somewhere in an input) into a Status.
absl::StatusOr<std::string> MergeOrThrow(const std::vector<std::string>& operator_traces,
                                         absl::string_view action_trace,
                                         const TraceMergeOptions& options) {
  std::map<int, Lane> lanes;
  PP_RETURN_IF_ERROR(AddOperatorTraces(operator_traces, lanes));
  if (!action_trace.empty()) PP_RETURN_IF_ERROR(AddActionTrace(action_trace, options, lanes));
  json out = json::array();
  for (auto& [rank, lane] : lanes) PP_RETURN_IF_ERROR(WriteLane(rank, lane, options, out));
  json root = {{"traceEvents", std::move(out)},
               {"displayTimeUnit", "ms"},
               {"otherData", {{"clock", "steady_clock_us"}, {"merged_by", "pipe trace_merge"}}}};
  return root.dump();
}

}  // namespace

absl::StatusOr<std::string> MergeTraces(const std::vector<std::string>& operator_traces,
                                        absl::string_view action_trace,
                                        const TraceMergeOptions& options) {
  try {
    return MergeOrThrow(operator_traces, action_trace, options);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("a trace to merge has a field of the wrong type: ", e.what()));
  }
}

absl::Status MergeTraceFiles(const std::vector<std::string>& operator_trace_paths,
                             absl::string_view action_trace_path, absl::string_view output_path,
                             const TraceMergeOptions& options) {
  std::vector<std::string> operator_traces;
  for (const std::string& path : operator_trace_paths) {
    PP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    operator_traces.push_back(std::move(text));
  }
  std::string action_trace;
  if (!action_trace_path.empty()) {
    PP_ASSIGN_OR_RETURN(action_trace, ReadFile(action_trace_path));
  }
  PP_ASSIGN_OR_RETURN(std::string merged, MergeTraces(operator_traces, action_trace, options));
  std::ofstream out{std::string(output_path)};
  out << merged;
  out.close();
  if (!out) {
    return absl::InternalError(
        absl::StrCat("cannot write the merged trace to \"", output_path, "\""));
  }
  return absl::OkStatus();
}

}  // namespace pp
