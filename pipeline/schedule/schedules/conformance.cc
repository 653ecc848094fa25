#include "pipeline/schedule/schedules/conformance.h"

#include <map>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/analysis/validator.h"
#include "pipeline/schedule/ir/idle_peers.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

absl::Status Fail(const ScheduleOptions& o, const std::string& what) {
  return absl::InternalError(
      absl::StrCat("p=", o.num_stages, " m=", o.num_microbatches, " v=", o.num_chunks, ": ", what));
}

// CheckScheduleConformance's steps after the schedule validates.

// Action counts per rank: one F per (local stage, mb); one B, or one I and
// one W, unless forward only.
absl::Status CheckActionCounts(const Schedule& schedule, const ScheduleOptions& o) {
  const int p = o.num_stages, m = o.num_microbatches;
  for (int r = 0; r < p; ++r) {
    int local = 0;
    for (int rank : schedule.stage_to_rank) local += rank == r;
    std::map<ActionType, int> count;
    for (const Action& action : schedule.ranks[r]) {
      for (const Action& a : Leaves(action)) ++count[a.type];
    }
    const int f = count[ActionType::kForward];
    const int b = count[ActionType::kBackward];
    const int i = count[ActionType::kBackwardInput];
    const int w = count[ActionType::kBackwardWeight];
    const bool ok =
        f == local * m && (schedule.forward_only ? b + i + w == 0 : b + i == local * m && i == w);
    if (!ok) {
      return Fail(o, absl::StrCat("rank ", r, " has ", f, " F, ", b, " B, ", i, " I, ", w,
                                  " W for ", local, " local stages"));
    }
  }
  return absl::OkStatus();
}

// Messages: one per micro-batch and cross-rank stage boundary, each way; the
// tail on every rank of a training program, on none of a forward-only one.
absl::Status CheckLoweredProgram(const Schedule& schedule, const LoweredProgram& program,
                                 const ScheduleOptions& o) {
  const int p = o.num_stages, m = o.num_microbatches;
  int boundaries = 0;
  for (int s = 0; s + 1 < schedule.num_virtual_stages(); ++s) {
    boundaries += schedule.stage_to_rank[s] != schedule.stage_to_rank[s + 1];
  }
  std::map<ActionType, int> comm;
  for (int r = 0; r < p; ++r) {
    const std::vector<Action>& actions = program.ranks[r];
    for (const Action& a : actions) ++comm[a.type];
    const bool has_tail = !actions.empty() && actions.back().type == ActionType::kOptimizerStep;
    if (has_tail == schedule.forward_only) {
      return Fail(o, absl::StrCat("rank ", r, "'s lowered program ", has_tail ? "has" : "lacks",
                                  " the tail"));
    }
  }
  const int backward_messages = schedule.forward_only ? 0 : boundaries * m;
  if (comm[ActionType::kSendForward] != boundaries * m ||
      comm[ActionType::kRecvForward] != boundaries * m ||
      comm[ActionType::kSendBackward] != backward_messages ||
      comm[ActionType::kRecvBackward] != backward_messages) {
    return Fail(o, absl::StrCat("wrong message counts: ", comm[ActionType::kSendForward],
                                " SEND_F, ", comm[ActionType::kRecvForward], " RECV_F, ",
                                comm[ActionType::kSendBackward], " SEND_B, ",
                                comm[ActionType::kRecvBackward], " RECV_B; expected ",
                                boundaries * m, " and ", backward_messages));
  }
  return absl::OkStatus();
}

// The program simulates, with buffered and with blocking sends, to sane
// busy times and a bubble fraction in [0, 1).
absl::Status CheckSimulates(const LoweredProgram& program, const ScheduleOptions& o) {
  for (bool blocking : {false, true}) {
    SimulationCosts costs;
    costs.blocking_sends = blocking;
    costs.comm = 0.25;
    absl::StatusOr<SimulationResult> sim = SimulateProgram(program, costs);
    if (!sim.ok()) return Fail(o, sim.status().ToString());
    for (int r = 0; r < o.num_stages; ++r) {
      if (sim->busy[r] > sim->makespan + 1e-9 || sim->idle[r] < -1e-9) {
        return Fail(o, absl::StrCat("rank ", r, " busy ", sim->busy[r], " exceeds the makespan ",
                                    sim->makespan));
      }
    }
    if (sim->bubble_fraction < 0 || sim->bubble_fraction >= 1) {
      return Fail(o, absl::StrCat("bubble fraction ", sim->bubble_fraction));
    }
  }
  return absl::OkStatus();
}

// IdlePeersDuring's promise, under uneven costs (every virtual stage and
// micro-batch its own multiplier, messages that take time) and both send
// models: no compute of a peer it calls idle overlaps the action.
absl::Status CheckIdlePeers(const Schedule& schedule, const LoweredProgram& program,
                            const ScheduleOptions& o) {
  const int p = o.num_stages;
  std::vector<std::vector<std::vector<int>>> idle(p);
  for (int r = 0; r < p; ++r) {
    std::vector<int> peers;
    for (int q = 0; q < p; ++q) {
      if (q != r) peers.push_back(q);
    }
    absl::StatusOr<std::vector<std::vector<int>>> found = IdlePeersDuring(schedule, r, peers);
    if (!found.ok()) return Fail(o, found.status().ToString());
    idle[r] = *std::move(found);
  }
  SimulationCosts costs;
  costs.comm = 0.3;
  for (int s = 0; s < schedule.num_virtual_stages(); ++s) {
    costs.stage_multiplier.push_back(0.5 + 0.37 * ((s * 7 + 3) % 5));
  }
  for (int mb = 0; mb < o.num_microbatches; ++mb) {
    costs.microbatch_multiplier.push_back(0.6 + 0.29 * ((mb * 5 + 1) % 6));
  }
  for (bool blocking : {false, true}) {
    costs.blocking_sends = blocking;
    absl::StatusOr<SimulationResult> sim = SimulateProgram(program, costs);
    if (!sim.ok()) return Fail(o, sim.status().ToString());
    // Each rank's compute intervals, and each action's by its name.
    std::vector<std::vector<std::pair<double, double>>> busy(p);
    std::vector<std::map<std::string, std::pair<double, double>>> by_name(p);
    for (const TraceEvent& e : sim->timeline) {
      absl::StatusOr<Action> a = ParseAction(e.name);
      if (!a.ok() || !(IsCompute(a->type) || IsVocabCompute(a->type))) continue;
      busy[e.rank].emplace_back(e.start, e.end);
      by_name[e.rank][e.name] = {e.start, e.end};
    }
    for (int r = 0; r < p; ++r) {
      for (int i = 0; i < static_cast<int>(schedule.ranks[r].size()); ++i) {
        double start = 1e300, end = -1e300;
        for (const Action& leaf : Leaves(schedule.ranks[r][i])) {
          const auto& [s, e] = by_name[r].at(ActionToString(leaf));
          start = std::min(start, s);
          end = std::max(end, e);
        }
        for (int q : idle[r][i]) {
          for (const auto& [s, e] : busy[q]) {
            if (s < end - 1e-9 && e > start + 1e-9) {
              return Fail(o, absl::StrCat("rank ", q, " is called idle during ",
                                          ActionToString(schedule.ranks[r][i]), " of rank ", r,
                                          " [", start, ", ", end, ") but computes in [", s, ", ", e,
                                          ")", blocking ? " (blocking sends)" : ""));
            }
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckScheduleConformance(const std::string& name, const ScheduleOptions& o) {
  absl::StatusOr<Schedule> made = MakeSchedule(name, o);
  if (!made.ok()) {
    if (made.status().code() != absl::StatusCode::kInvalidArgument ||
        made.status().message().empty()) {
      return Fail(o, absl::StrCat("rejected with something other than a "
                                  "described InvalidArgument: ",
                                  made.status().ToString()));
    }
    return absl::OkStatus();
  }
  const Schedule& schedule = *made;
  if (schedule.num_chunks != o.num_chunks) {
    return Fail(o, absl::StrCat("asked for ", o.num_chunks, " chunks, got ", schedule.num_chunks));
  }
  absl::Status valid = ValidateSchedule(schedule);
  if (!valid.ok()) return Fail(o, valid.ToString());
  PP_RETURN_IF_ERROR(CheckActionCounts(schedule, o));
  PP_ASSIGN_OR_RETURN(LoweredProgram program, Lower(schedule));
  PP_RETURN_IF_ERROR(CheckLoweredProgram(schedule, program, o));
  PP_RETURN_IF_ERROR(CheckSimulates(program, o));
  return CheckIdlePeers(schedule, program, o);
}

namespace {

class ScheduleConformanceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ScheduleConformanceTest, EveryAcceptedShapeValidatesLowersSimulates) {
  int accepted = 0;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      for (int v = 1; v <= 3; ++v) {
        ScheduleOptions options;
        options.num_stages = p;
        options.num_microbatches = m;
        options.num_chunks = v;
        absl::Status status = CheckScheduleConformance(GetParam(), options);
        ASSERT_TRUE(status.ok()) << GetParam() << ": " << status.message();
        accepted += MakeSchedule(GetParam(), options).ok();
      }
    }
  }
  // A schedule that accepts nothing is broken, not conformant.
  EXPECT_GT(accepted, 0) << GetParam() << " accepted no combination";
}

TEST_P(ScheduleConformanceTest, NonsenseOptionsAreInvalidArgument) {
  for (ScheduleOptions options :
       {ScheduleOptions{0, 4, 1, 0}, ScheduleOptions{4, 0, 1, 0}, ScheduleOptions{4, 4, 0, 0},
        ScheduleOptions{4, 4, 1, -1}, ScheduleOptions{-3, -3, -3, -3}}) {
    absl::StatusOr<Schedule> schedule = MakeSchedule(GetParam(), options);
    ASSERT_FALSE(schedule.ok());
    EXPECT_EQ(schedule.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

std::string ParamName(const ::testing::TestParamInfo<std::string>& info) {
  std::string out;
  for (char c : info.param) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

// Evaluated when gtest registers its tests, after static initialization has
// filled the registry.
INSTANTIATE_TEST_SUITE_P(Registered, ScheduleConformanceTest,
                         ::testing::ValuesIn(RegisteredScheduleNames()), ParamName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ScheduleConformanceTest);

}  // namespace
}  // namespace pp
