#include "pipeline/schedule/ir/vocab_passes.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/analysis/validator.h"
#include "pipeline/schedule/formats/csv.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/schedules/registry.h"
#include "pipeline/schedule/schedules/vhalf.h"

namespace pp {
namespace {

using ::testing::HasSubstr;

Schedule Made(const std::string& name, int p, int m, int v = 1) {
  absl::StatusOr<Schedule> s = MakeSchedule(name, {p, m, v, 0});
  EXPECT_TRUE(s.ok()) << name << ": " << s.status();
  return s.ok() ? *s : Schedule{};
}

// Each rank's vocabulary collectives, in program order.
std::vector<std::vector<Action>> Collectives(const LoweredProgram& program) {
  std::vector<std::vector<Action>> out(program.num_stages);
  for (int r = 0; r < program.num_stages; ++r) {
    for (const Action& a : program.ranks[r]) {
      if (IsVocabCollective(a.type)) out[r].push_back(a);
    }
  }
  return out;
}

int Position(const std::vector<Action>& actions, const Action& a) {
  auto it = std::find(actions.begin(), actions.end(), a);
  return it == actions.end() ? -1 : static_cast<int>(it - actions.begin());
}

TEST(VocabActionTest, RoundTripsWithoutAStage) {
  for (const char* text : {"OUT_S0", "OUT_T3", "IN_F12", "IN_B1", "OUT_BCAST2", "OUT_STATS4",
                           "OUT_REDUCE5", "IN_REDUCE6", "IN_BCAST7"}) {
    absl::StatusOr<Action> a = ParseAction(text);
    ASSERT_TRUE(a.ok()) << text << ": " << a.status();
    EXPECT_EQ(a->stage, -1) << text;
    EXPECT_TRUE(IsVocab(a->type)) << text;
    EXPECT_EQ(ActionToString(*a), text);
  }
  EXPECT_THAT(std::string(ParseAction("1OUT_S0").status().message()), HasSubstr("takes no stage"));
  EXPECT_THAT(std::string(ParseAction("OUT_S").status().message()),
              HasSubstr("missing or bad micro-batch"));
}

// The registered placements, on a covering set of shapes: p 1, 2, 4 (and 3,
// odd); m below, at and above p. Every rank meets the collectives in one
// order, and the passes sit where their inputs are. The one-barrier passes
// placed into schedules without their own (`placed`: split backward in
// ZB-H1, interleaving in interleaved 1F1B) keep the same invariants.
TEST(VocabSchedulesTest, ValidateAndEveryRankMeetsTheCollectivesInOneOrder) {
  struct Case {
    const char* name;
    int p, m, v;
    int placed = 0;  // AddVocabularyPasses(name, placed) where non-zero
  };
  for (const Case& c : {Case{"1f1b_vocab", 1, 3, 1},
                        Case{"1f1b_vocab", 2, 1, 1},
                        Case{"1f1b_vocab", 2, 5, 1},
                        Case{"1f1b_vocab", 3, 7, 1},
                        Case{"1f1b_vocab", 4, 8, 1},
                        Case{"zbv_vocab", 2, 4, 2},
                        Case{"zbv_vocab", 4, 8, 2},
                        Case{"zbv_vocab", 4, 3, 2},
                        Case{"1f1b_vocab1", 1, 3, 1},
                        Case{"1f1b_vocab1", 2, 5, 1},
                        Case{"1f1b_vocab1", 3, 7, 1},
                        Case{"1f1b_vocab1", 4, 8, 1},
                        Case{"zbv_vocab1", 2, 4, 2},
                        Case{"zbv_vocab1", 4, 3, 2},
                        Case{"1f1b", 4, 8, 1, 1},
                        Case{"zb_h1", 4, 8, 1, 1},
                        Case{"zb_h1", 2, 5, 1, 1},
                        Case{"interleaved_1f1b", 2, 4, 2, 1},
                        Case{"interleaved_1f1b", 4, 8, 2, 1},
                        Case{"1f1b_vocab_overlap", 4, 8, 1},
                        Case{"1f1b_vocab_overlap", 3, 2, 1},
                        Case{"1f1b_vocab1_overlap", 2, 5, 1},
                        Case{"1f1b_vocab1_overlap", 4, 3, 1},
                        Case{"vhalf_vocab_overlap", 1, 3, 2},
                        Case{"vhalf_vocab_overlap", 2, 4, 2},
                        Case{"vhalf_vocab_overlap", 3, 7, 2},
                        Case{"vhalf_vocab_overlap", 4, 8, 2},
                        Case{"vhalf_vocab1_overlap", 2, 5, 2},
                        Case{"vhalf_vocab1_overlap", 4, 3, 2},
                        Case{"vhalf_vocab1_overlap", 4, 8, 2}}) {
    SCOPED_TRACE(absl::StrCat(c.name, " p=", c.p, " m=", c.m, " placed=", c.placed));
    Schedule s = Made(c.name, c.p, c.m, c.v);
    if (c.placed != 0) {
      absl::StatusOr<Schedule> placed = AddVocabularyPasses(s, c.placed);
      ASSERT_TRUE(placed.ok()) << placed.status();
      s = *std::move(placed);
    }
    ASSERT_TRUE(s.vocab_parallel);
    const bool one_barrier = c.placed == 1 || absl::StrContains(c.name, "_vocab1");
    EXPECT_EQ(s.vocab_barriers, one_barrier ? 1 : 2);
    ASSERT_TRUE(ValidateSchedule(s).ok()) << ValidateSchedule(s);
    absl::StatusOr<LoweredProgram> program = Lower(s);
    ASSERT_TRUE(program.ok()) << program.status();
    const auto collectives = Collectives(*program);
    ASSERT_EQ(collectives[0].size(), 5u * c.m);
    for (int r = 1; r < c.p; ++r) EXPECT_EQ(collectives[r], collectives[0]) << "rank " << r;
    const int last = s.num_virtual_stages() - 1;
    const auto& last_rank = program->ranks[s.stage_to_rank[last]];
    const auto& first_rank = program->ranks[s.stage_to_rank[0]];
    for (int mb = 0; mb < c.m; ++mb) {
      // Stage 0's F after the embedding's reduce; the last stage's backward
      // after the head's gradient reduce, which follows its F's broadcast.
      EXPECT_LT(Position(first_rank, Vocab(ActionType::kVocabInputReduce, mb)),
                Position(first_rank, F(0, mb)));
      const int backward =
          std::max(Position(last_rank, B(last, mb)), Position(last_rank, I(last, mb)));
      EXPECT_LT(Position(last_rank, F(last, mb)),
                Position(last_rank, Vocab(ActionType::kVocabOutputBroadcast, mb)));
      EXPECT_LT(Position(last_rank, Vocab(ActionType::kVocabOutputReduce, mb)), backward);
      if (one_barrier) {
        // OUT_REDUCE right after OUT_STATS on every rank (no pass between),
        // and the last stage's rank runs OUT_T after that backward.
        for (int r = 0; r < c.p; ++r) {
          const auto& list = program->ranks[r];
          EXPECT_EQ(Position(list, Vocab(ActionType::kVocabOutputReduce, mb)),
                    Position(list, Vocab(ActionType::kVocabOutputStats, mb)) + 1)
              << "rank " << r << " mb " << mb;
        }
        // (The paper's V-Half times OUT_T by the next micro-batch instead.)
        if (!absl::StartsWith(c.name, "vhalf_vocab1_overlap")) {
          EXPECT_GT(Position(last_rank, Vocab(ActionType::kVocabOutputT, mb)), backward);
        }
      }
    }
  }
}

// Every schedule linked here (all built-in ones: split backward, overlapped
// pairs, interleaving, forward-only inference) takes the passes and still
// validates and simulates under both send models.
TEST(AddVocabularyPassesTest, EveryRegisteredScheduleTakesThePasses) {
  int done = 0;
  for (const std::string& name : RegisteredScheduleNames()) {
    bool has_passes = false;  // its own: 1f1b_vocab, zbv_vocab1, 1f1b_vocab_overlap, ...
    for (int v : {1, 2}) {
      absl::StatusOr<Schedule> made = MakeSchedule(name, {4, 8, v, 0});
      has_passes |= made.ok() && made->vocab_parallel;
    }
    if (has_passes) continue;
    for (int v : {1, 2}) {
      for (int barriers : {2, 1}) {
        absl::StatusOr<Schedule> base = MakeSchedule(name, {4, 8, v, 0});
        if (!base.ok()) continue;  // a shape this schedule does not take
        SCOPED_TRACE(absl::StrCat(name, " v=", v, " barriers=", barriers));
        absl::StatusOr<Schedule> s = AddVocabularyPasses(*base, barriers);
        ASSERT_TRUE(s.ok()) << s.status();
        EXPECT_EQ(s->name, name + (barriers == 1 ? "+vocab1" : "+vocab"));
        EXPECT_EQ(s->vocab_barriers, barriers);
        ASSERT_TRUE(ValidateSchedule(*s).ok()) << ValidateSchedule(*s);
        for (bool blocking : {false, true}) {
          SimulationCosts costs;
          costs.blocking_sends = blocking;
          costs.comm = 0.25;
          costs.vocab = {0.5, 1, 0.1, 0.1, 0.2};
          absl::StatusOr<SimulationResult> sim = Simulate(*s, costs);
          ASSERT_TRUE(sim.ok()) << sim.status();
        }
        ++done;
      }
    }
  }
  EXPECT_GE(done, 18);
  EXPECT_THAT(std::string(AddVocabularyPasses(Made("1f1b", 2, 2), 3).status().message()),
              HasSubstr("1 or 2"));
  EXPECT_THAT(std::string(AddVocabularyPasses(Made("1f1b_vocab", 2, 2)).status().message()),
              HasSubstr("already has vocabulary passes"));
}

// The passes are placed around each micro-batch's first and last forward and
// backward: a schedule that never runs one of them is refused, naming the
// schedule; one that runs an action twice or for a micro-batch it does not
// have is refused before that, by the timing of its compute order.
TEST(AddVocabularyPassesTest, RefusesAScheduleWithoutEachAnchorOnce) {
  const Schedule base = Made("1f1b", 2, 2);
  auto Edited = [&](const std::function<void(RankActions&)>& edit) {
    Schedule s = base;
    edit(s.ranks);
    return std::string(AddVocabularyPasses(s).status().message());
  };
  const Action first_backward{0, ActionType::kBackward, 1};
  EXPECT_THAT(Edited([&](RankActions& ranks) {
                ranks[0].erase(std::find(ranks[0].begin(), ranks[0].end(), first_backward));
              }),
              HasSubstr("schedule \"1f1b\" does not run every micro-batch's first forward, last "
                        "forward and first backward once"));
  EXPECT_THAT(Edited([&](RankActions& ranks) { ranks[0].push_back(first_backward); }),
              HasSubstr("0B1 appears twice"));
  EXPECT_THAT(Edited([&](RankActions& ranks) {
                ranks[0].push_back(Action{0, ActionType::kBackward, 2});
              }),
              HasSubstr("micro-batch 2 is outside [0, 2)"));
  EXPECT_TRUE(AddVocabularyPasses(base).ok());
}

// PlaceVocabularyPasses refuses passes that are not each micro-batch's
// four once, and start times not shaped as the schedule.
TEST(PlaceVocabularyPassesTest, RefusesMissingDuplicateAndStrayPassesAndBadStarts) {
  const Schedule base = Made("1f1b", 2, 2);
  std::vector<std::vector<double>> starts;
  for (const auto& list : base.ranks) {
    starts.emplace_back();
    for (size_t i = 0; i < list.size(); ++i) starts.back().push_back(i);
  }
  std::vector<TimedVocabPass> passes;
  for (ActionType kind : {ActionType::kVocabInputF, ActionType::kVocabOutputS,
                          ActionType::kVocabOutputT, ActionType::kVocabInputB}) {
    for (int mb = 0; mb < 2; ++mb) passes.push_back({0.0, Vocab(kind, mb)});
  }
  // All at time 0, before every action: each kind in the order given.
  absl::StatusOr<Schedule> placed = PlaceVocabularyPasses(base, 2, passes, starts);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->ranks[1][0], Vocab(ActionType::kVocabInputF, 0));
  EXPECT_EQ(placed->ranks[1][7], Vocab(ActionType::kVocabInputB, 1));
  EXPECT_FALSE(ValidateSchedule(*placed).ok());  // OUT_S before the last stage's F

  std::vector<TimedVocabPass> twice = passes;
  twice.back() = {0.0, Vocab(ActionType::kVocabInputB, 0)};
  EXPECT_THAT(std::string(PlaceVocabularyPasses(base, 2, twice, starts).status().message()),
              HasSubstr("IN_B0 is placed 2 times"));
  std::vector<TimedVocabPass> stray = passes;
  stray.push_back({0.0, Vocab(ActionType::kVocabInputF, 2)});
  EXPECT_THAT(std::string(PlaceVocabularyPasses(base, 2, stray, starts).status().message()),
              HasSubstr("IN_F2 is not one of its 2 micro-batches' IN_F, OUT_S, OUT_T, IN_B"));
  std::vector<std::vector<double>> short_starts = starts;
  short_starts[1].pop_back();
  EXPECT_THAT(std::string(PlaceVocabularyPasses(base, 2, passes, short_starts).status().message()),
              HasSubstr("one nondecreasing list per rank"));
  std::vector<std::vector<double>> backwards = starts;
  std::swap(backwards[0][0], backwards[0][1]);
  EXPECT_FALSE(PlaceVocabularyPasses(base, 2, passes, backwards).ok());
  EXPECT_THAT(std::string(PlaceVocabularyPasses(base, 3, passes, starts).status().message()),
              HasSubstr("1 or 2"));
}

// The paper's V-Half with vocabulary parallelism (vocab_schedules.cc): V-Half's
// block with every I one period later per barrier, unsqueezed, its passes at
// the authors' points. Odd and even p.
TEST(PaperVHalfVocabTest, TheBlockAndThePassesWhereThePaperPutsThem) {
  for (const auto& [p, m] : {std::pair{4, 16}, std::pair{3, 12}}) {
    for (int barriers : {1, 2}) {
      const std::string name = barriers == 1 ? "vhalf_vocab1_overlap" : "vhalf_vocab_overlap";
      SCOPED_TRACE(absl::StrCat(name, " p=", p, " m=", m));
      const Schedule s = Made(name, p, m, 2);
      ASSERT_TRUE(ValidateSchedule(s).ok()) << ValidateSchedule(s);
      EXPECT_EQ(s.vocab_barriers, barriers);
      absl::StatusOr<Schedule> block =
          MakeVHalf({p, m, 2, 0}, {.extra_gap = 6 * barriers, .squeeze = false});
      ASSERT_TRUE(block.ok()) << block.status();
      const int h = p / 2 + 1;
      for (int r = 0; r < p; ++r) {
        // The block's actions in its order, the passes between.
        std::vector<Action> stage_actions;
        for (const Action& a : s.ranks[r]) {
          if (!IsVocab(a.type)) stage_actions.push_back(a);
        }
        EXPECT_EQ(stage_actions, block->ranks[r]) << "rank " << r;
        const auto& list = s.ranks[r];
        auto at = [&](ActionType kind, int mb) { return Position(list, Vocab(kind, mb)); };
        // The first h lookups before any compute, in order.
        for (int i = 0; i < h; ++i) EXPECT_EQ(at(ActionType::kVocabInputF, i), i);
        for (int i = 0; i + 1 < m; ++i) {
          // OUT_T of one micro-batch with the next one's OUT_S, just before it.
          EXPECT_EQ(at(ActionType::kVocabOutputT, i) + 1, at(ActionType::kVocabOutputS, i + 1))
              << "rank " << r << " mb " << i;
        }
        for (int i = h; i < m; ++i) {
          // IN_F(i) with OUT_S(i - h): before it (and OUT_T(i - h - 1)).
          EXPECT_LT(at(ActionType::kVocabInputF, i), at(ActionType::kVocabOutputS, i - h));
          EXPECT_GT(at(ActionType::kVocabInputF, i), at(ActionType::kVocabOutputS, i - h - 1));
        }
        for (int i = 0; i + h + 2 < m; ++i) {
          EXPECT_EQ(at(ActionType::kVocabInputB, i), at(ActionType::kVocabOutputS, i + h + 2) + 1);
        }
        EXPECT_EQ(Position(list, Vocab(ActionType::kVocabInputB, m - 1)),
                  static_cast<int>(list.size()) - 1);
      }
      // OUT_S(i) one slot after the last stage's forward of micro-batch i
      // ended, on rank 0 after the action that follows that forward.
      const auto& rank0 = s.ranks[0];
      for (int i = 0; i < m; ++i) {
        EXPECT_LT(Position(rank0, F(2 * p - 1, i)),
                  Position(rank0, Vocab(ActionType::kVocabOutputS, i)));
      }
      // One micro-batch's two chunks more per barrier on every rank than
      // V-Half holds.
      absl::StatusOr<SimulationResult> with = Simulate(s, {});
      absl::StatusOr<SimulationResult> vhalf = Simulate(Made("vhalf", p, m, 2), {});
      ASSERT_TRUE(with.ok() && vhalf.ok()) << with.status() << vhalf.status();
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(with->peak_memory[r], vhalf->peak_memory[r] + 2 * barriers) << "rank " << r;
      }
    }
  }
}

// The numbers docs/vocab_parallelism.md quotes: the paper's V-Half hides slow
// collectives (VOCAB_COMM 0.5, half an F) that V-Half with the passes placed
// by their inputs waits for, and pays for it where they are fast, in memory
// and in its longer warm-up and cool-down.
TEST(PaperVHalfVocabTest, HidesSlowCollectivesAndPaysWhereTheyAreFast) {
  auto makespan = [](const std::string& name, int p, int m, const char* comm,
                     bool asynchronous = true) {
    absl::StatusOr<SimulationCosts> costs =
        ParseSimulationCosts(absl::StrCat("F:1,I:1,W:1,OUT_S:0.5,OUT_T:1,VOCAB_COMM:", comm));
    EXPECT_TRUE(costs.ok()) << costs.status();
    costs->vocab.asynchronous = asynchronous;
    costs->stage_multiplier.assign(2 * p, 0.5);  // each chunk half a rank's share (as explorer)
    absl::StatusOr<SimulationResult> r = Simulate(Made(name, p, m, 2), *costs);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->makespan : -1;
  };
  EXPECT_NEAR(makespan("vhalf_vocab", 4, 32, "0.5"), 198, 1e-9);
  EXPECT_NEAR(makespan("vhalf_vocab_overlap", 4, 32, "0.5"), 154.5, 1e-9);
  EXPECT_NEAR(makespan("vhalf_vocab1_overlap", 4, 32, "0.5"), 153, 1e-9);
  EXPECT_NEAR(makespan("vhalf_vocab", 4, 32, "0.05"), 152.55, 1e-9);
  EXPECT_NEAR(makespan("vhalf_vocab_overlap", 4, 32, "0.05"), 153.6, 1e-9);
  EXPECT_NEAR(makespan("vhalf_vocab", 4, 8, "0.05"), 40.95, 1e-9);
  EXPECT_NEAR(makespan("vhalf_vocab_overlap", 4, 8, "0.05"), 45.6, 1e-9);
  EXPECT_NEAR(makespan("vhalf_vocab1_overlap", 4, 8, "0.05"), 44.1, 1e-9);
  // Blocking (docs/schedules.md's table).
  EXPECT_NEAR(makespan("vhalf_vocab_overlap", 4, 8, "0.05", false), 52.5, 1e-9);
  EXPECT_NEAR(makespan("vhalf_vocab1_overlap", 4, 8, "0.05", false), 49.5, 1e-9);
}

// The one-barrier OUT_REDUCE rescales with OUT_STATS's result as it starts.
// Lowered for blocking collectives it follows OUT_STATS at once (one wait for
// both); for asynchronous ones (LoweringOptions::vocab_async_collectives) it
// goes one unit before its reader, the last stage's B/I, where that is later,
// so that a rank does not wait there for every rank's OUT_S. 1F1B's last
// stage runs the backward right after the passes: nothing changes there.
TEST(VocabLoweringTest, AsynchronousOneBarrierReduceGoesBeforeItsReader) {
  LoweringOptions asynchronous;
  asynchronous.vocab_async_collectives = true;
  for (const auto& [name, p, m, v] :
       {std::tuple{"1f1b_vocab1", 4, 8, 1}, std::tuple{"vhalf_vocab1_overlap", 4, 8, 2}}) {
    SCOPED_TRACE(name);
    const Schedule s = Made(name, p, m, v);
    absl::StatusOr<LoweredProgram> blocking_program = Lower(s);
    absl::StatusOr<LoweredProgram> async_program = Lower(s, asynchronous);
    ASSERT_TRUE(blocking_program.ok() && async_program.ok());
    ASSERT_TRUE(ValidateLoweredProgram(*async_program).ok())
        << ValidateLoweredProgram(*async_program);
    const auto collectives = Collectives(*async_program);
    for (int r = 1; r < p; ++r) EXPECT_EQ(collectives[r], collectives[0]) << "rank " << r;
    const int last = s.num_virtual_stages() - 1;
    const auto& last_rank = async_program->ranks[s.stage_to_rank[last]];
    int deferred = 0;
    for (int mb = 0; mb < m; ++mb) {
      const Action reduce = Vocab(ActionType::kVocabOutputReduce, mb);
      const Action stats = Vocab(ActionType::kVocabOutputStats, mb);
      const int backward =
          std::max(Position(last_rank, B(last, mb)), Position(last_rank, I(last, mb)));
      EXPECT_GT(Position(last_rank, reduce), Position(last_rank, stats));
      EXPECT_LT(Position(last_rank, reduce), backward);
      for (int r = 0; r < p; ++r) {  // OUT_T ends the OUT_S state it rescales
        const auto& list = async_program->ranks[r];
        EXPECT_LT(Position(list, reduce), Position(list, Vocab(ActionType::kVocabOutputT, mb)));
      }
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(Position(blocking_program->ranks[r], reduce),
                  Position(blocking_program->ranks[r], stats) + 1);
      }
      deferred += Position(last_rank, reduce) > Position(last_rank, stats) + 1;
    }
    if (std::string(name) == "1f1b_vocab1") {
      EXPECT_EQ(async_program->ranks, blocking_program->ranks);
    } else {
      EXPECT_EQ(deferred, m);
    }
  }
  // What it is for: the paper's one-barrier V-Half with slow collectives.
  absl::StatusOr<SimulationCosts> costs =
      ParseSimulationCosts("F:1,I:1,W:1,OUT_S:0.5,OUT_T:1,VOCAB_COMM:0.5,VOCAB_ASYNC:1");
  ASSERT_TRUE(costs.ok()) << costs.status();
  costs->stage_multiplier.assign(8, 0.5);
  const Schedule s = Made("vhalf_vocab1_overlap", 4, 32, 2);
  absl::StatusOr<SimulationResult> as_blocking = SimulateProgram(*Lower(s), *costs);
  absl::StatusOr<SimulationResult> deferred = SimulateProgram(*Lower(s, asynchronous), *costs);
  ASSERT_TRUE(as_blocking.ok() && deferred.ok());
  EXPECT_NEAR(as_blocking->makespan, 182.5, 1e-9);
  EXPECT_NEAR(deferred->makespan, 153, 1e-9);
}

// A copy of rank `r`'s list with `a` moved to position `to`.
void Move(Schedule& s, int r, const Action& a, int to) {
  auto& list = s.ranks[r];
  list.erase(std::find(list.begin(), list.end(), a));
  list.insert(list.begin() + to, a);
}

// `list` with `a` moved to just before `before`.
void MoveBefore(std::vector<Action>& list, const Action& a, const Action& before) {
  list.erase(std::find(list.begin(), list.end(), a));
  list.insert(std::find(list.begin(), list.end(), before), a);
}

TEST(VocabValidatorTest, APassBeforeItsProducerIsRefused) {
  // Rank 0 computes its logits shard of micro-batch 0 before its own
  // embedding shard of that micro-batch: the head's input needs stage 0's F,
  // which needs every rank's IN_F0.
  Schedule s = Made("1f1b_vocab", 2, 2);
  Move(s, 0, Vocab(ActionType::kVocabOutputS, 0), 0);
  const absl::Status status = ValidateSchedule(s);
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot all make progress"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("OUT_S0"));
}

TEST(VocabValidatorTest, MissingAndStrayPassesAreRefused) {
  Schedule missing = Made("1f1b_vocab", 2, 3);
  auto& list = missing.ranks[1];
  list.erase(std::find(list.begin(), list.end(), Vocab(ActionType::kVocabInputB, 2)));
  EXPECT_THAT(std::string(ValidateSchedule(missing).message()),
              HasSubstr("rank 1 runs IN_B2 0 times"));

  Schedule stray = Made("1f1b", 2, 2);
  stray.ranks[0].insert(stray.ranks[0].begin(), Vocab(ActionType::kVocabInputF, 0));
  EXPECT_THAT(std::string(ValidateSchedule(stray).message()),
              HasSubstr("without vocabulary parallelism"));

  Schedule eval = Made("inference", 2, 2);
  absl::StatusOr<Schedule> with = AddVocabularyPasses(eval);
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_TRUE(ValidateSchedule(*with).ok()) << ValidateSchedule(*with);
  with->ranks[1].push_back(Vocab(ActionType::kVocabOutputT, 0));
  EXPECT_THAT(std::string(ValidateSchedule(*with).message()),
              HasSubstr("backward vocabulary pass in a forward-only schedule"));
}

TEST(VocabValidatorTest, CollectivesOrderedDifferentlyOnTwoRanksDeadlock) {
  absl::StatusOr<LoweredProgram> program = Lower(Made("1f1b_vocab", 2, 4));
  ASSERT_TRUE(program.ok()) << program.status();
  ASSERT_TRUE(ValidateLoweredProgram(*program).ok());
  // Rank 0 runs micro-batch 2's embedding reduce before micro-batch 1's;
  // rank 1 keeps the lowered order. Each waits in a different collective.
  auto& list = program->ranks[0];
  const Action reduce1 = Vocab(ActionType::kVocabInputReduce, 1);
  const Action in_f2 = Vocab(ActionType::kVocabInputF, 2);
  const Action reduce2 = Vocab(ActionType::kVocabInputReduce, 2);
  for (const Action& a : {in_f2, reduce2}) list.erase(std::find(list.begin(), list.end(), a));
  auto at = std::find(list.begin(), list.end(), reduce1);
  list.insert(at, {in_f2, reduce2});
  const std::string message(ValidateLoweredProgram(*program).message());
  EXPECT_THAT(message, HasSubstr("deadlock"));
  EXPECT_THAT(message, HasSubstr("IN_REDUCE2 waits for the other participants"));
  EXPECT_THAT(message, HasSubstr("rank 1 is at step"));
}

// The one-barrier form's dependencies: the last stage's backward needs every
// rank's OUT_S only, so OUT_T may follow it; in the two-barrier form the same
// order cannot run (the backward waits for every rank's OUT_T).
TEST(VocabValidatorTest, OutputTAfterTheLastBackwardOnlyWithOneBarrier) {
  for (int barriers : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("barriers=", barriers));
    Schedule s = Made("1f1b_vocab", 2, 3);
    s.vocab_barriers = barriers;
    // Rank 1 (the last stage) runs OUT_T0 at the end of its list.
    Move(s, 1, Vocab(ActionType::kVocabOutputT, 0), static_cast<int>(s.ranks[1].size()) - 1);
    const absl::Status status = ValidateSchedule(s);
    if (barriers == 1) {
      EXPECT_TRUE(status.ok()) << status;
    } else {
      EXPECT_THAT(std::string(status.message()), HasSubstr("cannot all make progress"));
    }
  }
  // One barrier still needs OUT_T after OUT_S (it reads OUT_S's exps and the
  // gathered statistics).
  Schedule early = Made("1f1b_vocab1", 2, 2);
  Move(early, 0, Vocab(ActionType::kVocabOutputT, 1), 0);
  EXPECT_FALSE(ValidateSchedule(early).ok());
}

// One barrier: OUT_REDUCE rescales OUT_S's partial, which OUT_T ends (the
// runtime keeps nothing for a later rescale), so a rank's OUT_T before its
// OUT_REDUCE is refused, naming both.
TEST(VocabValidatorTest, OneBarrierOutputTBeforeItsReduceIsRefused) {
  absl::StatusOr<LoweredProgram> program = Lower(Made("1f1b_vocab1", 2, 4));
  ASSERT_TRUE(program.ok()) << program.status();
  ASSERT_TRUE(ValidateLoweredProgram(*program).ok());
  MoveBefore(program->ranks[0], Vocab(ActionType::kVocabOutputT, 1),
             Vocab(ActionType::kVocabOutputReduce, 1));
  EXPECT_THAT(std::string(ValidateLoweredProgram(*program).message()),
              HasSubstr("rank 0 runs OUT_T1 before OUT_REDUCE1"));
}

TEST(VocabValidatorTest, OneBarrierReduceOrderedDifferentlyOnTwoRanksDeadlocks) {
  absl::StatusOr<LoweredProgram> program = Lower(Made("1f1b_vocab1", 2, 4));
  ASSERT_TRUE(program.ok()) << program.status();
  ASSERT_TRUE(ValidateLoweredProgram(*program).ok());
  // Rank 0 runs micro-batch 0's OUT_REDUCE before its OUT_STATS: it rescales
  // with statistics it does not have.
  LoweredProgram swapped = *program;
  auto& list = swapped.ranks[0];
  const Action stats0 = Vocab(ActionType::kVocabOutputStats, 0);
  const Action reduce0 = Vocab(ActionType::kVocabOutputReduce, 0);
  std::iter_swap(std::find(list.begin(), list.end(), stats0),
                 std::find(list.begin(), list.end(), reduce0));
  EXPECT_THAT(std::string(ValidateLoweredProgram(swapped).message()), HasSubstr("OUT_STATS0"));
  // Rank 0 runs micro-batch 0's OUT_REDUCE only after micro-batch 1's
  // OUT_STATS; rank 1 keeps the lowered order and waits in OUT_REDUCE0 while
  // rank 0 waits for 1B0's gradient (1B0 needs that OUT_REDUCE).
  LoweredProgram reordered = *program;
  auto& r0 = reordered.ranks[0];
  r0.erase(std::find(r0.begin(), r0.end(), reduce0));
  r0.insert(std::find(r0.begin(), r0.end(), Vocab(ActionType::kVocabOutputStats, 1)) + 1, reduce0);
  EXPECT_THAT(std::string(ValidateLoweredProgram(reordered).message()), HasSubstr("deadlock"));
  // A program that names another algorithm is refused.
  LoweredProgram bad = *program;
  bad.vocab_barriers = 3;
  EXPECT_THAT(std::string(ValidateLoweredProgram(bad).message()), HasSubstr("1 or 2 barriers"));
}

// The CSV names the algorithm: "# vocab_barriers: 1"; a file without the
// line (every file written before it) is the two-barrier form.
TEST(VocabCsvTest, TheOneBarrierMarkerRoundTrips) {
  const Schedule one = Made("1f1b_vocab1", 2, 4);
  for (const std::string& text : {ScheduleToCsv(one), ProgramToCsv(*Lower(one))}) {
    EXPECT_THAT(text, HasSubstr("# vocab_barriers: 1\n"));
    absl::StatusOr<Schedule> parsed = ParseCsvSchedule(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->vocab_barriers, 1);
    EXPECT_EQ(parsed->ranks, one.ranks);
  }
  const Schedule two = Made("1f1b_vocab", 2, 4);
  const std::string text = ScheduleToCsv(two);
  EXPECT_THAT(text, ::testing::Not(HasSubstr("vocab_barriers")));
  absl::StatusOr<Schedule> parsed = ParseCsvSchedule(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->vocab_barriers, 2);
  // The one-barrier order read as two barriers does not run: its last
  // backward comes before OUT_T.
  std::string unmarked = ScheduleToCsv(one);
  unmarked.erase(0, unmarked.find('\n') + 1);
  EXPECT_FALSE(ParseCsvSchedule(unmarked).ok());
  EXPECT_THAT(std::string(ParseCsvSchedule("# vocab_barriers: 3\n" + text).status().message()),
              HasSubstr("expected \"# vocab_barriers: 1\""));
  EXPECT_THAT(
      std::string(ParseCsvSchedule("# vocab_barriers: 1\n" + ScheduleToCsv(Made("1f1b", 2, 2)))
                      .status()
                      .message()),
      HasSubstr("without vocabulary actions"));
}

TEST(VocabCsvTest, BothFormsRoundTrip) {
  const Schedule s = Made("zbv_vocab", 2, 4, 2);
  absl::StatusOr<Schedule> compute = ParseCsvSchedule(ScheduleToCsv(s));
  ASSERT_TRUE(compute.ok()) << compute.status();
  EXPECT_TRUE(compute->vocab_parallel);
  EXPECT_EQ(compute->ranks, s.ranks);
  EXPECT_EQ(compute->stage_to_rank, s.stage_to_rank);
  EXPECT_TRUE(ValidateSchedule(*compute).ok()) << ValidateSchedule(*compute);

  absl::StatusOr<LoweredProgram> program = Lower(s);
  ASSERT_TRUE(program.ok());
  absl::StatusOr<Schedule> comms = ParseCsvSchedule(ProgramToCsv(*program));
  ASSERT_TRUE(comms.ok()) << comms.status();
  EXPECT_TRUE(comms->vocab_parallel);
  EXPECT_EQ(comms->ranks, s.ranks);
  absl::StatusOr<LoweredProgram> given = Lower(*comms);
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->ranks, program->ranks);
  EXPECT_TRUE(given->vocab_parallel);
}

// One barrier against two at p = 4, m = 8, with a head that costs two blocks
// split over the ranks (the numbers docs/vocab_parallelism.md quotes): the
// last stage's backward no longer waits for an OUT_T on every rank.
TEST(VocabSimulationTest, OneBarrierShortensTheStep) {
  SimulationCosts split;
  split.vocab.output_s = 0.5;
  split.vocab.output_t = 1;
  split.vocab.collective = 0.05;
  for (const auto& [two, one, v] :
       {std::tuple{"1f1b_vocab", "1f1b_vocab1", 1}, std::tuple{"zbv_vocab", "zbv_vocab1", 2}}) {
    absl::StatusOr<SimulationResult> a = Simulate(Made(two, 4, 8, v), split);
    absl::StatusOr<SimulationResult> b = Simulate(Made(one, 4, 8, v), split);
    ASSERT_TRUE(a.ok() && b.ok());
    // The same work: OUT_S + OUT_T per micro-batch and rank either way.
    EXPECT_NEAR(std::accumulate(a->busy.begin(), a->busy.end(), 0.0),
                std::accumulate(b->busy.begin(), b->busy.end(), 0.0), 1e-9);
    // The same passes measured on a one-barrier run (OUT_S 1, OUT_T 0.5,
    // VOCAB_BARRIERS:1) simulate both algorithms alike.
    absl::StatusOr<SimulationCosts> measured_one =
        ParseSimulationCosts("OUT_S:1,OUT_T:0.5,VOCAB_COMM:0.05,VOCAB_BARRIERS:1");
    ASSERT_TRUE(measured_one.ok()) << measured_one.status();
    for (const char* name : {two, one}) {
      absl::StatusOr<SimulationResult> x = Simulate(Made(name, 4, 8, v), split);
      absl::StatusOr<SimulationResult> y = Simulate(Made(name, 4, 8, v), *measured_one);
      ASSERT_TRUE(x.ok() && y.ok());
      EXPECT_NEAR(x->makespan, y->makespan, 1e-9) << name;
      EXPECT_EQ(x->busy, y->busy) << name;
    }
    // 1F1B: 65 -> 63.5. ZB-V: 70 either way here (its W fill the waits the
    // second barrier made).
    if (v == 1) {
      EXPECT_LT(b->makespan, a->makespan)
          << two << " " << a->makespan << ", " << one << " " << b->makespan;
    } else {
      EXPECT_LE(b->makespan, a->makespan + 1e-9)
          << two << " " << a->makespan << ", " << one << " " << b->makespan;
    }
  }
}

// The point of the feature, in the cost model: a head that costs two blocks
// on the last of 4 stages (forward 1 + 2, backward 2 + 4) against the same
// head split over 4 ranks (OUT_S 0.5, OUT_T 1 each, collectives 0.05).
TEST(VocabSimulationTest, SplittingAHeavyHeadBalancesTheRanksAndShortensTheStep) {
  const int p = 4, m = 16;
  SimulationCosts naive;
  naive.stage_costs[p - 1].forward = 3;
  naive.stage_costs[p - 1].backward = 6;
  absl::StatusOr<SimulationResult> plain = Simulate(Made("1f1b", p, m), naive);
  ASSERT_TRUE(plain.ok()) << plain.status();

  SimulationCosts split;
  split.vocab.output_s = 0.5;
  split.vocab.output_t = 1;
  split.vocab.collective = 0.05;
  absl::StatusOr<SimulationResult> vocab = Simulate(Made("1f1b_vocab", p, m), split);
  ASSERT_TRUE(vocab.ok()) << vocab.status();

  auto imbalance = [](const SimulationResult& r) {
    return *std::max_element(r.busy.begin(), r.busy.end()) /
           *std::min_element(r.busy.begin(), r.busy.end());
  };
  EXPECT_GT(imbalance(*plain), 2.0);
  EXPECT_LT(imbalance(*vocab), 1.0001);  // every rank: its blocks + a quarter of the head
  // 127 against 153 units: the three collectives of each micro-batch are
  // barriers that the placement (vocab_passes.h) only partly hides.
  EXPECT_LT(vocab->makespan, 0.9 * plain->makespan)
      << "vocabulary-parallel " << vocab->makespan << ", naive " << plain->makespan;
}

// Asynchronous collectives (SimulationCosts::vocab.asynchronous): a rank
// posts each and goes on, and waits only where it reads the result. Never
// slower than blocking ones, with the same busy time; each collective is a
// post of no time on every rank's timeline, in flight until the last rank's
// post plus its cost. Covering set: every registered
// vocabulary schedule (1F1B and ZB-V, both forms, the "_overlap" 1F1B) at
// p 2 and 4, one with uneven stage costs.
TEST(VocabSimulationTest, AsynchronousCollectivesNeverLengthenTheStep) {
  absl::StatusOr<SimulationCosts> blocking =
      ParseSimulationCosts("F:1,B:2,I:1,W:1,OUT_S:0.5,OUT_T:1,IN_F:0.1,IN_B:0.2,VOCAB_COMM:0.05");
  ASSERT_TRUE(blocking.ok()) << blocking.status();
  for (const char* name : {"1f1b_vocab", "1f1b_vocab1", "zbv_vocab", "zbv_vocab1",
                           "1f1b_vocab_overlap", "1f1b_vocab1_overlap"}) {
    const int v = absl::StartsWith(name, "zbv") ? 2 : 1;
    for (int p : {2, 4}) {
      for (bool uneven : {false, true}) {
        SCOPED_TRACE(absl::StrCat(name, " p=", p, uneven ? " uneven" : ""));
        SimulationCosts costs = *blocking;
        if (uneven) costs.stage_multiplier = {1.5, 0.7, 1.2, 0.9, 1.1, 1, 0.8, 1.3};
        costs.stage_multiplier.resize(costs.stage_multiplier.empty() ? 0 : p * v);
        const Schedule s = Made(name, p, 8, v);
        absl::StatusOr<SimulationResult> a = Simulate(s, costs);
        costs.vocab.asynchronous = true;
        absl::StatusOr<SimulationResult> b = Simulate(s, costs);
        ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
        EXPECT_LE(b->makespan, a->makespan + 1e-9);
        for (int r = 0; r < p; ++r) EXPECT_NEAR(b->busy[r], a->busy[r], 1e-9) << "rank " << r;
        EXPECT_EQ(b->peak_memory, a->peak_memory);
        // Each post is in flight (SimulationResult::in_flight) until the
        // latest rank's post of it plus VOCAB_COMM; blocking, none is.
        std::map<std::string, double> latest_post;
        size_t posts = 0;
        for (const TraceEvent& e : b->timeline) {
          absl::StatusOr<Action> action = ParseAction(e.name);
          if (action.ok() && IsVocabCollective(action->type)) {
            EXPECT_EQ(e.start, e.end) << e.name << " on rank " << e.rank;
            latest_post[e.name] = std::max(latest_post[e.name], e.start);
            ++posts;
          }
        }
        EXPECT_TRUE(a->in_flight.empty());
        ASSERT_EQ(b->in_flight.size(), posts);
        for (const TraceEvent& e : b->in_flight) {
          EXPECT_TRUE(e.background);
          EXPECT_EQ(e.name, e.started_by + " in flight");
          EXPECT_NEAR(e.end, latest_post.at(e.started_by) + 0.05, 1e-9) << e.name;
        }
      }
    }
  }
}

// The numbers docs/vocab_parallelism.md quotes (p 4, m 8, a head of two
// blocks split four ways): asynchronous collectives shorten 1F1B's step, and
// the paper's placement (one more warm-up forward per barrier) more, for
// that many more micro-batches' activations on every rank.
TEST(VocabSimulationTest, TheOverlapPlacementHidesTheCollectives) {
  absl::StatusOr<SimulationCosts> costs =
      ParseSimulationCosts("F:1,B:2,OUT_S:0.5,OUT_T:1,VOCAB_COMM:0.05,VOCAB_ASYNC:1");
  ASSERT_TRUE(costs.ok()) << costs.status();
  SimulationCosts blocking = *costs;
  blocking.vocab.asynchronous = false;
  auto makespan = [](const Schedule& s, const SimulationCosts& c) {
    absl::StatusOr<SimulationResult> r = Simulate(s, c);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->makespan : -1;
  };
  EXPECT_NEAR(makespan(Made("1f1b_vocab", 4, 8), blocking), 65, 1e-9);
  EXPECT_NEAR(makespan(Made("1f1b_vocab", 4, 8), *costs), 55.55, 1e-9);
  EXPECT_NEAR(makespan(Made("1f1b_vocab_overlap", 4, 8), *costs), 53.2, 1e-9);
  EXPECT_NEAR(makespan(Made("1f1b_vocab1", 4, 8), blocking), 63.5, 1e-9);
  EXPECT_NEAR(makespan(Made("1f1b_vocab1", 4, 8), *costs), 55.4, 1e-9);
  EXPECT_NEAR(makespan(Made("1f1b_vocab1_overlap", 4, 8), *costs), 50.75, 1e-9);
  for (const auto& [name, base, extra] : {std::tuple{"1f1b_vocab_overlap", "1f1b_vocab", 2},
                                          std::tuple{"1f1b_vocab1_overlap", "1f1b_vocab1", 1}}) {
    absl::StatusOr<SimulationResult> a = Simulate(Made(base, 4, 8), *costs);
    absl::StatusOr<SimulationResult> b = Simulate(Made(name, 4, 8), *costs);
    ASSERT_TRUE(a.ok() && b.ok());
    for (int r = 0; r < 4; ++r) EXPECT_EQ(b->peak_memory[r], a->peak_memory[r] + extra) << name;
    // The same stage actions, each rank's forwards and backwards in order.
    const Schedule x = Made(base, 4, 8), y = Made(name, 4, 8);
    for (int r = 0; r < 4; ++r) {
      auto of_type = [](const std::vector<Action>& list, ActionType type) {
        std::vector<Action> out;
        for (const Action& act : list) {
          if (act.type == type) out.push_back(act);
        }
        return out;
      };
      for (ActionType type : {ActionType::kForward, ActionType::kBackward}) {
        EXPECT_EQ(of_type(x.ranks[r], type), of_type(y.ranks[r], type)) << name << " rank " << r;
      }
    }
  }
}

// A rank that posts its asynchronous collectives in another order than its
// peers is refused (the transport would pair the wrong ones), and a wait for
// a collective a rank never posts is reported as a deadlock naming it.
TEST(VocabSimulationTest, AsynchronousCollectivesInAnotherOrderOrNeverPostedAreRefused) {
  absl::StatusOr<LoweredProgram> program = Lower(Made("1f1b_vocab", 2, 4));
  ASSERT_TRUE(program.ok()) << program.status();
  absl::StatusOr<SimulationCosts> costs = ParseSimulationCosts("VOCAB_ASYNC:1");
  ASSERT_TRUE(costs.ok());
  ASSERT_TRUE(SimulateProgram(*program, *costs).ok());

  LoweredProgram reordered = *program;
  auto& list = reordered.ranks[0];
  const Action reduce1 = Vocab(ActionType::kVocabInputReduce, 1);
  const Action in_f2 = Vocab(ActionType::kVocabInputF, 2);
  const Action reduce2 = Vocab(ActionType::kVocabInputReduce, 2);
  for (const Action& a : {in_f2, reduce2}) list.erase(std::find(list.begin(), list.end(), a));
  list.insert(std::find(list.begin(), list.end(), reduce1), {in_f2, reduce2});
  EXPECT_THAT(std::string(SimulateProgram(reordered, *costs).status().message()),
              HasSubstr("every rank must post them in one order"));

  // Rank 1 never posts the last IN_BCAST (nor runs its IN_B): rank 0's IN_B
  // waits for it.
  LoweredProgram missing = *program;
  for (const Action& a :
       {Vocab(ActionType::kVocabInputBroadcast, 3), Vocab(ActionType::kVocabInputB, 3)}) {
    auto& ranks1 = missing.ranks[1];
    ranks1.erase(std::find(ranks1.begin(), ranks1.end(), a));
  }
  const std::string message(SimulateProgram(missing, *costs).status().message());
  EXPECT_THAT(message, HasSubstr("deadlock"));
  EXPECT_THAT(message, HasSubstr("IN_B3 waits for IN_BCAST3, which has not been posted by rank 1"));
}

}  // namespace
}  // namespace pp
