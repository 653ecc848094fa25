#include "pipeline/schedule/analysis/memory_plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace pp {

absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "sgd") return OptimizerKind::kSgd;
  if (lower == "momentum") return OptimizerKind::kSgdMomentum;
  if (lower == "adamw") return OptimizerKind::kAdamW;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", text, "'; valid: sgd, momentum, adamw"));
}

double OptimizerStateFactor(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kSgdMomentum:
      return 1;
    case OptimizerKind::kAdamW:
      return 2;
  }
  return 0;
}

std::vector<std::pair<std::string, double>> RankMemoryPlan::Terms() const {
  std::vector<std::pair<std::string, double>> terms = {
      {"activations", activations},
      {"parameters", parameters},
      {"master weights", master_weights},
      {"gradients", gradients},
      {"optimizer state", optimizer_state},
      {"p2p buffers", p2p_buffers},
      {"recompute", recompute},
      {"sent messages", sent_messages},
      {"reduce buffers", reduce_buffers},
      {"vocabulary passes", vocab_pending},
      {"vocabulary pass temporaries", vocab_workspace},
      {"optimizer step", step_temporaries}};
  terms.erase(
      std::remove_if(terms.begin(), terms.end(), [](const auto& t) { return t.second <= 0; }),
      terms.end());
  std::stable_sort(terms.begin(), terms.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return terms;
}

namespace {

// PlanMemory's steps: check the inputs, then per rank the bytes held all step
// and the activation peak along its action list.

absl::Status CheckMemoryInputs(const Schedule& schedule, const std::vector<StageMemory>& stages,
                               const MemoryPlanOptions& options) {
  const int num_virtual = schedule.num_virtual_stages();
  if (static_cast<int>(stages.size()) != num_virtual) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory plan: ", stages.size(), " stage byte costs for schedule '",
                     schedule.name, "' with ", num_virtual, " virtual stages; give one per stage"));
  }
  for (int s = 0; s < num_virtual; ++s) {
    const StageMemory& m = stages[s];
    for (const auto& [name, value] :
         {std::pair<const char*, double>{"parameter_bytes", m.parameter_bytes},
          {"activation_bytes", m.activation_bytes},
          {"recompute_bytes", m.recompute_bytes},
          {"boundary_bytes", m.boundary_bytes},
          {"weight_pending_bytes", m.weight_pending_bytes}}) {
      if (!std::isfinite(value) || value < 0) {
        return absl::InvalidArgumentError(absl::StrCat("memory plan: stage ", s, " ", name, " is ",
                                                       value, "; must be finite and >= 0"));
      }
    }
  }
  if (options.split.input < 0 || options.split.weight < 0 ||
      options.split.input + options.split.weight <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("memory split I:", options.split.input,
                                                   ",W:", options.split.weight,
                                                   " must be >= 0 and not both 0"));
  }
  for (const auto& [name, value] :
       {std::pair<const char*, double>{"vocab.parameter_bytes", options.vocab.parameter_bytes},
        {"vocab.pending_bytes", options.vocab.pending_bytes},
        {"vocab.partial_bytes", options.vocab.partial_bytes},
        {"vocab.output_s_workspace_bytes", options.vocab.output_s_workspace_bytes},
        {"vocab.output_t_workspace_bytes", options.vocab.output_t_workspace_bytes},
        {"vocab.input_b_workspace_bytes", options.vocab.input_b_workspace_bytes}}) {
    if (!std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("memory plan: ", name, " is ", value, "; must be finite and >= 0"));
    }
    if (value > 0 && !schedule.vocab_parallel) {
      return absl::InvalidArgumentError(absl::StrCat("memory plan: ", name, " given for schedule '",
                                                     schedule.name,
                                                     "', which has no vocabulary passes"));
    }
  }
  if (!std::isfinite(options.step_temporary_factor) || options.step_temporary_factor < 0) {
    return absl::InvalidArgumentError(absl::StrCat("memory plan: step_temporary_factor is ",
                                                   options.step_temporary_factor,
                                                   "; must be finite and >= 0"));
  }
  if (options.distributed_optimizer_dp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("memory plan: distributed_optimizer_dp (",
                                                   options.distributed_optimizer_dp,
                                                   ") must be >= 1 (1: no distributed optimizer)"));
  }
  if (static_cast<int>(schedule.stage_to_rank.size()) != num_virtual ||
      static_cast<int>(schedule.ranks.size()) != schedule.num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory plan: schedule '", schedule.name, "' has ",
                     schedule.stage_to_rank.size(), " placed stages and ", schedule.ranks.size(),
                     " rank lists for p = ", schedule.num_stages, ", v = ", schedule.num_chunks));
  }
  return absl::OkStatus();
}

// Whether virtual stage `stage` exists and is placed on a rank other than r
// (messages to and from it go through p2p).
bool OnOtherRank(const Schedule& schedule, int stage, int r) {
  return stage >= 0 && stage < schedule.num_virtual_stages() && schedule.stage_to_rank[stage] != r;
}

// Rank r's receive buffers: the runtime's pool (pipeline/runtime/p2p.h)
// keeps every buffer it ever handed out, so it holds the most received
// tensors the rank uses at once, all step. A received input lives from its
// F until the stage's backward ends with it (B, or W after a split); a
// received output gradient during B, or from I to W.
double ReceiveBufferPeak(const Schedule& schedule, const std::vector<StageMemory>& stages, int r) {
  const int num_virtual = schedule.num_virtual_stages();
  auto remote = [&](int stage) { return OnOtherRank(schedule, stage, r); };
  double in_use = 0, peak = 0;
  for (const auto& entry : schedule.ranks[r]) {
    for (const Action& a : Leaves(entry)) {
      if (!IsCompute(a.type) || a.stage < 0 || a.stage >= num_virtual) continue;
      const double input = remote(a.stage - 1) ? stages[a.stage - 1].boundary_bytes : 0;
      const double grad = remote(a.stage + 1) ? stages[a.stage].boundary_bytes : 0;
      switch (a.type) {
        case ActionType::kForward:
          in_use += input;
          if (schedule.forward_only) {  // recycled as soon as F is done
            peak = std::max(peak, in_use);
            in_use -= input;
          }
          break;
        case ActionType::kBackward:
          peak = std::max(peak, in_use + grad);
          in_use -= input;
          break;
        case ActionType::kBackwardInput:
          in_use += grad;
          break;
        case ActionType::kBackwardWeight:
          in_use -= input + grad;
          break;
        default:
          break;
      }
      peak = std::max(peak, in_use);
    }
  }
  return peak;
}

// Rank r's bytes held all step: parameters (and fp32 masters), gradients and
// optimizer state of its stages, and its p2p buffers.
void PlanFixedBytes(const Schedule& schedule, const std::vector<StageMemory>& stages,
                    const MemoryPlanOptions& options, int r, RankMemoryPlan& out) {
  const int num_virtual = schedule.num_virtual_stages();
  for (int s = 0; s < num_virtual; ++s) {
    if (schedule.stage_to_rank[s] != r) continue;
    out.parameters += stages[s].parameter_bytes;
  }
  out.parameters += options.vocab.parameter_bytes;  // every rank's rows (0 without)
  out.p2p_buffers = ReceiveBufferPeak(schedule, stages, r);
  if (!schedule.forward_only) {
    out.gradients = out.parameters;
    out.optimizer_state = OptimizerStateFactor(options.optimizer) * out.parameters;
    if (options.fp32_master_weights) {
      out.master_weights = out.parameters;
      out.gradients = 1.5 * out.parameters;
    }
    // The distributed optimizer keeps 1/dp of both (fp32 training: the
    // slice's masters are the parameters themselves, no copy).
    out.optimizer_state /= options.distributed_optimizer_dp;
    out.master_weights /= options.distributed_optimizer_dp;
  }
  if (options.fp32_master_weights) out.parameters /= 2;
}

// Walks rank r's actions, holding each forward's activations until its
// backward frees them (I a part, W the rest; a split backward's pending bytes
// live from I to W), and records the first step of the highest total.
// REQUIRES: PlanFixedBytes filled `out`.
// `tail_bytes`: held in the step's tail after every backward (the
// distributed optimizer's buffers), beside the messages still unsent;
// `step_bytes`: the optimizer step's temporaries, once the sends are waited
// for.
absl::Status PlanActivationPeak(const Schedule& schedule, const std::vector<StageMemory>& stages,
                                const VocabMemory& vocab, double input_frees, double tail_bytes,
                                double step_bytes, int r, RankMemoryPlan& out) {
  const int num_virtual = schedule.num_virtual_stages();
  const double fixed =
      out.parameters + out.master_weights + out.gradients + out.optimizer_state + out.p2p_buffers;
  out.peak_bytes = fixed;
  double held = 0;
  // Messages this rank sent to another rank, kept until the step's tail.
  double sent = 0;
  double vocab_held = 0;  // OUT_S results waiting for their OUT_T (and OUT_REDUCE)
  // One barrier: OUT_S's partial gradient, until OUT_REDUCE where the list
  // has it.
  const bool one_barrier = schedule.vocab_barriers == 1 && !schedule.forward_only;
  const double partial = one_barrier ? vocab.partial_bytes : 0.0;
  const bool lists_reduce =
      std::any_of(schedule.ranks[r].begin(), schedule.ranks[r].end(),
                  [](const Action& a) { return a.type == ActionType::kVocabOutputReduce; });
  // `workspace`: a vocabulary pass's temporaries, live while it runs.
  auto consider = [&](double activations, double recompute, int step, double workspace = 0) {
    const double total = fixed + activations + recompute + sent + vocab_held + workspace;
    if (total > out.peak_bytes || out.peak_step < 0) {
      out.peak_bytes = total;
      out.activations = activations;
      out.recompute = recompute;
      out.sent_messages = sent;
      out.vocab_pending = vocab_held;
      out.vocab_workspace = workspace;
      out.peak_step = step;
    }
  };
  auto remote = [&](int stage) { return OnOtherRank(schedule, stage, r); };
  // A backward (B or I) of `stage` ends its F's output's stash entry, but a
  // sent output stays with its send; and it sends the input gradient.
  auto backward_sends = [&](int stage) {
    if (remote(stage + 1)) sent += stages[stage].boundary_bytes;
    if (remote(stage - 1)) sent += stages[stage - 1].boundary_bytes;
  };
  for (int i = 0; i < static_cast<int>(schedule.ranks[r].size()); ++i) {
    for (const Action& a : Leaves(schedule.ranks[r][i])) {
      if (a.type == ActionType::kVocabOutputS) {
        vocab_held += vocab.pending_bytes + partial;
        consider(held, 0, i, vocab.output_s_workspace_bytes);
        if (schedule.forward_only) vocab_held -= vocab.pending_bytes;  // no OUT_T
        if (!lists_reduce && !vocab.async_collectives) vocab_held -= partial;
        continue;
      }
      if (a.type == ActionType::kVocabOutputReduce) {
        vocab_held -= partial;
        continue;
      }
      if (a.type == ActionType::kVocabOutputT) {
        // Lowered for asynchronous collectives, OUT_REDUCE comes by OUT_T
        // at the latest: its partial counts until then.
        if (!lists_reduce && vocab.async_collectives) vocab_held -= partial;
        consider(held, 0, i, vocab.output_t_workspace_bytes);  // its OUT_S result still held
        vocab_held -= vocab.pending_bytes;
        continue;
      }
      if (a.type == ActionType::kVocabInputB) {
        consider(held, 0, i, vocab.input_b_workspace_bytes);
        continue;
      }
      // A lowered program's sends, receives, collectives and tail
      // (REDUCE_TIED names no stage) hold nothing the plan counts.
      if (!IsCompute(a.type)) continue;
      if (a.stage < 0 || a.stage >= num_virtual) {
        return absl::InvalidArgumentError(absl::StrCat("memory plan: rank ", r, " step ", i, " (",
                                                       ActionToString(a), ") names stage ", a.stage,
                                                       "; valid: [0, ", num_virtual, ")"));
      }
      const StageMemory& m = stages[a.stage];
      switch (a.type) {
        case ActionType::kForward:
          if (schedule.forward_only) {
            consider(m.activation_bytes, 0, i);  // freed as it goes
            if (remote(a.stage + 1)) sent += m.boundary_bytes;
          } else {
            held += m.activation_bytes;
            consider(held, 0, i);
          }
          break;
        case ActionType::kBackward:
          consider(held, m.recompute_bytes, i);
          held -= m.activation_bytes;
          backward_sends(a.stage);
          break;
        case ActionType::kBackwardInput:
          consider(held, m.backward_in_weight ? 0 : m.recompute_bytes, i);
          held += m.weight_pending_bytes - input_frees * m.activation_bytes;
          backward_sends(a.stage);
          consider(held, 0, i);
          break;
        case ActionType::kBackwardWeight:
          if (m.backward_in_weight) consider(held, m.recompute_bytes, i);
          held -= (1 - input_frees) * m.activation_bytes + m.weight_pending_bytes;
          break;
        default:
          break;
      }
    }
  }
  // The step's tail: every activation and OUT_S result freed.
  auto consider_tail = [&](double total, double messages, double reduce, double temporaries) {
    if (total <= out.peak_bytes) return;
    out.peak_bytes = total;
    out.activations = 0;
    out.recompute = 0;
    out.sent_messages = messages;
    out.vocab_pending = 0;
    out.vocab_workspace = 0;
    out.reduce_buffers = reduce;
    out.step_temporaries = temporaries;
    out.peak_step = static_cast<int>(schedule.ranks[r].size()) - 1;
  };
  if (tail_bytes > 0) consider_tail(fixed + tail_bytes + sent, sent, tail_bytes, 0);
  if (step_bytes > 0) consider_tail(fixed + step_bytes, 0, 0, step_bytes);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MemoryPlan> PlanMemory(const Schedule& schedule,
                                      const std::vector<StageMemory>& stages,
                                      const MemoryPlanOptions& options) {
  PP_RETURN_IF_ERROR(CheckMemoryInputs(schedule, stages, options));
  const double input_frees = options.split.InputFraction();
  MemoryPlan plan;
  plan.ranks.resize(schedule.num_stages);
  for (int r = 0; r < schedule.num_stages; ++r) {
    PlanFixedBytes(schedule, stages, options, r, plan.ranks[r]);
    // The distributed optimizer's tail: the rank's gradients flattened in
    // fp32 for the reduce-scatter, and its slice of the reduced ones.
    double fp32_parameters = options.vocab.parameter_bytes;
    for (int s = 0; s < schedule.num_virtual_stages(); ++s) {
      if (schedule.stage_to_rank[s] == r) fp32_parameters += stages[s].parameter_bytes;
    }
    double tail_bytes = 0, step_bytes = 0;
    if (!schedule.forward_only) {
      if (options.distributed_optimizer_dp > 1) {
        tail_bytes = fp32_parameters * (1.0 + 1.0 / options.distributed_optimizer_dp);
      }
      step_bytes =
          options.step_temporary_factor * fp32_parameters / options.distributed_optimizer_dp;
    }
    PP_RETURN_IF_ERROR(PlanActivationPeak(schedule, stages, options.vocab, input_frees, tail_bytes,
                                          step_bytes, r, plan.ranks[r]));
  }
  return plan;
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && std::abs(bytes) >= 1024) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f B", bytes) : absl::StrFormat("%.2f %s", bytes, units[u]);
}

std::string FormatMemoryPlan(const MemoryPlan& plan) {
  std::string out;
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const RankMemoryPlan& rank = plan.ranks[r];
    absl::StrAppend(&out, "rank ", r, ": peak ", FormatBytes(rank.peak_bytes));
    const auto terms = rank.Terms();
    for (size_t t = 0; t < terms.size(); ++t) {
      absl::StrAppend(&out, t == 0 ? " = " : " + ", terms[t].first, " ",
                      FormatBytes(terms[t].second));
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace pp
