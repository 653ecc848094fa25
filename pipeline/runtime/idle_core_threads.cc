#include "pipeline/runtime/idle_core_threads.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "pipeline/schedule/ir/idle_peers.h"

namespace pp {

absl::StatusOr<absl::flat_hash_map<Action, int>> PlanIdleCoreThreads(
    const LoweredProgram& program, int rank, const IdleCoreOptions& options) {
  if (options.machine_cores < 1 || options.machine_ranks < 1 || options.base_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("idle cores: machine_cores (", options.machine_cores, "), machine_ranks (",
                     options.machine_ranks, ") and base_threads (", options.base_threads,
                     ") must all be at least 1"));
  }
  if (static_cast<int>(options.pipe_peers_on_machine.size()) >= options.machine_ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "idle cores: ", options.pipe_peers_on_machine.size(), " pipeline peers on the machine [",
        absl::StrJoin(options.pipe_peers_on_machine, ","), "] but only ", options.machine_ranks,
        " ranks there, this one included"));
  }
  absl::flat_hash_map<Action, int> plan;
  if (program.forward_only || options.pipe_peers_on_machine.empty()) return plan;
  // The compute order of the program: its compute actions and vocabulary
  // passes, without communication and tail.
  Schedule schedule = ScheduleOf(program);
  for (std::vector<Action>& actions : schedule.ranks) {
    std::erase_if(actions,
                  [](const Action& a) { return !IsCompute(a.type) && !IsVocabCompute(a.type); });
  }
  PP_ASSIGN_OR_RETURN(std::vector<std::vector<int>> idle,
                      IdlePeersDuring(schedule, rank, options.pipe_peers_on_machine));
  for (int i = 0; i < static_cast<int>(idle.size()); ++i) {
    const int busy_ranks = options.machine_ranks - static_cast<int>(idle[i].size());
    const int threads = options.machine_cores / busy_ranks;
    if (threads <= options.base_threads) continue;
    for (const Action& leaf : Leaves(schedule.ranks[rank][i])) plan[leaf] = threads;
  }
  return plan;
}

IdleCoreLender::IdleCoreLender(IdleCoreOptions options, std::function<bool(int)> set_threads)
    : options_(std::move(options)),
      set_threads_(std::move(set_threads)),
      current_(options_.base_threads) {}

absl::Status IdleCoreLender::Plan(const LoweredProgram& program, int rank) {
  PP_ASSIGN_OR_RETURN(plan_, PlanIdleCoreThreads(program, rank, options_));
  return absl::OkStatus();
}

void IdleCoreLender::Set(int threads) {
  if (threads == current_) return;
  set_threads_(threads);
  current_ = threads;
}

void IdleCoreLender::ActionStart(const ObservedStep& step, const Action& action) {
  if (step.forward_only) return;
  const auto it = plan_.find(action);
  if (it == plan_.end()) {
    Set(options_.base_threads);
    return;
  }
  Set(it->second);
  ++lent_actions_;
}

absl::Status IdleCoreLender::StepEnd(const ObservedStep& /*step*/, const absl::Status& /*status*/) {
  Set(options_.base_threads);
  return absl::OkStatus();
}

}  // namespace pp
