#include "driver/memory_budget.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <string>

#include <glog/logging.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "models/registry.h"
#include "pipeline/auto_schedule/auto_options.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/schedule/ir/vocab_passes.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {

using driver::ExperimentConfig;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kFp32 = 4;
// Compute actions of a schedule this big are not built for a prediction.
constexpr double kMaxPlannedActions = 1 << 22;
// What a split backward's I leaves for its W, in the stage's activations:
// measured on ZB-H1's last rank, which holds two Ws back at its peak
// (bench/memory_planner.py).
constexpr double kSplitPendingFactor = 1.7;

double Clamp1(double x) { return std::max(1.0, x); }

double MaxPeak(const MemoryPlan& plan) {
  double peak = 0;
  for (const RankMemoryPlan& r : plan.ranks) peak = std::max(peak, r.peak_bytes);
  return peak;
}

// The largest rank's predicted peak of `config` under `schedule`; nullopt
// when it cannot be planned.
std::optional<double> PlannedPeak(const ExperimentConfig& config, const Schedule& schedule) {
  absl::StatusOr<std::optional<MemoryPlan>> plan = PlanRunMemory(config, schedule);
  if (!plan.ok() || !plan->has_value()) return std::nullopt;
  return MaxPeak(**plan);
}

std::string Mib(double bytes) { return absl::StrFormat("%.1f MiB", bytes / kMiB); }

std::string TermsText(const RankMemoryPlan& rank) {
  std::vector<std::string> parts;
  for (const auto& [name, bytes] : rank.Terms())
    parts.push_back(absl::StrCat(name, " ", Mib(bytes)));
  return absl::StrJoin(parts, " + ");
}

// What fits under `cap_bytes` instead of `config`, one "try ..." per line.
std::vector<std::string> WhatWouldFit(const ExperimentConfig& config, const Schedule& schedule,
                                      double cap_bytes, int worst_rank) {
  std::vector<std::string> fits;
  const auto& par = config.parallelism();
  for (const std::string& name : RegisteredScheduleNames()) {
    if (name == schedule.name || name == "inference" || absl::StartsWith(name, "synth")) continue;
    absl::StatusOr<Schedule> other =
        MakeSchedule(name, {par.pp(), par.num_microbatches(), par.chunks(), 0});
    if (!other.ok() || other->forward_only) continue;
    // Under vocabulary parallelism: a schedule with its own passes as it is
    // (when config validation would take it: of the form asked for), any
    // other with the passes the Trainer places; without it, none with passes.
    if (other->vocab_parallel) {
      if (!par.vocab_parallel() ||
          (par.vocab_barriers() != 0 && other->vocab_barriers != par.vocab_barriers())) {
        continue;
      }
    } else if (par.vocab_parallel()) {
      other = AddVocabularyPasses(*other, PlacedVocabBarriers(par.vocab_barriers()));
      if (!other.ok()) continue;
    }
    const std::optional<double> peak = PlannedPeak(config, *other);
    if (peak.has_value() && *peak <= cap_bytes) {
      fits.push_back(absl::StrCat("schedule '", name, "' (fewer micro-batches in flight; peak ",
                                  Mib(*peak), ")"));
    }
  }
  const auto& ac = par.activation_checkpointing();
  if (ac.interval() != 1 || !ac.checkpointable_types().empty()) {
    ExperimentConfig recompute = config;
    auto* rac = recompute.mutable_parallelism()->mutable_activation_checkpointing();
    rac->set_interval(1);
    rac->clear_checkpointable_types();
    const std::optional<double> peak = PlannedPeak(recompute, schedule);
    if (peak.has_value() && *peak <= cap_bytes) {
      fits.push_back(
          absl::StrCat("activation checkpointing of every layer "
                       "(parallelism.activation_checkpointing.interval=1; "
                       "peak ",
                       Mib(*peak), ")"));
    }
  }
  for (int b = par.micro_batch_size() - 1; b >= 1; --b) {
    ExperimentConfig smaller = config;
    smaller.mutable_parallelism()->set_micro_batch_size(b);
    const std::optional<double> peak = PlannedPeak(smaller, schedule);
    if (peak.has_value() && *peak <= cap_bytes) {
      fits.push_back(absl::StrCat("micro_batch_size=", b, " (peak ", Mib(*peak), ")"));
      break;
    }
  }
  if (par.dp() > 1 && !par.distributed_optimizer()) {
    ExperimentConfig sharded = config;
    sharded.mutable_parallelism()->set_distributed_optimizer(true);
    const std::optional<double> peak = PlannedPeak(sharded, schedule);
    if (peak.has_value() && *peak <= cap_bytes) {
      fits.push_back(absl::StrCat(
          "the distributed optimizer (parallelism.distributed_optimizer=true: optimizer state "
          "split over the ",
          par.dp(), " data-parallel ranks; peak ", Mib(*peak), ")"));
    }
  }
  fits.push_back(absl::StrCat("a partition with fewer layers on rank ", worst_rank,
                              " (partition_method \"profile:cap_mib=", par.memory_cap_mib(),
                              "\" balances time under a per-stage cap)"));
  return fits;
}

}  // namespace

absl::StatusOr<Schedule> PlannedSchedule(const ExperimentConfig& config) {
  const auto& par = config.parallelism();
  const double actions =
      2.0 * std::max(1, par.pp()) * std::max(1, par.chunks()) * std::max(1, par.num_microbatches());
  if (actions > kMaxPlannedActions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the schedule has ", actions, " compute actions, too many to plan"));
  }
  PP_ASSIGN_OR_RETURN(const std::string name, StartingSchedule(par.schedule(), par.chunks()));
  PP_ASSIGN_OR_RETURN(Schedule schedule,
                      MakeSchedule(name, {par.pp(), par.num_microbatches(), par.chunks(), 0}));
  // The Trainer places the vocabulary passes into a schedule without them.
  if (par.vocab_parallel() && !schedule.vocab_parallel) {
    return AddVocabularyPasses(schedule, PlacedVocabBarriers(par.vocab_barriers()));
  }
  return schedule;
}

std::optional<ModelMemory> ModelMemoryOf(const ExperimentConfig& config) {
  absl::StatusOr<SelectedModel> model = SelectModel(config.model());
  if (!model.ok() || !model->info->memory) return std::nullopt;
  return model->info->memory(*model->config);
}

double CheckpointableLayerCount(const ExperimentConfig& config) {
  const std::string& types = config.parallelism().activation_checkpointing().checkpointable_types();
  absl::StatusOr<SelectedModel> model = SelectModel(config.model());
  if (!model.ok()) return 0;
  absl::StatusOr<std::vector<LayerSpec>> specs = model->info->specs(*model->config);
  if (!specs.ok()) return 0;
  if (types.empty()) return static_cast<double>(specs->size());
  std::regex re;
  try {
    re = std::regex(types, std::regex::ECMAScript);
  } catch (const std::regex_error&) {
    return 0;
  }
  double matched = 0;
  for (const LayerSpec& spec : *specs) matched += std::regex_match(spec.name(), re) ? 1 : 0;
  return matched;
}

std::optional<RunMemoryInputs> RunMemoryInputsOf(const ExperimentConfig& config,
                                                 int num_virtual_stages) {
  const std::optional<ModelMemory> model = ModelMemoryOf(config);
  if (!model.has_value() || num_virtual_stages < 1) return std::nullopt;
  const auto& par = config.parallelism();
  const bool bf16 = config.precision() == "bf16";
  const double value_bytes = bf16 ? 2 : kFp32;
  const double b = Clamp1(par.micro_batch_size());
  const double t = Clamp1(model->context_length), w = Clamp1(model->width);
  const double vocab = Clamp1(static_cast<double>(model->vocab_size));
  const int64_t layers = std::max<int64_t>(1, model->num_blocks);
  // One rank of a tensor-parallel model group: the vocabulary split (padded
  // to a multiple of tp), and under sequence parallelism the residual
  // stream, the stage's messages and the embedding's output split along the
  // sequence.
  const int tp = std::max(1, par.tp());
  const bool sp = tp > 1 && par.sequence_parallel();
  const double vocab_rank = std::ceil(vocab / tp);
  // Vocabulary parallelism: the tables leave the first and last stages, and
  // every pipe x tensor rank holds its rows of each (VocabMemory).
  const bool vocab_parallel = par.vocab_parallel();
  const double stream = b * t * w * value_bytes / (sp ? tp : 1);
  const double block_act = model->block_activation_bytes(
      {.micro_batch_size = b, .value_bytes = value_bytes, .tp = tp, .sequence_parallel = sp});
  const int64_t interval = par.activation_checkpointing().interval();
  const double checkpointed_share =
      interval > 0 ? std::min<double>(layers, CheckpointableLayerCount(config)) / layers : 0;

  RunMemoryInputs in;
  const int n = num_virtual_stages;
  in.stages.resize(n);
  for (int s = 0; s < n; ++s) {
    StageMemory& m = in.stages[s];
    const double stage_layers = layers / n + (s < layers % n ? 1 : 0);
    m.parameter_bytes = stage_layers * model->block_parameters(tp) * kFp32;
    const double recomputed = stage_layers * checkpointed_share;
    m.activation_bytes = (stage_layers - recomputed) * block_act;
    double full = stage_layers * block_act;  // every activation, none recomputed
    if (recomputed > 0) {
      // Each range keeps its input, and the stage its output for the
      // backward's roots; the first range's input is the stage's input,
      // which holds no bytes of its own (a receive buffer, counted in the
      // p2p buffers, the previous stage's output handed over on this rank,
      // or the embedding's output added below). One range is regenerated at
      // a time, and its backward holds the gradient of a block's MLP hidden
      // layer (mlp_ratio widths) beside it: measured, a checkpointed block's
      // B peaks 23 widths above what was live before it, 19 of them the
      // block's activations (bench/memory_planner.py, --v=1's action lines).
      // Without checkpointing that gradient is inside the calibrated 7.
      const double ranges = std::ceil(recomputed / interval);
      m.activation_bytes += (ranges + (s + 1 < n ? 1 : 0) - 1) * stream;
      m.recompute_bytes = std::min<double>(interval, std::ceil(recomputed)) * block_act +
                          model->recompute_widths * b * t * w * value_bytes / tp;
    }
    if (s == 0) {
      // Token (unless split over the pipe) and position embeddings; the
      // stage's input (the embedding's output, or the vocabulary passes' sum).
      m.parameter_bytes += ((vocab_parallel ? 0 : vocab_rank) + t) * w * kFp32;
      m.activation_bytes += stream;
      full += stream;
    }
    if (s == n - 1 && vocab_parallel) {
      // The final norm; its output goes to every rank's OUT_S.
      m.parameter_bytes += 2 * w * kFp32;
    } else if (s == n - 1) {
      // The final norm and the head: a copy of the tied embedding when it
      // is on another virtual stage, or a matrix of its own.
      const bool own_head = !model->tied_embeddings || n > 1;
      m.parameter_bytes += (2 * w + (own_head ? vocab_rank * w : 0)) * kFp32;
      // fp32 logits and their log-softmax, kept for the loss's backward
      // (this rank's vocabulary slice under tensor parallelism).
      m.activation_bytes += 2 * b * t * vocab_rank * kFp32;
      full += 2 * b * t * vocab_rank * kFp32;
    } else {
      m.boundary_bytes = stream;
    }
    // The first stage has no input gradients to compute: its I leaves the
    // whole backward, and F's activations, to W, which regenerates a
    // checkpointed range. Under vocabulary parallelism its input, the summed
    // embedding, has a gradient, which its I computes as any stage's I does,
    // leaving W as much (measured: GPT's pp 4 V-Half with the passes, stage
    // 0's I holds 1.68 times its F's bytes until W).
    const bool input_grads = s > 0 || vocab_parallel;
    m.weight_pending_bytes = input_grads ? kSplitPendingFactor * full : m.activation_bytes;
    m.backward_in_weight = !input_grads;
  }
  const std::string& opt = config.optimizer().name();
  in.options.optimizer = opt == "adamw"                      ? OptimizerKind::kAdamW
                         : config.optimizer().momentum() > 0 ? OptimizerKind::kSgdMomentum
                                                             : OptimizerKind::kSgd;
  in.options.fp32_master_weights = bf16;
  if (vocab_parallel) {
    // Rows per rank: split over pipe x tensor.
    const double rows = std::ceil(vocab / (std::max(1, par.pp()) * tp));
    in.options.vocab.parameter_bytes = (model->tied_embeddings ? 1 : 2) * rows * w * kFp32;
    // OUT_S keeps, until OUT_T, its logits' exps (fp32), the head's input
    // and three statistics per token.
    in.options.vocab.pending_bytes = b * t * (rows * kFp32 + w * value_bytes + 3 * kFp32);
    // One barrier: OUT_S's partial hidden-state gradient (fp32) until
    // OUT_REDUCE (the planner counts it for one-barrier schedules only),
    // which asynchronous collectives lower as late as OUT_T.
    in.options.vocab.partial_bytes = b * t * w * kFp32;
    in.options.vocab.async_collectives = par.vocab_async_collectives();
    // What each pass allocates and frees (pipeline/tensor_parallel/
    // vocab_passes.cc), the tables in the module's dtype: OUT_S the logits
    // (under bf16 also their fp32 copy, and the rows in fp32 for the
    // partial); OUT_T d loss / d logits in fp32 (under bf16 also rounded),
    // the rows' gradient before VocabularyLayers adds it to theirs (at most
    // fp32) and the hidden states' (fp32); IN_B the rows' gradient,
    // accumulated in fp32 (under bf16 also rounded), and the output
    // gradient's rows in fp32. Measured at pp 2 (LLaMA, vocabulary 32768,
    // width 256, 128 tokens): OUT_S +8.0 MiB beside its exps, OUT_T +24.0 MiB
    // (bench/vocab_parallel.sh's runs, --v=1's action lines).
    const double tokens = b * t;
    const double rounded = bf16 ? value_bytes : 0;  // a second copy in the module's dtype
    in.options.vocab.output_s_workspace_bytes =
        tokens * rows * (value_bytes + (bf16 ? kFp32 : 0)) + (bf16 ? rows * w * kFp32 : 0);
    in.options.vocab.output_t_workspace_bytes =
        tokens * rows * (kFp32 + rounded) + rows * w * kFp32 + tokens * w * kFp32;
    in.options.vocab.input_b_workspace_bytes = rows * w * (kFp32 + rounded) + tokens * w * kFp32;
  }
  // MultiTensorAdamW's denominators, sqrt(v) + eps for every parameter at
  // once (pipeline/runtime/multi_tensor_adamw.cc): a rank whose parameters
  // outweigh its activations, as a vocabulary shard's does, peaks in the
  // step (measured, the same LLaMA's pp 2 1f1b_vocab1 last rank: STEP +42.6
  // MiB over its 42.6 MiB of parameters). SGD's per-parameter temporaries
  // are not counted.
  if (in.options.optimizer == OptimizerKind::kAdamW) in.options.step_temporary_factor = 1;
  if (config.parallelism().distributed_optimizer()) {
    in.options.distributed_optimizer_dp = std::max(1, config.parallelism().dp());
  }
  // A split backward (pipeline/autograd/split_backward.h): I keeps the
  // graph's saved tensors and the output gradients for W, about 1.7 times
  // the stage's activations (regenerated first under checkpointing); F's own
  // share goes with I.
  in.options.split = MemorySplit{1, 0};
  return in;
}

absl::StatusOr<std::optional<MemoryPlan>> PlanRunMemory(const ExperimentConfig& config,
                                                        const Schedule& schedule) {
  std::optional<RunMemoryInputs> in = RunMemoryInputsOf(config, schedule.num_virtual_stages());
  if (!in.has_value()) return std::optional<MemoryPlan>();
  PP_ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(schedule, in->stages, in->options));
  return std::optional<MemoryPlan>(std::move(plan));
}

absl::Status CheckMemoryCap(const ExperimentConfig& config) {
  const auto& par = config.parallelism();
  const double cap_mib = par.memory_cap_mib();
  if (!std::isfinite(cap_mib) || cap_mib < 0) {
    return absl::InvalidArgumentError(absl::StrCat("parallelism.memory_cap_mib is ", cap_mib,
                                                   "; give a size in MiB per rank, or 0 for none"));
  }
  if (cap_mib == 0) return absl::OkStatus();
  absl::StatusOr<Schedule> schedule = PlannedSchedule(config);
  if (!schedule.ok()) {
    // Config validation names a schedule that does not build; a huge one is
    // only warned about.
    LOG(WARNING) << "parallelism.memory_cap_mib: the run's memory is not predicted: "
                 << schedule.status().message();
    return absl::OkStatus();
  }
  PP_ASSIGN_OR_RETURN(const std::optional<MemoryPlan> plan, PlanRunMemory(config, *schedule));
  if (!plan.has_value()) {
    LOG(WARNING) << "parallelism.memory_cap_mib=" << cap_mib
                 << ": this model gives no memory arithmetic (ModelInfo::memory, "
                    "models/registry.h), so its memory "
                    "is not predicted and the cap is not checked";
    return absl::OkStatus();
  }
  const double cap = cap_mib * kMiB;
  int worst = -1;
  for (size_t r = 0; r < plan->ranks.size(); ++r) {
    if (plan->ranks[r].peak_bytes > cap &&
        (worst < 0 || plan->ranks[r].peak_bytes > plan->ranks[worst].peak_bytes)) {
      worst = static_cast<int>(r);
    }
  }
  if (worst < 0) return absl::OkStatus();
  const RankMemoryPlan& rank = plan->ranks[worst];
  std::string message = absl::StrCat("parallelism.memory_cap_mib=", cap_mib, ": pipeline rank ",
                                     worst, " is predicted to peak at ", Mib(rank.peak_bytes),
                                     " under schedule '", schedule->name, "' (", TermsText(rank),
                                     "), ", Mib(rank.peak_bytes - cap), " over the cap");
  if (par.schedule() == kAutoSchedule) {
    absl::StrAppend(&message, " (\"auto\" measures under '", schedule->name,
                    "' first, so that one must fit)");
  }
  absl::StrAppend(&message, ". Would fit: ",
                  absl::StrJoin(WhatWouldFit(config, *schedule, cap, worst), "; or "));
  return absl::InvalidArgumentError(message);
}

absl::StatusOr<bool> FitsMemoryCap(const ExperimentConfig& config, const Schedule& schedule) {
  const double cap_mib = config.parallelism().memory_cap_mib();
  if (cap_mib <= 0) return true;
  PP_ASSIGN_OR_RETURN(const std::optional<MemoryPlan> plan, PlanRunMemory(config, schedule));
  if (!plan.has_value()) return true;
  for (const RankMemoryPlan& rank : plan->ranks) {
    if (rank.peak_bytes > cap_mib * kMiB) return false;
  }
  return true;
}

absl::StatusOr<std::optional<double>> SynthesisMemoryCap(const ExperimentConfig& config) {
  const double cap_mib = config.parallelism().memory_cap_mib();
  if (!(cap_mib > 0)) return std::optional<double>();
  PP_ASSIGN_OR_RETURN(const Schedule schedule, PlannedSchedule(config));
  std::optional<RunMemoryInputs> in = RunMemoryInputsOf(config, schedule.num_virtual_stages());
  if (!in.has_value()) return std::optional<double>();
  PP_ASSIGN_OR_RETURN(const MemoryPlan plan, PlanMemory(schedule, in->stages, in->options));
  double unit = 0, recompute = 0;
  for (const StageMemory& s : in->stages) {
    unit = std::max(unit, s.activation_bytes);
    recompute = std::max(recompute, s.recompute_bytes);
  }
  if (unit <= 0) return std::optional<double>();
  const double cap = cap_mib * kMiB;
  double units = -1;
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const RankMemoryPlan& p = plan.ranks[r];
    const double fixed =
        p.parameters + p.master_weights + p.gradients + p.optimizer_state + p.p2p_buffers;
    const double room = (cap - fixed - recompute) / unit;
    if (room < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parallelism.memory_cap_mib=", cap_mib, ": pipeline rank ", r, " needs ", Mib(fixed),
          " for its parameters, gradients, optimizer state and p2p buffers, leaving room for ",
          absl::StrFormat("%.2f", std::max(0.0, room)), " micro-batch activations of a stage (",
          Mib(unit),
          " each); a schedule needs at least 1. Raise the cap, or use more stages or a smaller "
          "micro_batch_size"));
    }
    units = units < 0 ? room : std::min(units, room);
  }
  return std::optional<double>(units);
}

}  // namespace pp
