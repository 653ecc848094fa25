#include "pipeline/auto_schedule/auto_schedule.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <utility>

#include <glog/logging.h>
#include <torch/torch.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "pipeline/schedule/formats/csv.h"
#include "pipeline/schedule/ir/vocab_passes.h"
#include "pipeline/schedule/schedules/registry.h"
#include "topology/wait_work.h"

namespace pp {
namespace {

namespace fs = std::filesystem;

// Slots per virtual stage in LocalCostSums: (sum, count) of F, B, I, W.
constexpr int kStageSlots = 8;
// Slots per pipeline rank: (SEND, count), (RECV, count).
constexpr int kRankSlots = 4;
// Vocabulary parallelism's slots, after the ranks': (sum, count) of OUT_S,
// OUT_T, IN_F and IN_B over every rank, then (each rank's smallest
// vocabulary collective, count).
constexpr int kVocabSlots = 10;

// OUT_S, OUT_T, IN_F and IN_B are the first four vocabulary types.
int VocabSlot(ActionType type) { return IsVocabCompute(type) ? VocabTypeIndex(type) : -1; }

int CostVectorSize(int num_stages, int num_chunks) {
  return num_stages * num_chunks * kStageSlots + num_stages * kRankSlots + kVocabSlots;
}

int ComputeSlot(ActionType type) {
  switch (type) {
    case ActionType::kForward:
      return 0;
    case ActionType::kBackward:
      return 1;
    case ActionType::kBackwardInput:
      return 2;
    case ActionType::kBackwardWeight:
      return 3;
    default:
      return -1;
  }
}

bool IsSend(ActionType type) {
  return type == ActionType::kSendForward || type == ActionType::kSendBackward;
}
bool IsRecv(ActionType type) {
  return type == ActionType::kRecvForward || type == ActionType::kRecvBackward;
}

double Mean(const std::vector<double>& sums, int slot) {
  return sums[slot + 1] > 0 ? sums[slot] / sums[slot + 1] : 0.0;
}

}  // namespace

std::vector<double> LocalCostSums(const std::vector<std::vector<ActionTiming>>& timings,
                                  int num_stages, int num_chunks, int pipe_rank) {
  const int stages = num_stages * num_chunks;
  std::vector<double> sums(static_cast<size_t>(CostVectorSize(num_stages, num_chunks)), 0.0);
  const size_t vocab = static_cast<size_t>(stages * kStageSlots + num_stages * kRankSlots);
  std::vector<double> sends, recvs, vocab_collectives;
  for (const std::vector<ActionTiming>& step : timings) {
    for (const ActionTiming& t : step) {
      const double ms = static_cast<double>(t.end_us - t.start_us) / 1000.0;
      const int slot = ComputeSlot(t.action.type);
      if (slot >= 0 && t.action.stage >= 0 && t.action.stage < stages) {
        sums[t.action.stage * kStageSlots + 2 * slot] += ms;
        sums[t.action.stage * kStageSlots + 2 * slot + 1] += 1;
      } else if (IsSend(t.action.type)) {
        sends.push_back(ms);
      } else if (IsRecv(t.action.type)) {
        recvs.push_back(ms);
      } else if (const int v = VocabSlot(t.action.type); v >= 0) {
        sums[vocab + 2 * v] += ms;
        sums[vocab + 2 * v + 1] += 1;
      } else if (IsVocabCollective(t.action.type)) {
        // Started without waiting (asynchronous collectives): its cost is
        // its time in flight, to when it completed, not its start's span.
        const int64_t end = t.completed_us >= 0 ? t.completed_us : t.end_us;
        vocab_collectives.push_back(static_cast<double>(end - t.start_us) / 1000.0);
      }
    }
  }
  if (!vocab_collectives.empty()) {
    // As a RECV: the smallest is the collective's own cost; the waits in
    // the others are the simulator's to reproduce.
    sums[vocab + 8] = *std::min_element(vocab_collectives.begin(), vocab_collectives.end());
    sums[vocab + 9] = 1;
  }
  const size_t base = static_cast<size_t>(stages * kStageSlots + pipe_rank * kRankSlots);
  if (!sends.empty()) {
    std::nth_element(sends.begin(), sends.begin() + sends.size() / 2, sends.end());
    sums[base] = sends[sends.size() / 2];
    sums[base + 1] = 1;
  }
  if (!recvs.empty()) {
    // The smallest: a receive whose message was already there (its unpacking
    // cost); the waits in the others are the simulator's to reproduce.
    sums[base + 2] = *std::min_element(recvs.begin(), recvs.end());
    sums[base + 3] = 1;
  }
  return sums;
}

absl::StatusOr<SimulationCosts> CostsFromSums(const std::vector<double>& sums, int num_stages,
                                              int num_chunks) {
  const int stages = num_stages * num_chunks;
  if (sums.size() != static_cast<size_t>(CostVectorSize(num_stages, num_chunks))) {
    return absl::InvalidArgumentError(absl::StrCat("measured cost vector has ", sums.size(),
                                                   " entries, expected ",
                                                   CostVectorSize(num_stages, num_chunks)));
  }
  SimulationCosts costs;
  costs.comm = 0;
  double f_total = 0, i_total = 0, w_total = 0;
  for (int s = 0; s < stages; ++s) {
    const double f = Mean(sums, s * kStageSlots + 0);
    const double b = Mean(sums, s * kStageSlots + 2);
    double i = Mean(sums, s * kStageSlots + 4);
    double w = Mean(sums, s * kStageSlots + 6);
    if (f <= 0 || (b <= 0 && (i <= 0 || w <= 0))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "virtual stage ", s, " has no measured forward and backward (F ", f, " ms, B ", b,
          " ms, I ", i, " ms, W ", w, " ms): the measured steps were not traced on every rank"));
    }
    if (i <= 0 || w <= 0) {
      // Backward not split on this stage: its halves in the usual ratio.
      i = b / 2;
      w = b / 2;
    }
    StageCosts sc;
    sc.forward = f;
    sc.backward_input = i;
    sc.backward_weight = w;
    sc.backward = b > 0 ? b : i + w;
    costs.stage_costs[s] = sc;
    f_total += f;
    i_total += i;
    w_total += w;
  }
  costs.forward = f_total / stages;
  costs.backward_input = i_total / stages;
  costs.backward_weight = w_total / stages;
  costs.backward = costs.backward_input + costs.backward_weight;
  for (int r = 0; r < num_stages; ++r) {
    const int base = stages * kStageSlots + r * kRankSlots;
    RankCosts rc;
    if (sums[base + 1] > 0) rc.send = sums[base] / sums[base + 1];
    if (sums[base + 3] > 0) rc.recv = sums[base + 2] / sums[base + 3];
    if (rc.send || rc.recv) costs.rank_costs[r] = rc;
  }
  const int vocab = stages * kStageSlots + num_stages * kRankSlots;
  costs.vocab.output_s = Mean(sums, vocab + 0);
  costs.vocab.output_t = Mean(sums, vocab + 2);
  costs.vocab.input_f = Mean(sums, vocab + 4);
  costs.vocab.input_b = Mean(sums, vocab + 6);
  costs.vocab.collective = Mean(sums, vocab + 8);
  return costs;
}

absl::StatusOr<AutoScheduleChoice> ChooseAutoSchedule(
    const SimulationCosts& costs, int num_stages, int num_microbatches, int num_chunks,
    std::optional<double> memory_cap, bool defer_receives, const ScheduleFits& fits_bytes,
    bool vocabulary_passes, int vocabulary_barriers) {
  SynthesisOptions o;
  o.defer_receives = defer_receives;
  o.memory_cap = memory_cap;
  o.num_stages = num_stages;
  o.num_microbatches = num_microbatches;
  o.num_chunks = num_chunks;
  o.placement = num_chunks == 2 ? SynthesisPlacement::kV : SynthesisPlacement::kLooped;
  o.costs = costs;
  o.name = std::string(kAutoSchedule);
  AutoScheduleChoice choice;
  PP_ASSIGN_OR_RETURN(choice.synthesis, Synthesize(o));
  const SynthesisResult& syn = choice.synthesis;
  // Under vocabulary parallelism every candidate is simulated as it will
  // run: with the passes the Trainer adds (AddVocabularyPasses) and their
  // measured costs. The synthesiser orders the stages' actions only.
  auto as_run = [&](const Schedule& s) -> absl::StatusOr<SimulationResult> {
    if (!vocabulary_passes || s.vocab_parallel) return SimulateAsExecuted(s, costs, defer_receives);
    PP_ASSIGN_OR_RETURN(Schedule with_passes,
                        AddVocabularyPasses(s, PlacedVocabBarriers(vocabulary_barriers)));
    return SimulateAsExecuted(with_passes, costs, defer_receives);
  };
  double synthesis_makespan = syn.makespan;
  double synthesis_bubble = syn.simulation.bubble_fraction;
  if (vocabulary_passes) {
    PP_ASSIGN_OR_RETURN(const SimulationResult with_passes, as_run(syn.schedule));
    synthesis_makespan = with_passes.makespan;
    synthesis_bubble = with_passes.bubble_fraction;
  }
  auto peak = [](const SimulationResult& r) {
    return r.peak_memory.empty() ? 0.0
                                 : *std::max_element(r.peak_memory.begin(), r.peak_memory.end());
  };
  std::string& out = choice.comparison;
  absl::StrAppendFormat(&out, "%-18s %12s %8s %22s\n", "schedule", "step (ms)", "bubble",
                        "peak act. (x stage)");
  const bool synthesis_fits = !fits_bytes || fits_bytes(syn.schedule);
  absl::StrAppendFormat(&out, "%-18s %12.2f %7.1f%% %22.3g   lower bound %.2f ms%s%s\n", "auto",
                        synthesis_makespan, 100 * synthesis_bubble, syn.peak_memory,
                        syn.lower_bound, vocabulary_passes ? " (without the passes)" : "",
                        synthesis_fits ? "" : "   over the byte cap");
  std::optional<Schedule> best;
  std::string best_name;
  double best_makespan = 0;
  // Among registered schedules that tie, the one the run measures with wins:
  // staying on it costs no switch and no trial.
  absl::StatusOr<std::string> measurement = AutoMeasurementSchedule(num_chunks);
  for (const std::string& name : RegisteredScheduleNames()) {
    if (name == "inference" || absl::StartsWith(name, "synth")) continue;
    absl::StatusOr<Schedule> schedule =
        MakeSchedule(name, {num_stages, num_microbatches, num_chunks, 0});
    // Without vocabulary parallelism a schedule with passes cannot run; with
    // it, a registered one with passes (1f1b_vocab1, ...: the one-barrier
    // algorithm too) is a candidate as it is, unless the run asked for the
    // other form, the others with the passes the Trainer adds to the choice.
    if (!schedule.ok() || schedule->forward_only ||
        (schedule->vocab_parallel && !vocabulary_passes) ||
        (schedule->vocab_parallel && vocabulary_barriers != 0 &&
         schedule->vocab_barriers != vocabulary_barriers) ||
        schedule->stage_to_rank != syn.schedule.stage_to_rank) {
      continue;
    }
    absl::StatusOr<SimulationResult> sim = as_run(*schedule);
    if (!sim.ok()) continue;
    const double p = peak(*sim);
    const bool fits_units = p <= syn.memory_cap + 1e-9;
    const bool fits = fits_units && (!fits_bytes || fits_bytes(*schedule));
    absl::StrAppendFormat(&out, "%-18s %12.2f %7.1f%% %22.3g%s\n", name, sim->makespan,
                          100 * sim->bubble_fraction, p,
                          fits         ? ""
                          : fits_units ? "   over the byte cap"
                                       : "   over the cap");
    const bool faster = !best.has_value() || sim->makespan < best_makespan * (1 - 1e-9);
    const bool ties_measurement = !faster && measurement.ok() && name == *measurement &&
                                  sim->makespan <= best_makespan * (1 + 1e-9);
    if (fits && (faster || ties_measurement)) {
      best = *std::move(schedule);
      best_name = name;
      best_makespan = sim->makespan;
    }
  }
  absl::StrAppendFormat(&out, "memory cap %.3g (x stage: %s)\n", syn.memory_cap,
                        memory_cap.has_value() ? "parallelism.memory_cap_mib" : "1F1B's peak");
  // A synthesised order must beat the best registered one by more than the
  // simulator's error as executed (kAutoMinSimulatedGain): a smaller gain is
  // as likely a loss (small GPT, pp = 4: simulated 0.6-2.5% ahead of zb_h1,
  // measured 0.988x), and the two trial steps cannot tell either apart.
  if (!synthesis_fits && !best.has_value()) {
    // Nothing else fits the byte plan: the measurement schedule, which the
    // launcher checked against the cap, stays.
    if (!measurement.ok()) return measurement.status();
    PP_ASSIGN_OR_RETURN(choice.chosen,
                        MakeSchedule(*measurement, {num_stages, num_microbatches, num_chunks, 0}));
    choice.chosen_name = *measurement;
    absl::StrAppendFormat(&out, "chosen: %s (no other schedule fits the byte cap)\n", *measurement);
  } else if (!synthesis_fits) {
    choice.chosen = *std::move(best);
    choice.chosen_name = best_name;
    absl::StrAppendFormat(&out, "chosen: %s (the synthesised schedule is over the byte cap)\n",
                          best_name);
  } else if (best.has_value() &&
             synthesis_makespan >= best_makespan * (1 - kAutoMinSimulatedGain)) {
    choice.chosen = *std::move(best);
    choice.chosen_name = best_name;
    absl::StrAppendFormat(&out,
                          "chosen: %s (the synthesised schedule simulates no faster by more "
                          "than %.0f%%)\n",
                          best_name, 100 * kAutoMinSimulatedGain);
  } else {
    choice.chosen = syn.schedule;
    choice.chosen_name = std::string(kAutoSchedule);
    absl::StrAppendFormat(&out, "chosen: the synthesised schedule\n");
  }
  return choice;
}

namespace {

// `values` summed over the world group, in place (collective).
absl::Status WorldSum(const std::string& what, const ParallelGrid& grid, const Trainer& trainer,
                      std::vector<double>& values) {
  torch::Tensor t = torch::tensor(values, torch::kDouble).to(trainer.options().executor.p2p.device);
  std::vector<at::Tensor> one = {t};
  PP_RETURN_IF_ERROR(RunCollective(what, grid.DescribeWorldGroup(),
                                   trainer.options().executor.p2p.timeout,
                                   [&] { return grid.world_group()->allreduce(one); }));
  t = t.cpu();
  values.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  return absl::OkStatus();
}

}  // namespace

AutoScheduleRun::AutoScheduleRun(bool active, int num_stages, int num_microbatches, int num_chunks,
                                 std::string run_dir, std::string checkpoint_dir,
                                 std::optional<double> memory_cap, ScheduleFits fits_bytes)
    : active_(active),
      num_stages_(num_stages),
      num_microbatches_(num_microbatches),
      num_chunks_(num_chunks),
      run_dir_(std::move(run_dir)),
      checkpoint_dir_(std::move(checkpoint_dir)),
      memory_cap_(memory_cap),
      fits_bytes_(std::move(fits_bytes)) {}

absl::Status AutoScheduleRun::Start(Trainer& trainer, int64_t first_step) {
  if (!active_) return absl::OkStatus();
  if (first_step > 0 && ResumeSavedSchedule(trainer, first_step)) return absl::OkStatus();
  // Without given costs the first steps are measured (AfterStep).
  if (!fixed_costs_.has_value()) return absl::OkStatus();
  return ChooseAndSwitch(*fixed_costs_, "schedule auto: the given costs (parallelism.auto_costs)",
                         /*rank0=*/!run_dir_.empty(), /*trial=*/false, trainer);
}

bool AutoScheduleRun::ResumeSavedSchedule(Trainer& trainer, int64_t first_step) {
  const fs::path saved = fs::path(checkpoint_dir_) / std::string(kAutoScheduleFile);
  std::error_code ec;
  if (!fs::exists(saved, ec)) {
    LOG(WARNING) << "schedule auto: resuming at step " << first_step << " without " << saved
                 << "; choosing again";
    return false;
  }
  absl::StatusOr<Schedule> schedule = LoadCsvScheduleFile(saved.string());
  if (schedule.ok()) {
    schedule->name = std::string(kAutoSchedule);
    absl::Status replaced = trainer.ReplaceTrainSchedule(*schedule);
    if (replaced.ok()) {
      decided_ = true;
      LOG(INFO) << "schedule auto: resumed with the schedule saved in " << saved;
      if (!run_dir_.empty()) {
        std::cout << "schedule auto: resumed with the schedule saved in " << saved.string()
                  << std::endl;
      }
      return true;
    }
    schedule = replaced;
  }
  // Another shape (a resharding resume): chosen anew.
  LOG(WARNING) << "schedule auto: the saved " << saved << " does not fit this run ("
               << schedule.status().message() << "); choosing again";
  return false;
}

bool AutoScheduleRun::Measures(int64_t step) const {
  // Trial steps are traced too, so that both sides pay the same.
  return active_ && !decided_ && step >= kFirstMeasuredStep &&
         step < kFirstMeasuredStep + kMeasuredSteps + kTrialSteps;
}

absl::StatusOr<double> AutoScheduleRun::WorldMeanMs(const std::vector<double>& steps_ms,
                                                    const ParallelGrid& grid,
                                                    const Trainer& trainer) const {
  std::vector<double> local = {0};
  for (double ms : steps_ms) local[0] += ms / static_cast<double>(steps_ms.size());
  PP_RETURN_IF_ERROR(WorldSum("auto schedule step-time all-reduce", grid, trainer, local));
  return local[0] / grid.world_size();
}

absl::Status AutoScheduleRun::AfterStep(int64_t step, const ParallelGrid& grid, Trainer& trainer) {
  const auto now = std::chrono::steady_clock::now();
  const double step_ms =
      last_step_end_.has_value()
          ? std::chrono::duration<double, std::milli>(now - *last_step_end_).count()
          : 0;
  absl::Status status = Decide(step, step_ms, grid, trainer);
  last_step_end_ = std::chrono::steady_clock::now();
  return status;
}

absl::Status AutoScheduleRun::Decide(int64_t step, double step_ms, const ParallelGrid& grid,
                                     Trainer& trainer) {
  if (!Measures(step)) return absl::OkStatus();
  if (trying_) {
    trial_ms_.push_back(step_ms);
    if (static_cast<int64_t>(trial_ms_.size()) < kTrialSteps) return absl::OkStatus();
    return KeepOrRevert(grid, trainer);
  }
  measured_ms_.push_back(step_ms);
  measured_.push_back(trainer.last_step_timings());
  if (step != kFirstMeasuredStep + kMeasuredSteps - 1) return absl::OkStatus();
  std::vector<double> sums = LocalCostSums(measured_, num_stages_, num_chunks_, grid.stage_id());
  PP_RETURN_IF_ERROR(WorldSum("auto schedule cost all-reduce", grid, trainer, sums));
  PP_ASSIGN_OR_RETURN(SimulationCosts costs, CostsFromSums(sums, num_stages_, num_chunks_));
  // The measured costs are means over micro-batches; with a cost profile of
  // the indices, micro-batch j costs that mean times its share.
  if (microbatch_costs_) {
    std::vector<double> profile(static_cast<size_t>(num_microbatches_), 0.0);
    for (int64_t s = kFirstMeasuredStep; s < kFirstMeasuredStep + kMeasuredSteps; ++s) {
      const std::vector<double> c = microbatch_costs_(s);
      double mean = 0;
      for (double x : c) mean += x / static_cast<double>(c.size());
      for (size_t j = 0; j < profile.size() && j < c.size(); ++j) {
        profile[j] += mean > 0 ? c[j] / mean / kMeasuredSteps : 1.0 / kMeasuredSteps;
      }
    }
    costs.microbatch_multiplier = profile;
  }
  return ChooseAndSwitch(
      costs,
      absl::StrCat("schedule auto: measured ms per virtual stage (steps ", kFirstMeasuredStep + 1,
                   "-", kFirstMeasuredStep + kMeasuredSteps, ")"),
      grid.global_rank() == 0, /*trial=*/true, trainer);
}

absl::Status AutoScheduleRun::ChooseAndSwitch(const SimulationCosts& measured,
                                              const std::string& what_costs, bool rank0, bool trial,
                                              Trainer& trainer) {
  // The candidates are simulated with the vocabulary collectives the run
  // executes: blocking, or started and waited for where read.
  SimulationCosts costs = measured;
  costs.vocab.asynchronous =
      trainer.vocabulary() != nullptr && trainer.vocabulary_async_collectives();
  PP_ASSIGN_OR_RETURN(
      AutoScheduleChoice choice,
      ChooseAutoSchedule(costs, num_stages_, num_microbatches_, num_chunks_, memory_cap_,
                         trainer.defers_receives(), fits_bytes_, trainer.vocabulary() != nullptr,
                         trainer.vocabulary_barriers()));
  if (rank0) {
    std::string per_stage;
    for (const auto& [s, c] : costs.stage_costs) {
      absl::StrAppendFormat(&per_stage, " %d:F=%.2f,I=%.2f,W=%.2f", s, c.forward.value_or(0),
                            c.backward_input.value_or(0), c.backward_weight.value_or(0));
    }
    if (trainer.vocabulary() != nullptr) {
      absl::StrAppendFormat(&per_stage,
                            "\nschedule auto: vocabulary passes OUT_S=%.2f,OUT_T=%.2f,IN_F=%.2f,"
                            "IN_B=%.2f, their collectives %.2f",
                            costs.vocab.output_s, costs.vocab.output_t, costs.vocab.input_f,
                            costs.vocab.input_b, costs.vocab.collective);
    }
    if (!costs.microbatch_multiplier.empty()) {
      absl::StrAppend(&per_stage, "\nschedule auto: micro-batch cost profile (estimated, mean 1):");
      for (double x : costs.microbatch_multiplier) absl::StrAppendFormat(&per_stage, " %.2f", x);
    }
    const std::string text = absl::StrCat(what_costs, ":", per_stage,
                                          "\nsimulated with these costs:\n", choice.comparison);
    LOG(INFO) << text;
    std::cout << text << std::flush;
  }
  Schedule next = choice.chosen;
  next.name = std::string(kAutoSchedule);
  PP_ASSIGN_OR_RETURN(const std::string measurement, AutoMeasurementSchedule(num_chunks_));
  if (choice.chosen_name == measurement) {
    // Nothing to try: the run already trains on it. Saved all the same, so
    // that a resumed run reuses it instead of measuring again.
    decided_ = true;
    if (rank0) {
      const std::string text =
          absl::StrCat("schedule auto: the synthesised schedule simulates no faster than ",
                       measurement, " by more than ", 100 * kAutoMinSimulatedGain,
                       "%; training on with ", measurement, " (no trial)\n");
      LOG(INFO) << text;
      std::cout << text << std::flush;
    }
    return Switch(next, trainer, rank0, measurement);
  }
  const bool synthesised = choice.chosen_name == kAutoSchedule;
  trying_what_ = synthesised ? "synthesised" : choice.chosen_name;
  PP_RETURN_IF_ERROR(Switch(next, trainer, rank0,
                            synthesised
                                ? std::string("the synthesised schedule")
                                : absl::StrCat("registered schedule ", choice.chosen_name)));
  // Fixed costs are not checked by measurement: the choice stays the same
  // on every machine.
  trying_ = trial;
  decided_ = !trial;
  return absl::OkStatus();
}

absl::Status AutoScheduleRun::KeepOrRevert(const ParallelGrid& grid, Trainer& trainer) {
  PP_ASSIGN_OR_RETURN(const double before, WorldMeanMs(measured_ms_, grid, trainer));
  PP_ASSIGN_OR_RETURN(const double after, WorldMeanMs(trial_ms_, grid, trainer));
  PP_ASSIGN_OR_RETURN(const std::string measurement, AutoMeasurementSchedule(num_chunks_));
  const bool rank0 = grid.global_rank() == 0;
  const bool keep = after <= before;
  if (rank0) {
    const std::string text = absl::StrFormat(
        "schedule auto: checked by measurement: %.1f ms per step %s (steps %d-%d) vs "
        "%.1f ms under %s (steps %d-%d): %s\n",
        after, trying_what_, kFirstMeasuredStep + kMeasuredSteps + 1,
        kFirstMeasuredStep + kMeasuredSteps + kTrialSteps, before, measurement,
        kFirstMeasuredStep + 1, kFirstMeasuredStep + kMeasuredSteps,
        keep ? absl::StrCat("keeping the ", trying_what_, " schedule")
             : absl::StrCat("going back to ", measurement));
    LOG(INFO) << text;
    std::cout << text << std::flush;
  }
  trying_ = false;
  decided_ = true;
  if (keep) return absl::OkStatus();
  PP_ASSIGN_OR_RETURN(Schedule back,
                      MakeSchedule(measurement, {num_stages_, num_microbatches_, num_chunks_, 0}));
  back.name = std::string(kAutoSchedule);
  return Switch(back, trainer, rank0, measurement);
}

absl::Status AutoScheduleRun::Switch(const Schedule& schedule, Trainer& trainer, bool rank0,
                                     const std::string& what) {
  if (rank0) {
    const std::string csv = ScheduleToCsv(schedule);
    for (const std::string& dir : {run_dir_, checkpoint_dir_}) {
      if (dir.empty()) continue;
      std::error_code ec;
      fs::create_directories(dir, ec);
      // Atomic: a resume reads either no file or the whole schedule.
      if (absl::Status s =
              WriteFileDurably((fs::path(dir) / std::string(kAutoScheduleFile)).string(), csv);
          !s.ok()) {
        return absl::UnavailableError(absl::StrCat("schedule auto: ", s.message()));
      }
    }
  }
  PP_RETURN_IF_ERROR(trainer.ReplaceTrainSchedule(schedule));
  if (rank0 && !decided_) {
    LOG(INFO) << "schedule auto: training on with " << what;
    std::cout << "schedule auto: training on with " << what << std::endl;
  }
  return absl::OkStatus();
}

}  // namespace pp
