#include "pipeline/schedule/analysis/simulator.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "pipeline/schedule/ir/defer_receives.h"
#include "pipeline/schedule/ir/internal_execution.h"

namespace pp {

namespace {

constexpr char kGlobalKeys[] =
    "F, B, I, W, comm, SEND, RECV, STEP, REDUCE_TIED, REDUCE_GRAD, OUT_S, OUT_T, IN_F, IN_B, "
    "VOCAB_COMM, VOCAB_BARRIERS, VOCAB_ASYNC";
constexpr char kStageKeys[] = "F, B, I, W, REDUCE_GRAD";
constexpr char kRankKeys[] = "STEP, REDUCE_TIED, SEND, RECV";

// Splits "KEY:VALUE" with VALUE in [0, kMaxSimulationCost]; false if
// malformed.
bool ParseKeyValue(absl::string_view item, absl::string_view* key, double* value) {
  std::vector<absl::string_view> kv = absl::StrSplit(item, ':');
  if (kv.size() != 2 || !absl::SimpleAtod(kv[1], value) || !std::isfinite(*value) || *value < 0 ||
      *value > kMaxSimulationCost) {
    return false;
  }
  *key = kv[0];
  return true;
}

// "STAGE:KEY:VALUE,KEY:VALUE;..." -> (index, "KEY:VALUE,...") pairs; `what`
// is "stage" or "rank".
absl::StatusOr<std::vector<std::pair<int, absl::string_view>>> SplitIndexed(
    absl::string_view text, absl::string_view what, absl::string_view keys) {
  std::vector<std::pair<int, absl::string_view>> out;
  for (absl::string_view part : absl::StrSplit(text, ';', absl::SkipWhitespace())) {
    const size_t colon = part.find(':');
    int index = -1;
    if (colon == absl::string_view::npos || !absl::SimpleAtoi(part.substr(0, colon), &index) ||
        index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad ", what, " costs \"", part, "\" in \"", text, "\": expected ",
                       absl::AsciiStrToUpper(what), ":KEY:VALUE[,KEY:VALUE...] with ", what,
                       " >= 0 and KEY in ", keys, "; ';' between ", what, "s"));
    }
    for (const auto& [seen, unused] : out) {
      if (seen == index) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " ", index, " is given twice in \"", text, "\""));
      }
    }
    out.push_back({index, part.substr(colon + 1)});
  }
  return out;
}

absl::Status BadItem(absl::string_view item, absl::string_view text, absl::string_view keys) {
  return absl::InvalidArgumentError(
      absl::StrCat("bad cost \"", item, "\" in \"", text, "\": expected KEY:VALUE with KEY in ",
                   keys, " and VALUE a number in [0, ", kMaxSimulationCost, "]"));
}

absl::Status UnknownKey(absl::string_view key, absl::string_view text, absl::string_view keys) {
  return absl::InvalidArgumentError(
      absl::StrCat("unknown cost key \"", key, "\" in \"", text, "\": valid keys are ", keys));
}

}  // namespace

absl::StatusOr<SimulationCosts> ParseSimulationCosts(absl::string_view text) {
  SimulationCosts costs;
  bool backward_given = false;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    absl::string_view key;
    double value = 0;
    if (!ParseKeyValue(item, &key, &value)) return BadItem(item, text, kGlobalKeys);
    if (key == "F") {
      costs.forward = value;
    } else if (key == "B") {
      costs.backward = value;
      backward_given = true;
    } else if (key == "I") {
      costs.backward_input = value;
    } else if (key == "W") {
      costs.backward_weight = value;
    } else if (key == "comm") {
      costs.comm = value;
    } else if (key == "SEND") {
      costs.send = value;
    } else if (key == "RECV") {
      costs.recv = value;
    } else if (key == "STEP") {
      costs.step = value;
    } else if (key == "REDUCE_TIED") {
      costs.reduce_tied = value;
    } else if (key == "REDUCE_GRAD") {
      costs.reduce_grad = value;
    } else if (key == "OUT_S") {
      costs.vocab.output_s = value;
    } else if (key == "OUT_T") {
      costs.vocab.output_t = value;
    } else if (key == "IN_F") {
      costs.vocab.input_f = value;
    } else if (key == "IN_B") {
      costs.vocab.input_b = value;
    } else if (key == "VOCAB_COMM") {
      costs.vocab.collective = value;
    } else if (key == "VOCAB_BARRIERS") {
      if (value != 1 && value != 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("cost VOCAB_BARRIERS:", value,
                         " must be 1 or 2 (the vocabulary algorithm the OUT_S "
                         "and OUT_T costs were measured in)"));
      }
      costs.vocab.barriers = static_cast<int>(value);
    } else if (key == "VOCAB_ASYNC") {
      if (value != 0 && value != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cost VOCAB_ASYNC:", value,
            " must be 0 (the vocabulary's collectives block) or 1 (they run beside compute)"));
      }
      costs.vocab.asynchronous = value == 1;
    } else {
      return UnknownKey(key, text, kGlobalKeys);
    }
  }
  if (!backward_given) costs.backward = costs.backward_input + costs.backward_weight;
  return costs;
}

absl::StatusOr<std::map<int, StageCosts>> ParseStageCosts(absl::string_view text) {
  PP_ASSIGN_OR_RETURN(auto parts, SplitIndexed(text, "stage", kStageKeys));
  std::map<int, StageCosts> out;
  for (const auto& [stage, items] : parts) {
    StageCosts& c = out[stage];
    for (absl::string_view item : absl::StrSplit(items, ',', absl::SkipEmpty())) {
      absl::string_view key;
      double value = 0;
      if (!ParseKeyValue(item, &key, &value)) return BadItem(item, text, kStageKeys);
      if (key == "F") {
        c.forward = value;
      } else if (key == "B") {
        c.backward = value;
      } else if (key == "I") {
        c.backward_input = value;
      } else if (key == "W") {
        c.backward_weight = value;
      } else if (key == "REDUCE_GRAD") {
        c.reduce_grad = value;
      } else {
        return UnknownKey(key, text, kStageKeys);
      }
    }
    if (!c.backward && c.backward_input && c.backward_weight) {
      c.backward = *c.backward_input + *c.backward_weight;
    }
  }
  return out;
}

absl::StatusOr<std::map<int, RankCosts>> ParseRankCosts(absl::string_view text) {
  PP_ASSIGN_OR_RETURN(auto parts, SplitIndexed(text, "rank", kRankKeys));
  std::map<int, RankCosts> out;
  for (const auto& [rank, items] : parts) {
    RankCosts& c = out[rank];
    for (absl::string_view item : absl::StrSplit(items, ',', absl::SkipEmpty())) {
      absl::string_view key;
      double value = 0;
      if (!ParseKeyValue(item, &key, &value)) return BadItem(item, text, kRankKeys);
      if (key == "STEP") {
        c.step = value;
      } else if (key == "REDUCE_TIED") {
        c.reduce_tied = value;
      } else if (key == "SEND") {
        c.send = value;
      } else if (key == "RECV") {
        c.recv = value;
      } else {
        return UnknownKey(key, text, kRankKeys);
      }
    }
  }
  return out;
}

absl::StatusOr<std::vector<double>> ParseMicrobatchMultipliers(absl::string_view text) {
  std::vector<double> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    double value = 0;
    if (!absl::SimpleAtod(part, &value) || !std::isfinite(value) || value < 0 ||
        value > kMaxSimulationCost) {
      return absl::InvalidArgumentError(
          absl::StrCat("micro-batch multiplier \"", part, "\" in \"", text,
                       "\" is not a finite number >= 0 (one per micro-batch, comma-separated)"));
    }
    out.push_back(value);
  }
  return out;
}

absl::StatusOr<std::optional<std::vector<std::vector<int>>>> ParseTieGroups(
    absl::string_view text) {
  if (text.empty()) return std::nullopt;
  std::vector<std::vector<int>> groups;
  if (text == "none") return groups;
  for (absl::string_view part : absl::StrSplit(text, ';', absl::SkipWhitespace())) {
    std::vector<int> group;
    for (absl::string_view item : absl::StrSplit(part, ',')) {
      int stage = -1;
      if (!absl::SimpleAtoi(item, &stage) || stage < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad stage \"", item, "\" in tie groups \"", text,
                         "\": expected \"none\" or groups of virtual stages >= 0 like "
                         "\"0,3;1,2\" (',' between stages, ';' between groups)"));
      }
      if (std::find(group.begin(), group.end(), stage) == group.end()) group.push_back(stage);
    }
    if (group.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat("tie group \"", part, "\" in \"", text,
                                                     "\" has fewer than 2 distinct stages"));
    }
    groups.push_back(group);
  }
  if (groups.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tie groups \"", text, "\" name no group; use \"none\" for no ties"));
  }
  return groups;
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

namespace {

// Every cost is finite and >= 0, every stage, rank and tie-group stage is the
// program's, the memory split and per-stage multipliers are usable.
absl::Status CheckCosts(const LoweredProgram& program, const SimulationCosts& costs) {
  const int num_virtual = program.num_virtual_stages();
  const int p = program.num_stages;
  for (const auto& [name, value] : {std::pair<const char*, double>{"F", costs.forward},
                                    {"B", costs.backward},
                                    {"I", costs.backward_input},
                                    {"W", costs.backward_weight},
                                    {"comm", costs.comm},
                                    {"SEND", costs.send},
                                    {"RECV", costs.recv},
                                    {"STEP", costs.step},
                                    {"REDUCE_TIED", costs.reduce_tied},
                                    {"REDUCE_GRAD", costs.reduce_grad},
                                    {"OUT_S", costs.vocab.output_s},
                                    {"OUT_T", costs.vocab.output_t},
                                    {"IN_F", costs.vocab.input_f},
                                    {"IN_B", costs.vocab.input_b},
                                    {"vocabulary collective", costs.vocab.collective}}) {
    if (!(value >= 0) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("simulation cost ", name, " is ", value, "; costs must be finite and >= 0"));
    }
  }
  if (costs.vocab.barriers != 1 && costs.vocab.barriers != 2) {
    return absl::InvalidArgumentError(absl::StrCat("simulation costs' vocab.barriers is ",
                                                   costs.vocab.barriers, "; must be 1 or 2"));
  }
  auto check_own = [](const std::optional<double>& v, absl::string_view what, int index,
                      absl::string_view key) -> absl::Status {
    if (v && (!(*v >= 0) || !std::isfinite(*v))) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", index, "'s cost ", key, " is ", *v,
                                                     "; costs must be finite and >= 0"));
    }
    return absl::OkStatus();
  };
  for (const auto& [stage, c] : costs.stage_costs) {
    if (stage < 0 || stage >= num_virtual) {
      return absl::InvalidArgumentError(absl::StrCat("stage costs are given for stage ", stage,
                                                     "; the program's virtual stages are 0..",
                                                     num_virtual - 1));
    }
    PP_RETURN_IF_ERROR(check_own(c.forward, "stage", stage, "F"));
    PP_RETURN_IF_ERROR(check_own(c.backward, "stage", stage, "B"));
    PP_RETURN_IF_ERROR(check_own(c.backward_input, "stage", stage, "I"));
    PP_RETURN_IF_ERROR(check_own(c.backward_weight, "stage", stage, "W"));
    PP_RETURN_IF_ERROR(check_own(c.reduce_grad, "stage", stage, "REDUCE_GRAD"));
  }
  for (const auto& [rank, c] : costs.rank_costs) {
    if (rank < 0 || rank >= p) {
      return absl::InvalidArgumentError(absl::StrCat("rank costs are given for rank ", rank,
                                                     "; the program's ranks are 0..", p - 1));
    }
    PP_RETURN_IF_ERROR(check_own(c.step, "rank", rank, "STEP"));
    PP_RETURN_IF_ERROR(check_own(c.reduce_tied, "rank", rank, "REDUCE_TIED"));
    PP_RETURN_IF_ERROR(check_own(c.send, "rank", rank, "SEND"));
    PP_RETURN_IF_ERROR(check_own(c.recv, "rank", rank, "RECV"));
  }
  if (!costs.microbatch_multiplier.empty()) {
    if (static_cast<int>(costs.microbatch_multiplier.size()) != program.num_microbatches) {
      return absl::InvalidArgumentError(
          absl::StrCat("microbatch_multiplier has ", costs.microbatch_multiplier.size(),
                       " entries; the program has ", program.num_microbatches, " micro-batches"));
    }
    for (size_t mb = 0; mb < costs.microbatch_multiplier.size(); ++mb) {
      const double x = costs.microbatch_multiplier[mb];
      if (!(x >= 0) || !std::isfinite(x)) {
        return absl::InvalidArgumentError(absl::StrCat("micro-batch ", mb, "'s multiplier is ", x,
                                                       "; multipliers must be finite and >= 0"));
      }
    }
  }
  if (costs.tie_groups) {
    for (const std::vector<int>& group : *costs.tie_groups) {
      for (int stage : group) {
        if (stage < 0 || stage >= num_virtual) {
          return absl::InvalidArgumentError(
              absl::StrCat("tie group stage ", stage,
                           " is outside the program's virtual stages 0..", num_virtual - 1));
        }
      }
    }
  }
  if (costs.memory.input < 0 || costs.memory.weight < 0 ||
      costs.memory.input + costs.memory.weight <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("memory split I:", costs.memory.input,
                                                   ",W:", costs.memory.weight,
                                                   ": both parts must be >= 0 and their sum > 0"));
  }
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
  for (double bytes : costs.message_bytes) {
    if (bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("message_bytes has a negative size ", bytes, "; sizes must be >= 0"));
    }
  }
  return absl::OkStatus();
}

// REDUCE_TIED's participants: ranks linked through tie groups (union-find
// roots); -1 for a rank in no group. Every rank is one group without
// costs.tie_groups.
std::vector<int> TieRoots(const LoweredProgram& program, const SimulationCosts& costs) {
  const int p = program.num_stages;
  std::vector<int> tie_root(p, 0);
  if (!costs.tie_groups) return tie_root;
  std::vector<int> parent(p);
  for (int r = 0; r < p; ++r) parent[r] = r;
  std::function<int(int)> find = [&](int r) {
    return parent[r] == r ? r : parent[r] = find(parent[r]);
  };
  std::vector<bool> tied(p, false);
  for (const std::vector<int>& group : *costs.tie_groups) {
    for (int stage : group) {
      const int r = program.stage_to_rank[stage];
      tied[r] = true;
      parent[find(r)] = find(program.stage_to_rank[group[0]]);
    }
  }
  for (int r = 0; r < p; ++r) tie_root[r] = tied[r] ? find(r) : -1;
  return tie_root;
}

double StageMultiplier(const SimulationCosts& costs, int stage) {
  return costs.stage_multiplier.empty() ? 1.0 : costs.stage_multiplier[stage];
}

// A compute leaf's duration: its stage's own cost (B = I + W when only those
// are given), else the global one times the stage's multiplier.
// `vocab_barriers`: the schedule's (VocabCosts: one barrier moves half of
// the two-barrier OUT_T into OUT_S).
double ComputeCost(const SimulationCosts& costs, const Action& a, int vocab_barriers) {
  const double mb =
      costs.microbatch_multiplier.empty() ? 1.0 : costs.microbatch_multiplier[a.microbatch];
  // What moves from OUT_T to OUT_S (negative: back).
  double moved = 0;
  if (vocab_barriers == 1 && costs.vocab.barriers == 2) moved = costs.vocab.output_t / 2;
  if (vocab_barriers == 2 && costs.vocab.barriers == 1) moved = -costs.vocab.output_t;
  switch (a.type) {
    case ActionType::kVocabOutputS:
      return std::max(0.0, costs.vocab.output_s + moved) * mb;
    case ActionType::kVocabOutputT:
      return (costs.vocab.output_t - moved) * mb;
    case ActionType::kVocabInputF:
      return costs.vocab.input_f * mb;
    case ActionType::kVocabInputB:
      return costs.vocab.input_b * mb;
    default:
      break;
  }
  double base = 0;
  std::optional<double> own;
  auto it = costs.stage_costs.find(a.stage);
  const StageCosts* stage = it == costs.stage_costs.end() ? nullptr : &it->second;
  switch (a.type) {
    case ActionType::kForward:
      base = costs.forward;
      if (stage != nullptr) own = stage->forward;
      break;
    case ActionType::kBackward:
      base = costs.backward;
      if (stage != nullptr) {
        own = stage->backward;
        if (!own && stage->backward_input && stage->backward_weight) {
          own = *stage->backward_input + *stage->backward_weight;
        }
      }
      break;
    case ActionType::kBackwardInput:
      base = costs.backward_input;
      if (stage != nullptr) own = stage->backward_input;
      break;
    default:
      base = costs.backward_weight;
      if (stage != nullptr) own = stage->backward_weight;
      break;
  }
  return (own ? *own : base * StageMultiplier(costs, a.stage)) * mb;
}

// A per-rank cost: the rank's own `field` when given, else `global`.
double RankCost(const SimulationCosts& costs, int rank, std::optional<double> RankCosts::*field,
                double global) {
  auto it = costs.rank_costs.find(rank);
  if (it == costs.rank_costs.end() || !(it->second.*field)) return global;
  return *(it->second.*field);
}

// A tail action's duration on `rank`: REDUCE_TIED (0 for a rank in no tie
// group), REDUCE_GRAD (the stage's own, else scaled), or STEP.
double TailCost(const SimulationCosts& costs, const std::vector<int>& tie_root, int rank,
                const Action& a) {
  switch (a.type) {
    case ActionType::kReduceTiedGrads:
      return tie_root[rank] < 0 ? 0.0
                                : RankCost(costs, rank, &RankCosts::reduce_tied, costs.reduce_tied);
    case ActionType::kReduceGrads: {
      auto it = costs.stage_costs.find(a.stage);
      if (it != costs.stage_costs.end() && it->second.reduce_grad) {
        return *it->second.reduce_grad;
      }
      return costs.reduce_grad * StageMultiplier(costs, a.stage);
    }
    default:
      return RankCost(costs, rank, &RankCosts::step, costs.step);
  }
}

// The durations and collective groups of `costs` as the execution engine
// takes them. The functions refer to `costs` and `tie_root`, which must
// outlive the result.
internal_schedule::ExecutionCosts MakeExecutionCosts(const LoweredProgram& program,
                                                     const SimulationCosts& costs,
                                                     const std::vector<int>& tie_root) {
  const int p = program.num_stages;
  // A collective's participants are only the ranks whose program has it.
  auto has_type = [&program](int r, ActionType type) {
    for (const Action& a : program.ranks[r]) {
      if (a.type == type) return true;
    }
    return false;
  };
  std::vector<bool> has_tied(p), has_step(p);
  for (int r = 0; r < p; ++r) {
    has_tied[r] = has_type(r, ActionType::kReduceTiedGrads);
    has_step[r] = has_type(r, ActionType::kOptimizerStep);
  }
  internal_schedule::ExecutionCosts exec_costs;
  exec_costs.message_latency = costs.comm;
  for (double bytes : costs.message_bytes) exec_costs.message_latency += costs.message.Of(bytes);
  exec_costs.blocking_sends = costs.blocking_sends;
  exec_costs.compute = [&costs, barriers = program.vocab_barriers](const Action& a) {
    return ComputeCost(costs, a, barriers);
  };
  exec_costs.tail = [&costs, &tie_root](int rank, const Action& a) {
    return TailCost(costs, tie_root, rank, a);
  };
  exec_costs.vocab_collective = [&costs](int, const Action&) { return costs.vocab.collective; };
  exec_costs.async_vocab_collectives = costs.vocab.asynchronous;
  exec_costs.participants = [&costs, &tie_root, p, has_tied, has_step](int rank, const Action& a) {
    std::vector<int> group;
    for (int q = 0; q < p; ++q) {
      bool joins = q == rank;
      if (a.type == ActionType::kReduceTiedGrads) {
        joins |= tie_root[rank] >= 0 && tie_root[q] == tie_root[rank] && has_tied[q];
      } else if (a.type == ActionType::kOptimizerStep) {
        joins |= costs.step_all_reduce && has_step[q];
      }
      if (joins) group.push_back(q);
    }
    return group;
  };
  exec_costs.send = [&costs](int rank, const Action&) {
    return RankCost(costs, rank, &RankCosts::send, costs.send);
  };
  exec_costs.recv = [&costs](int rank, const Action&) {
    return RankCost(costs, rank, &RankCosts::recv, costs.recv);
  };
  return exec_costs;
}

// The timeline (when `with_timeline`), busy/idle, in-flight micro-batches and
// activation memory of an execution of `program` (memory in units of one F's
// activations, of which I frees `input_frees` and W the rest).
SimulationResult Summarize(const LoweredProgram& program, const internal_schedule::Execution& ex,
                           const internal_schedule::ExecutionCosts& exec_costs, double input_frees,
                           bool with_timeline) {
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
      if (IsTail(action.type)) {
        if (with_timeline && ex.end[r][i] > ex.start[r][i]) {
          result.timeline.push_back({r, ActionToString(action), ex.start[r][i], ex.end[r][i]});
        }
        continue;
      }
      if (!IsCompute(action.type)) {
        if (with_timeline) {
          result.timeline.push_back({r, ActionToString(action), ex.start[r][i], ex.end[r][i]});
          if (!ex.completed.empty() && ex.completed[r][i] >= 0) {
            result.in_flight.push_back(
                InFlightEvent(r, ActionToString(action), ex.start[r][i], ex.completed[r][i]));
          }
        }
        if (IsVocabCompute(action.type)) {
          result.busy[r] += ex.end[r][i] - ex.start[r][i];
          if (first_start < 0) first_start = ex.start[r][i];
          last_end = std::max(last_end, ex.end[r][i]);
        }
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
        if (with_timeline) {
          result.timeline.push_back(
              {r, ActionToString(a), t, end,
               action.type == ActionType::kOverlapFB ? ActionToString(action) : std::string()});
        }
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

absl::StatusOr<SimulationResult> SimulateProgram(const LoweredProgram& program,
                                                 const SimulationCosts& costs, bool with_timeline) {
  PP_RETURN_IF_ERROR(CheckCosts(program, costs));
  const std::vector<int> tie_root = TieRoots(program, costs);
  const internal_schedule::ExecutionCosts exec_costs = MakeExecutionCosts(program, costs, tie_root);
  PP_ASSIGN_OR_RETURN(internal_schedule::Execution ex,
                      internal_schedule::Execute(program, exec_costs));
  return Summarize(program, ex, exec_costs, costs.memory.InputFraction(), with_timeline);
}

absl::StatusOr<SimulationResult> SimulateAsExecuted(const Schedule& schedule,
                                                    const SimulationCosts& costs,
                                                    bool defer_receives, bool with_timeline) {
  PP_ASSIGN_OR_RETURN(LoweredProgram program, Lower(schedule, LoweringFor(costs)));
  return SimulateProgram(defer_receives ? DeferReceives(program) : program, costs, with_timeline);
}

}  // namespace

absl::StatusOr<SimulationResult> SimulateProgram(const LoweredProgram& program,
                                                 const SimulationCosts& costs) {
  return SimulateProgram(program, costs, /*with_timeline=*/true);
}

LoweringOptions LoweringFor(const SimulationCosts& costs) {
  LoweringOptions options;
  options.vocab_async_collectives = costs.vocab.asynchronous;
  return options;
}

absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule, const SimulationCosts& costs) {
  PP_ASSIGN_OR_RETURN(LoweredProgram program, Lower(schedule, LoweringFor(costs)));
  return SimulateProgram(program, costs);
}

absl::StatusOr<SimulationResult> SimulateAsExecuted(const Schedule& schedule,
                                                    const SimulationCosts& costs,
                                                    bool defer_receives) {
  return SimulateAsExecuted(schedule, costs, defer_receives, /*with_timeline=*/true);
}

absl::StatusOr<SimulationResult> SimulateFiguresAsExecuted(const Schedule& schedule,
                                                           const SimulationCosts& costs,
                                                           bool defer_receives) {
  return SimulateAsExecuted(schedule, costs, defer_receives, /*with_timeline=*/false);
}

}  // namespace pp
