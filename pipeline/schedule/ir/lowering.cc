#include "pipeline/schedule/ir/lowering.h"

#include <algorithm>
#include <limits>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/ir/internal_dependencies.h"

namespace pp {

int LoweredProgram::PeerRank(const Action& action) const {
  const int peer = PeerStage(action);
  if (!IsCommunication(action.type) || peer < 0 || peer >= static_cast<int>(stage_to_rank.size())) {
    LOG(FATAL) << "LoweredProgram::PeerRank(" << ActionToString(action)
               << "): not a message between existing stages";
  }
  return stage_to_rank[peer];
}

std::vector<int> LoweredProgram::LocalStages(int rank) const {
  std::vector<int> out;
  for (int s = 0; s < static_cast<int>(stage_to_rank.size()); ++s) {
    if (stage_to_rank[s] == rank) out.push_back(s);
  }
  return out;
}

namespace {

// One entry of the global event sequence (rule step 3).
struct Event {
  int time;
  int kind;     // 0 = message, 1 = compute: messages first at equal times
  int a, b, c;  // message: producer stage, direction, mb; compute: rank, pos
  // std::tie's order, field by field: Synthesize sorts hundreds of thousands
  // of events per candidate, where tuples are slow in unoptimised builds.
  bool operator<(const Event& o) const {
    if (time != o.time) return time < o.time;
    if (kind != o.kind) return kind < o.kind;
    if (a != o.a) return a < o.a;
    if (b != o.b) return b < o.b;
    return c < o.c;
  }
};

// Schedule::given_program as the lowered program (a CSV file with comms).
absl::StatusOr<LoweredProgram> GivenProgram(const Schedule& schedule,
                                            const LoweringOptions& options) {
  if (schedule.given_program.size() != schedule.ranks.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule \"", schedule.name, "\": given_program has ", schedule.given_program.size(),
        " rank lists, ranks has ", schedule.ranks.size()));
  }
  LoweredProgram program = EmptyProgramOf(schedule);
  program.ranks.resize(schedule.given_program.size());
  for (size_t r = 0; r < schedule.given_program.size(); ++r) {
    std::vector<Action> compute;
    for (const Action& a : schedule.given_program[r]) {
      if (IsCompute(a.type) || IsVocabCompute(a.type)) compute.push_back(a);
      if (options.include_tail || !IsTail(a.type)) program.ranks[r].push_back(a);
    }
    if (compute != schedule.ranks[r]) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule \"", schedule.name, "\": rank ", r, "'s given_program computes ",
                       ActionsToString(compute), ", but its compute order is ",
                       ActionsToString(schedule.ranks[r])));
    }
  }
  return program;
}

// Lower's steps, after the compute order is timed (rule step 1).

// Per rank, the closed intervals in which it is between computes (rule step
// 2): [end of compute i-1, start of compute i], and after its last.
class IdleIntervals {
 public:
  IdleIntervals(const internal_schedule::ComputeTiming& timing, int num_ranks)
      : between_(num_ranks) {
    constexpr int kForever = 1 << 30;
    for (int r = 0; r < num_ranks; ++r) {
      int lo = 0;
      for (size_t i = 0; i < timing.start[r].size(); ++i) {
        between_[r].push_back({lo, timing.start[r][i]});
        lo = timing.end[r][i];
      }
      between_[r].push_back({lo, kForever});
    }
  }

  // Earliest t in [lo, hi] at which ranks a and b are both between computes;
  // `lo` if there is none.
  int MeetingTime(int a, int b, int lo, int hi) const {
    const auto& x = between_[a];
    const auto& y = between_[b];
    // Intervals are sorted and disjoint: skip those ending before `lo`.
    auto first_reaching = [lo](const std::vector<std::pair<int, int>>& v) {
      return static_cast<size_t>(
          std::partition_point(v.begin(), v.end(),
                               [lo](const std::pair<int, int>& iv) { return iv.second < lo; }) -
          v.begin());
    };
    size_t i = first_reaching(x), j = first_reaching(y);
    while (i < x.size() && j < y.size()) {
      const int from = std::max({x[i].first, y[j].first, lo});
      const int to = std::min({x[i].second, y[j].second, hi});
      if (from <= to) return from;
      if (from > hi) break;
      if (x[i].second < y[j].second) {
        ++i;
      } else {
        ++j;
      }
    }
    return lo;
  }

 private:
  std::vector<std::vector<std::pair<int, int>>> between_;
};

// The vocabulary's collectives of a vocab_parallel schedule as events of all
// ranks (a = -1, b = type, c = micro-batch), each when the last of its
// producers ends: every consumer depends on all of them, so starts no earlier.
// In the one-barrier form (Schedule::vocab_barriers 1) OUT_REDUCE's producers
// are OUT_S's, as OUT_STATS's: it follows OUT_STATS at once (the events sort
// by type at one time, OUT_STATS first), or with `asynchronous` collectives
// one unit before its reader, the last stage's B/I, if that is later, and
// before every rank's OUT_T of the micro-batch, which ends the OUT_S state it
// rescales (LoweringOptions::vocab_async_collectives).
void AppendVocabCollectives(const Schedule& schedule,
                            const internal_schedule::ComputeTiming& timing, bool asynchronous,
                            std::vector<Event>& events) {
  const int m = schedule.num_microbatches;
  const int last = schedule.num_virtual_stages() - 1;
  // Per micro-batch, the latest end of each collective's producers.
  std::vector<int> out_bcast(m, 0), out_stats(m, 0), out_reduce(m, 0), in_reduce(m, 0),
      in_bcast(m, 0);
  std::vector<int> head_input_read(m, 0);  // the last stage's B/I starts
  // The first start of an OUT_T (one barrier: it ends OUT_S's state, which
  // OUT_REDUCE rescales).
  std::vector<int> first_output_t(m, std::numeric_limits<int>::max());
  for (int r = 0; r < schedule.num_stages; ++r) {
    for (int i = 0; i < static_cast<int>(schedule.ranks[r].size()); ++i) {
      const int end = timing.end[r][i];
      for (const Action& a : Leaves(schedule.ranks[r][i])) {
        const int mb = a.microbatch;
        const bool backward =
            a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput;
        if (a.type == ActionType::kForward && a.stage == last) out_bcast[mb] = end;
        if (a.type == ActionType::kVocabOutputS) out_stats[mb] = std::max(out_stats[mb], end);
        if (a.type == ActionType::kVocabOutputT) {
          out_reduce[mb] = std::max(out_reduce[mb], end);
          first_output_t[mb] = std::min(first_output_t[mb], timing.start[r][i]);
        }
        if (a.type == ActionType::kVocabInputF) in_reduce[mb] = std::max(in_reduce[mb], end);
        if (backward && a.stage == 0) in_bcast[mb] = end;
        if (backward && a.stage == last) head_input_read[mb] = timing.start[r][i];
      }
    }
  }
  auto add = [&](ActionType type, int mb, int time) {
    events.push_back({time, 0, -1, static_cast<int>(type), mb});
  };
  if (schedule.vocab_barriers == 1) {
    for (int mb = 0; mb < m; ++mb) {
      out_reduce[mb] =
          asynchronous
              ? std::max(out_stats[mb], std::min(head_input_read[mb] - 1, first_output_t[mb]))
              : out_stats[mb];
    }
  }
  for (int mb = 0; mb < m; ++mb) {
    add(ActionType::kVocabInputReduce, mb, in_reduce[mb]);
    add(ActionType::kVocabOutputBroadcast, mb, out_bcast[mb]);
    add(ActionType::kVocabOutputStats, mb, out_stats[mb]);
    if (schedule.forward_only) continue;
    add(ActionType::kVocabOutputReduce, mb, out_reduce[mb]);
    add(ActionType::kVocabInputBroadcast, mb, in_bcast[mb]);
  }
}

// The global event sequence (rule step 3): every compute at its start, every
// message between ranks at the earliest time both ends are between computes,
// and every vocabulary collective when its last producer ends.
std::vector<Event> SortedEvents(const Schedule& schedule,
                                const internal_schedule::ComputeTiming& timing,
                                bool vocab_async_collectives) {
  const IdleIntervals idle(timing, schedule.num_stages);
  std::vector<Event> events;
  for (int r = 0; r < schedule.num_stages; ++r) {
    for (int i = 0; i < static_cast<int>(schedule.ranks[r].size()); ++i) {
      events.push_back({timing.start[r][i], 1, r, i, 0});
      const bool vocab_consumer = IsVocabCompute(schedule.ranks[r][i].type);
      for (const internal_schedule::Dependency& dep : timing.deps[r][i]) {
        if (dep.rank == r) continue;  // local hand-off
        // The vocabulary's inputs travel by its collectives.
        if (vocab_consumer || IsVocabCompute(dep.produced.type)) continue;
        // The leaf that produces the input: for an OVERLAP_F_B, the half
        // whose output is needed (its message follows the whole pair).
        const Action& producer = dep.produced;
        const int direction = producer.type == ActionType::kForward ? 0 : 1;
        const int t =
            idle.MeetingTime(dep.rank, r, timing.end[dep.rank][dep.pos], timing.start[r][i]);
        events.push_back({t, 0, producer.stage, direction, producer.microbatch});
      }
    }
  }
  if (schedule.vocab_parallel) {
    AppendVocabCollectives(schedule, timing, vocab_async_collectives, events);
  }
  std::sort(events.begin(), events.end());
  return events;
}

// Each rank's program in event order: its computes, and each message as a
// send on the producer's rank and a receive on the consumer's.
LoweredProgram ProgramOfEvents(const Schedule& schedule, const std::vector<Event>& events) {
  LoweredProgram program = EmptyProgramOf(schedule);
  program.ranks.resize(schedule.num_stages);
  for (const Event& e : events) {
    if (e.kind == 1) {
      program.ranks[e.a].push_back(schedule.ranks[e.a][e.b]);
      continue;
    }
    if (e.a < 0) {  // a vocabulary collective: every rank
      for (auto& actions : program.ranks) {
        actions.push_back(Vocab(static_cast<ActionType>(e.b), e.c));
      }
      continue;
    }
    const int stage = e.a, mb = e.c;
    if (e.b == 0) {  // activation: stage -> stage + 1
      program.ranks[schedule.stage_to_rank[stage]].push_back({stage, ActionType::kSendForward, mb});
      program.ranks[schedule.stage_to_rank[stage + 1]].push_back(
          {stage + 1, ActionType::kRecvForward, mb});
    } else {  // gradient: stage -> stage - 1
      program.ranks[schedule.stage_to_rank[stage]].push_back(
          {stage, ActionType::kSendBackward, mb});
      program.ranks[schedule.stage_to_rank[stage - 1]].push_back(
          {stage - 1, ActionType::kRecvBackward, mb});
    }
  }
  return program;
}

// The step's tail on every rank: REDUCE_TIED, then REDUCE_GRAD of each local
// stage in the order its last backward appears, then STEP.
void AppendStepTail(LoweredProgram& program) {
  for (int r = 0; r < program.num_stages; ++r) {
    std::vector<Action>& actions = program.ranks[r];
    std::vector<std::pair<int, int>> last_backward;  // (position, stage)
    for (int stage : program.LocalStages(r)) {
      int last = -1;
      for (int i = 0; i < static_cast<int>(actions.size()); ++i) {
        for (const Action& a : Leaves(actions[i])) {
          if (a.stage == stage &&
              (a.type == ActionType::kBackward || a.type == ActionType::kBackwardWeight)) {
            last = i;
          }
        }
      }
      last_backward.push_back({last, stage});
    }
    std::sort(last_backward.begin(), last_backward.end());
    actions.push_back({-1, ActionType::kReduceTiedGrads, -1});
    for (const auto& [pos, stage] : last_backward) {
      actions.push_back({stage, ActionType::kReduceGrads, -1});
    }
    actions.push_back({-1, ActionType::kOptimizerStep, -1});
  }
}

}  // namespace

absl::StatusOr<LoweredProgram> Lower(const Schedule& schedule, const LoweringOptions& options) {
  if (options.forward_cost < 1 || options.backward_cost < 1 || options.backward_input_cost < 1 ||
      options.backward_weight_cost < 1 || options.vocab_cost < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lowering costs must be positive integers (the order of a message and "
        "its producer relies on it); got F=",
        options.forward_cost, " B=", options.backward_cost, " I=", options.backward_input_cost,
        " W=", options.backward_weight_cost, " vocabulary=", options.vocab_cost));
  }
  if (!schedule.given_program.empty()) return GivenProgram(schedule, options);
  internal_schedule::DependencyCosts costs;
  costs.forward = options.forward_cost;
  costs.backward = options.backward_cost;
  costs.backward_input = options.backward_input_cost;
  costs.backward_weight = options.backward_weight_cost;
  costs.vocab = options.vocab_cost;
  absl::StatusOr<internal_schedule::ComputeTiming> timing =
      internal_schedule::TimeComputeOrder(schedule, costs);
  if (!timing.ok()) return timing.status();

  LoweredProgram program =
      ProgramOfEvents(schedule, SortedEvents(schedule, *timing, options.vocab_async_collectives));
  if (!schedule.forward_only && options.include_tail) AppendStepTail(program);
  return program;
}

LoweredProgram EmptyProgramOf(const Schedule& schedule) {
  LoweredProgram program;
  program.schedule_name = schedule.name;
  program.num_stages = schedule.num_stages;
  program.num_microbatches = schedule.num_microbatches;
  program.num_chunks = schedule.num_chunks;
  program.forward_only = schedule.forward_only;
  program.vocab_parallel = schedule.vocab_parallel;
  program.vocab_barriers = schedule.vocab_barriers;
  program.stage_to_rank = schedule.stage_to_rank;
  return program;
}

Schedule ScheduleOf(const LoweredProgram& program) {
  Schedule schedule;
  schedule.name = program.schedule_name;
  schedule.num_stages = program.num_stages;
  schedule.num_microbatches = program.num_microbatches;
  schedule.num_chunks = program.num_chunks;
  schedule.forward_only = program.forward_only;
  schedule.vocab_parallel = program.vocab_parallel;
  schedule.vocab_barriers = program.vocab_barriers;
  schedule.stage_to_rank = program.stage_to_rank;
  schedule.ranks = program.ranks;
  return schedule;
}

}  // namespace pp
