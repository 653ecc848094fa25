// `parallelism.schedule: "auto"`: a schedule synthesised from this run's own
// measured costs.
//
// The run starts under a registered schedule of the same memory and
// placement whose backward is split (zb_h1 for one chunk per rank: 1F1B's
// peak; zbv for two chunks in V placement), so that F, I and W are each timed.
// Steps 2 and 3 (after a warm-up step) are traced; every rank reduces its
// per-stage action times over the world group, so all ranks hold the same
// costs; each synthesises the same schedule (Synthesize is deterministic) under
// 1F1B's activation memory, compares it with every registered schedule of the
// shape under the same costs and cap, and trains on with it
// (Trainer::ReplaceTrainSchedule) where it simulates faster than all of them
// by more than kAutoMinSimulatedGain, else with the fastest of them (no switch and no trial when
// that is the measurement schedule). A switched-to schedule runs kTrialSteps on trial and is kept
// only when not slower than the measurement schedule was. Rank 0 writes it as CSV into the run
// directory and the checkpoint directory; a resumed run reuses that file instead of measuring
// again. Training continues through the switch: every schedule trains like sequential training, so
// the losses are 1F1B's up to round-off.
#ifndef PIPELINE_AUTO_SCHEDULE_AUTO_SCHEDULE_H_
#define PIPELINE_AUTO_SCHEDULE_AUTO_SCHEDULE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipeline/auto_schedule/auto_options.h"
#include "pipeline/runtime/action_timer.h"
#include "pipeline/runtime/trainer.h"
#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/schedules/synthesis.h"
#include "topology/parallel_grid.h"

namespace pp {

// One rank's measured costs as a flat vector that sums over ranks: per
// virtual stage (p * v of them) the sums and counts of F, B, I and W
// durations in milliseconds, then per pipeline rank its median SEND and its
// smallest RECV duration with a count each, then the vocabulary passes'
// (OUT_S, OUT_T, IN_F, IN_B) sums and counts and the smallest vocabulary
// collective with a count. `timings` holds this rank's traced steps.
std::vector<double> LocalCostSums(const std::vector<std::vector<ActionTiming>>& timings,
                                  int num_stages, int num_chunks, int pipe_rank);

// The simulator's costs from the sum over all ranks of LocalCostSums: mean
// F/B/I/W per virtual stage (B = I + W where only I and W were timed), per
// rank SEND and RECV costs, and the vocabulary passes' mean costs and their
// collectives' (SimulationCosts::vocab; zero without vocabulary
// parallelism). InvalidArgument when a virtual stage has no
// forward or no backward timed.
absl::StatusOr<SimulationCosts> CostsFromSums(const std::vector<double>& sums, int num_stages,
                                              int num_chunks);

// The smallest simulated gain over the best registered schedule for which
// auto trains a synthesised schedule: the simulator's error as executed
// (docs/schedules.md "Where the simulator was wrong": within 3%).
inline constexpr double kAutoMinSimulatedGain = 0.03;

struct AutoScheduleChoice {
  SynthesisResult synthesis;
  // What the run trains on next: the synthesised schedule where it simulates
  // faster than every registered schedule of the shape within the cap by more
  // than kAutoMinSimulatedGain, else the fastest of those (among registered
  // schedules that tie, the measurement schedule: no switch at all).
  // `chosen_name` is kAutoSchedule for the synthesised one, else the
  // registered name.
  Schedule chosen;
  std::string chosen_name;
  // One line per schedule: the synthesised one, then every registered
  // training schedule of this shape and placement, with simulated step time,
  // bubble and peak activation memory, marked where over the cap.
  std::string comparison;
};

// Synthesises for p stages, m micro-batches and v chunks (v = 2: V
// placement) from `costs`, seeded deterministically, under `memory_cap` in
// the synthesiser's units (one virtual stage's activations of one
// micro-batch; from parallelism.memory_cap_mib, driver/memory_budget.h) or,
// without one, under 1F1B's activation memory. Every schedule (synthesised
// and compared) is simulated as the runtime executes it: `defer_receives` as
// Trainer::defers_receives() (SimulateAsExecuted; without it the simulator
// put the synthesised schedule 11% ahead of zbv where both run alike).
//
// `fits_bytes`, when given, is the byte plan the launcher checks
// parallelism.memory_cap_mib against (driver/memory_budget.h,
// FitsMemoryCap): a schedule it refuses is never chosen, synthesised or
// registered, whatever the activation units say (issue #42, class 2: auto
// trained zb_h2 at a cap that refuses --schedule=zb_h2). When it refuses
// every candidate, the run stays on its measurement schedule, which the
// launcher checked.
//
// `vocabulary_passes` (parallelism.vocab_parallel): every candidate is
// simulated with the vocabulary passes the Trainer adds to it
// (AddVocabularyPasses) and `costs.vocab`; the chosen schedule is returned
// without them. `vocabulary_barriers` (TrainerOptions::vocabulary_barriers):
// the form of those passes, 1 or 2 barriers, and then only registered
// schedules with passes of that form compete; 0 places two and lets
// registered schedules of either form compete.
using ScheduleFits = std::function<bool(const Schedule&)>;
absl::StatusOr<AutoScheduleChoice> ChooseAutoSchedule(
    const SimulationCosts& costs, int num_stages, int num_microbatches, int num_chunks,
    std::optional<double> memory_cap, bool defer_receives, const ScheduleFits& fits_bytes = {},
    bool vocabulary_passes = false, int vocabulary_barriers = 0);

// The run loop's side of "auto" (inactive for any other schedule).
class AutoScheduleRun {
 public:
  // `run_dir` and `checkpoint_dir` receive the chosen schedule's CSV (global
  // rank 0 writes); `run_dir` is empty on the other ranks, which print nothing.
  // `memory_cap`, `fits_bytes`: as ChooseAutoSchedule's.
  AutoScheduleRun(bool active, int num_stages, int num_microbatches, int num_chunks,
                  std::string run_dir, std::string checkpoint_dir,
                  std::optional<double> memory_cap = {}, ScheduleFits fits_bytes = {});

  bool active() const { return active_; }
  // Micro-batches whose index says their cost (ModelData::microbatch_costs,
  // data.packing_order "cost"): the estimated cost of each micro-batch index
  // of `step` (the same on every rank). The measured steps' profile,
  // normalised to mean 1, becomes the synthesis's per-micro-batch multipliers
  // (SimulationCosts::microbatch_multiplier).
  void set_microbatch_costs(std::function<std::vector<double>(int64_t step)> costs) {
    microbatch_costs_ = std::move(costs);
  }
  // parallelism.auto_costs (AutoFixedCosts): Start chooses from these costs
  // at once, and nothing is measured or tried; the choice is the same on
  // every machine.
  void set_fixed_costs(SimulationCosts costs) { fixed_costs_ = std::move(costs); }
  // Before the first step: a resumed run takes the saved schedule (when it
  // fits this run's shape) and measures nothing; with fixed costs and no
  // saved schedule, the schedule is chosen and switched to here.
  absl::Status Start(Trainer& trainer, int64_t first_step);
  // Whether `step` (0-based) is traced for measuring.
  bool Measures(int64_t step) const;
  // After each step: keeps a measured step's timings; after the last one,
  // reduces them over the world group (collective: every rank calls it at
  // every step), synthesises and switches the Trainer; after kTrialSteps more
  // it compares the world's mean step times and keeps the faster schedule
  // (the saved CSV is the one kept).
  absl::Status AfterStep(int64_t step, const ParallelGrid& grid, Trainer& trainer);

  static constexpr int64_t kFirstMeasuredStep = 1;  // step 0 warms up
  static constexpr int64_t kMeasuredSteps = 2;
  // Steps run with the synthesised schedule before it is kept: the
  // simulator's choice is checked by measurement, and the measurement
  // schedule comes back when it was faster (auto may not lose to it).
  static constexpr int64_t kTrialSteps = 2;

 private:
  // A resumed run: switches to the schedule saved in the checkpoint dir and
  // says so; false (with a warning) when there is none or it does not fit
  // this run's shape.
  bool ResumeSavedSchedule(Trainer& trainer, int64_t first_step);
  // Synthesises for `measured` (its VocabCosts::asynchronous set to the
  // Trainer's vocabulary_async_collectives), reports the comparison (rank 0,
  // after `what_costs`) and switches to the choice; `trial` puts a switch
  // away from the measurement schedule on trial.
  absl::Status ChooseAndSwitch(const SimulationCosts& measured, const std::string& what_costs,
                               bool rank0, bool trial, Trainer& trainer);
  // AfterStep's decisions for `step`, which took `step_ms` on this rank.
  absl::Status Decide(int64_t step, double step_ms, const ParallelGrid& grid, Trainer& trainer);
  // After the trial steps: the synthesised schedule stays when its steps
  // were not slower (world means) than the measurement schedule's.
  absl::Status KeepOrRevert(const ParallelGrid& grid, Trainer& trainer);
  // Rank 0 (`rank0`) writes the CSV and reports (`what`: the schedule, in
  // words); every rank switches.
  absl::Status Switch(const Schedule& schedule, Trainer& trainer, bool rank0,
                      const std::string& what);

  bool active_;
  int num_stages_;
  int num_microbatches_;
  int num_chunks_;
  std::string run_dir_;
  std::string checkpoint_dir_;
  std::optional<double> memory_cap_;
  ScheduleFits fits_bytes_;
  std::function<std::vector<double>(int64_t step)> microbatch_costs_;
  std::optional<SimulationCosts> fixed_costs_;
  // The world's mean step time over `steps_ms` (collective).
  absl::StatusOr<double> WorldMeanMs(const std::vector<double>& steps_ms, const ParallelGrid& grid,
                                     const Trainer& trainer) const;

  bool decided_ = false;
  bool trying_ = false;      // the chosen schedule is on trial
  std::string trying_what_;  // "synthesised" or the registered name on trial
  std::vector<std::vector<ActionTiming>> measured_;
  // Wall time of each measured and trial step, from the end of the previous
  // AfterStep to the start of this one, in ms.
  std::vector<double> measured_ms_;
  std::vector<double> trial_ms_;
  std::optional<std::chrono::steady_clock::time_point> last_step_end_;
};

}  // namespace pp

#endif  // PIPELINE_AUTO_SCHEDULE_AUTO_SCHEDULE_H_
