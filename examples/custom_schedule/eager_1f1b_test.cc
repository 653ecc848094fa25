// The example schedule runs the conformance suite (linked in through the
// `conformance` target, instantiated for every schedule linked here:
// eager_1f1b and 1f1b) plus checks of its own order, memory and timing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

using ::testing::ElementsAre;

SimulationResult Sim(const std::string& name, double comm) {
  SimulationCosts costs;
  costs.comm = comm;
  absl::StatusOr<SimulationResult> r = Simulate(*MakeSchedule(name, {4, 8, 1, 0}), costs);
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

TEST(Eager1F1BTest, OneMoreWarmupForwardThan1F1B) {
  Schedule s = *MakeSchedule("eager_1f1b", {4, 8, 1, 0});
  EXPECT_EQ(ActionsToString(s.ranks[3]),
            "3F0 3F1 3B0 3F2 3B1 3F3 3B2 3F4 3B3 3F5 3B4 3F6 3B5 3F7 3B6 3B7");
  EXPECT_EQ(ActionsToString(s.ranks[0]),
            "0F0 0F1 0F2 0F3 0F4 0B0 0F5 0B1 0F6 0B2 0F7 0B3 0B4 0B5 0B6 0B7");
  // Warm-up p - r = 2 > m = 1 is capped at m.
  EXPECT_EQ(ActionsToString(MakeSchedule("eager_1f1b", {2, 1, 1, 0})->ranks[0]), "0F0 0B0");
}

TEST(Eager1F1BTest, OneMoreActivationSameIdealMakespan) {
  SimulationResult r = Sim("eager_1f1b", 0);
  EXPECT_THAT(r.peak_inflight, ElementsAre(5, 4, 3, 2));  // p - r + 1
  EXPECT_DOUBLE_EQ(r.makespan, 3 * (8 + 4 - 1));          // (m + p - 1)(F + B)
}

TEST(Eager1F1BTest, HidesSomeMessageLatency) {
  // The extra forward is ready when a late gradient arrives.
  EXPECT_LT(Sim("eager_1f1b", 0.5).makespan, Sim("1f1b", 0.5).makespan);
}

}  // namespace
}  // namespace pp
