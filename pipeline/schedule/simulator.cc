#include "pipeline/schedule/simulator.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "pipeline/schedule/internal_execution.h"

namespace pp {

absl::StatusOr<SimulationCosts> ParseSimulationCosts(absl::string_view text) {
  SimulationCosts costs;
  bool backward_given = false;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, ':');
    double value = 0;
    if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad cost \"", item, "\" in \"", text,
                       "\": expected KEY:VALUE with KEY in F, B, I, W, comm and VALUE >= 0"));
    }
    if (kv[0] == "F") {
      costs.forward = value;
    } else if (kv[0] == "B") {
      costs.backward = value;
      backward_given = true;
    } else if (kv[0] == "I") {
      costs.backward_input = value;
    } else if (kv[0] == "W") {
      costs.backward_weight = value;
    } else if (kv[0] == "comm") {
      costs.comm = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown cost key \"", kv[0], "\" in \"", text,
                                                     "\": valid keys are F, B, I, W, comm"));
    }
  }
  if (!backward_given) costs.backward = costs.backward_input + costs.backward_weight;
  return costs;
}

absl::StatusOr<MessageCost> FitMessageCost(const std::vector<MessageSample>& samples) {
  std::vector<double> sizes;
  for (size_t i = 0; i < samples.size(); ++i) {
    const MessageSample& m = samples[i];
    if (!std::isfinite(m.bytes) || !std::isfinite(m.seconds) || m.bytes < 0 || m.seconds <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("message sample ", i, " (bytes ", m.bytes, ", seconds ", m.seconds,
                       "): bytes must be finite and >= 0, seconds finite and > 0"));
    }
    if (std::find(sizes.begin(), sizes.end(), m.bytes) == sizes.end()) sizes.push_back(m.bytes);
  }
  if (sizes.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fitting latency + bytes / bandwidth needs samples of at least 2 distinct sizes; got ",
        sizes.size(), " (", samples.size(), " samples)"));
  }
  // Weighted normal equations for y = a + b x, weight 1 / y^2.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const MessageSample& m : samples) {
    const double w = 1 / (m.seconds * m.seconds);
    sw += w;
    sx += w * m.bytes;
    sy += w * m.seconds;
    sxx += w * m.bytes * m.bytes;
    sxy += w * m.bytes * m.seconds;
  }
  MessageCost cost;
  const double det = sw * sxx - sx * sx;
  cost.latency = (sxx * sy - sx * sxy) / det;
  cost.per_byte = (sw * sxy - sx * sy) / det;
  if (cost.latency < 0) {  // through the origin
    cost.latency = 0;
    cost.per_byte = sxy / sxx;
  } else if (cost.per_byte < 0) {  // size does not matter
    cost.per_byte = 0;
    cost.latency = sy / sw;
  }
  return cost;
}

absl::StatusOr<MemorySplit> ParseMemorySplit(absl::string_view text) {
  MemorySplit split;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, ':');
    double value = 0;
    if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad memory split part \"", item, "\" in \"", text,
                       "\": expected KEY:VALUE with KEY in I, W and VALUE >= 0"));
    }
    if (kv[0] == "I") {
      split.input = value;
    } else if (kv[0] == "W") {
      split.weight = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown memory split key \"", kv[0],
                                                     "\" in \"", text, "\": valid keys are I, W"));
    }
  }
  if (split.input + split.weight <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("memory split \"", text,
                                                   "\": I + W must be > 0 (the parts of one F's "
                                                   "activations freed by I and by W)"));
  }
  return split;
}

absl::StatusOr<SimulationResult> SimulateProgram(const LoweredProgram& program,
                                                 const SimulationCosts& costs) {
  const int num_virtual = program.num_virtual_stages();
  if (costs.forward < 0 || costs.backward < 0 || costs.backward_input < 0 ||
      costs.backward_weight < 0 || costs.comm < 0) {
    return absl::InvalidArgumentError("simulation costs must be >= 0");
  }
  if (costs.memory.input < 0 || costs.memory.weight < 0 ||
      costs.memory.input + costs.memory.weight <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("memory split I:", costs.memory.input,
                                                   ",W:", costs.memory.weight,
                                                   ": both parts must be >= 0 and their sum > 0"));
  }
  const double input_frees = costs.memory.InputFraction();
  if (!costs.stage_multiplier.empty() &&
      static_cast<int>(costs.stage_multiplier.size()) != num_virtual) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage_multiplier has ", costs.stage_multiplier.size(),
                     " entries; expected one per virtual stage (", num_virtual, ") or none"));
  }
  if (costs.message.latency < 0 || costs.message.per_byte < 0) {
    return absl::InvalidArgumentError(absl::StrCat("message cost latency ", costs.message.latency,
                                                   ", per byte ", costs.message.per_byte,
                                                   ": both must be >= 0"));
  }
  double message_time = costs.comm;
  for (double bytes : costs.message_bytes) {
    if (bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("message_bytes has a negative size ", bytes, "; sizes must be >= 0"));
    }
    message_time += costs.message.Of(bytes);
  }
  internal_schedule::ExecutionCosts exec_costs;
  exec_costs.message_latency = message_time;
  exec_costs.blocking_sends = costs.blocking_sends;
  exec_costs.compute = [&costs](const Action& a) {
    double base = 0;
    switch (a.type) {
      case ActionType::kForward:
        base = costs.forward;
        break;
      case ActionType::kBackward:
        base = costs.backward;
        break;
      case ActionType::kBackwardInput:
        base = costs.backward_input;
        break;
      default:
        base = costs.backward_weight;
        break;
    }
    if (!costs.stage_multiplier.empty()) base *= costs.stage_multiplier[a.stage];
    return base;
  };
  PP_ASSIGN_OR_RETURN(internal_schedule::Execution ex,
                      internal_schedule::Execute(program, exec_costs));
  const int p = program.num_stages;
  SimulationResult result;
  result.busy.assign(p, 0);
  result.idle.assign(p, 0);
  result.peak_inflight.assign(p, 0);
  result.peak_memory.assign(p, 0);
  result.inner_idle.assign(p, 0);
  for (int r = 0; r < p; ++r) {
    int inflight = 0;
    double memory = 0;
    double first_start = -1, last_end = 0;
    for (int i = 0; i < static_cast<int>(program.ranks[r].size()); ++i) {
      const Action& action = program.ranks[r][i];
      result.makespan = std::max(result.makespan, ex.end[r][i]);
      if (IsTail(action.type)) continue;
      if (!IsCompute(action.type)) {
        result.timeline.push_back({r, ActionToString(action), ex.start[r][i], ex.end[r][i]});
        continue;
      }
      if (first_start < 0) first_start = ex.start[r][i];
      last_end = std::max(last_end, ex.end[r][i]);
      // An OVERLAP_F_B runs its halves back to back (no overlap is modelled):
      // one timeline event per half, named by the half.
      double t = ex.start[r][i];
      for (const Action& a : Leaves(action)) {
        const double end =
            action.type == ActionType::kOverlapFB ? t + exec_costs.compute(a) : ex.end[r][i];
        result.timeline.push_back(
            {r, ActionToString(a), t, end,
             action.type == ActionType::kOverlapFB ? ActionToString(action) : std::string()});
        result.busy[r] += end - t;
        t = end;
        switch (a.type) {
          case ActionType::kForward:
            result.peak_inflight[r] = std::max(result.peak_inflight[r], ++inflight);
            memory += 1;
            result.peak_memory[r] = std::max(result.peak_memory[r], memory);
            break;
          case ActionType::kBackward:
            --inflight;
            memory -= 1;
            break;
          case ActionType::kBackwardInput:
            memory -= input_frees;
            break;
          case ActionType::kBackwardWeight:
            --inflight;
            memory -= 1 - input_frees;
            break;
          default:
            break;
        }
      }
    }
    if (first_start >= 0) result.inner_idle[r] = last_end - first_start - result.busy[r];
  }
  // Forward-only programs free activations as they go: one at a time.
  if (program.forward_only) {
    for (int r = 0; r < p; ++r) {
      result.peak_inflight[r] = std::min(result.peak_inflight[r], 1);
      result.peak_memory[r] = std::min(result.peak_memory[r], 1.0);
    }
  }
  double total_idle = 0;
  for (int r = 0; r < p; ++r) {
    result.idle[r] = result.makespan - result.busy[r];
    total_idle += result.idle[r];
  }
  result.bubble_fraction = result.makespan > 0 ? total_idle / (p * result.makespan) : 0;
  return result;
}

absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule, const SimulationCosts& costs) {
  PP_ASSIGN_OR_RETURN(LoweredProgram program, Lower(schedule));
  return SimulateProgram(program, costs);
}

}  // namespace pp
