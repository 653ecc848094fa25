#include "pipeline/schedule/analysis/simulator.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

SimulationResult SimulateNamed(const std::string& name, int p, int m, int v = 1,
                               SimulationCosts costs = {}) {
  ScheduleOptions options;
  options.num_stages = p;
  options.num_microbatches = m;
  options.num_chunks = v;
  absl::StatusOr<Schedule> schedule = MakeSchedule(name, options);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  absl::StatusOr<SimulationResult> result = Simulate(*schedule, costs);
  EXPECT_TRUE(result.ok()) << result.status();
  return *result;
}

TEST(SimulatorTest, OneFOneBFourStagesEightMicrobatches) {
  for (bool blocking : {false, true}) {
    SimulationCosts costs;
    costs.blocking_sends = blocking;
    SimulationResult r = SimulateNamed("1f1b", 4, 8, 1, costs);
    EXPECT_DOUBLE_EQ(r.makespan, 33);
    EXPECT_DOUBLE_EQ(r.bubble_fraction, 3.0 / 11.0);
    EXPECT_THAT(r.peak_inflight, ElementsAre(4, 3, 2, 1));
    EXPECT_THAT(r.busy, ElementsAre(24, 24, 24, 24));
    EXPECT_THAT(r.idle, ElementsAre(9, 9, 9, 9));
  }
}

// Variable micro-batches (SimulationCosts::microbatch_multiplier): each
// micro-batch's computes scale by its multiplier. Multipliers of all 1 are
// the uniform model; a wrong count is refused.
TEST(SimulatorTest, PerMicroBatchMultipliersScaleTheirComputes) {
  SimulationCosts costs;
  costs.microbatch_multiplier = {1, 1, 1, 1};
  EXPECT_DOUBLE_EQ(SimulateNamed("gpipe", 2, 4, 1, costs).makespan, 15);
  costs.microbatch_multiplier = {2, 0.5, 1, 3};
  const SimulationResult r = SimulateNamed("gpipe", 2, 4, 1, costs);
  // Stage 0's forwards end at 2, 2.5, 3.5, 6.5; stage 1's last forward
  // (mb 3) at 9.5, its backwards (in order, 2F each) at 13.5, 14.5, 16.5,
  // 22.5; stage 0's at 17.5, 18.5, 20.5, and mb 3's waits for 22.5: 28.5.
  EXPECT_DOUBLE_EQ(r.makespan, 28.5);
  EXPECT_THAT(r.busy, ElementsAre(19.5, 19.5));
  costs.microbatch_multiplier = {1, 1};
  ScheduleOptions options;
  options.num_stages = 2;
  options.num_microbatches = 4;
  absl::StatusOr<SimulationResult> bad = Simulate(*MakeSchedule("gpipe", options), costs);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("microbatch_multiplier has 2"));
}

TEST(SimulatorTest, GPipeTwoStagesFourMicrobatches) {
  for (bool blocking : {false, true}) {
    SimulationCosts costs;
    costs.blocking_sends = blocking;
    SimulationResult r = SimulateNamed("gpipe", 2, 4, 1, costs);
    EXPECT_DOUBLE_EQ(r.makespan, 15);
    EXPECT_THAT(r.peak_inflight, ElementsAre(4, 4));
  }
}

// (p - 1) / (m + p - 1) for GPipe and 1F1B whenever F and B costs keep the
// ratio of the lowering (B = 2F), for many p and m.
TEST(SimulatorTest, AnalyticBubbleForGPipeAnd1F1B) {
  for (const char* name : {"gpipe", "1f1b"}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 24; ++m) {
        SimulationCosts costs;
        costs.blocking_sends = (p + m) % 2 == 0;  // both send models
        SimulationResult r = SimulateNamed(name, p, m, 1, costs);
        const double expected = (p - 1.0) / (m + p - 1.0);
        EXPECT_NEAR(r.bubble_fraction, expected, 1e-12) << name << " p=" << p << " m=" << m;
        EXPECT_DOUBLE_EQ(r.makespan, 3.0 * (m + p - 1)) << name << " p=" << p << " m=" << m;
      }
    }
  }
}

// Interleaving divides the bubble time by v: makespan = 3 (m + (p - 1) / v)
// for v chunks of 1/v the cost each, and the fraction shrinks accordingly.
TEST(SimulatorTest, InterleavingReducesTheBubble) {
  const bool blocking = false;
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      const double plain = SimulateNamed("1f1b", p, m).bubble_fraction;
      double previous = plain;
      for (int v : {2, 4}) {
        SimulationCosts costs;
        costs.forward = 1.0 / v;
        costs.backward = 2.0 / v;
        costs.blocking_sends = blocking;
        SimulationResult r = SimulateNamed("interleaved_1f1b", p, m, v, costs);
        const double bubble_time = 3.0 * (p - 1) / v;
        EXPECT_NEAR(r.makespan, 3.0 * m + bubble_time, 1e-9)
            << "p=" << p << " m=" << m << " v=" << v << " blocking=" << blocking;
        EXPECT_NEAR(r.bubble_fraction, bubble_time / (3.0 * m + bubble_time), 1e-9);
        EXPECT_LT(r.bubble_fraction, previous);
        previous = r.bubble_fraction;
        // Rendezvous sends can only be slower.
        costs.blocking_sends = true;
        EXPECT_GE(SimulateNamed("interleaved_1f1b", p, m, v, costs).makespan, r.makespan - 1e-9);
      }
    }
  }
}

TEST(SimulatorTest, CommunicationLatencyLengthensThePipeline) {
  SimulationCosts costs;
  costs.comm = 0.5;
  SimulationResult r = SimulateNamed("gpipe", 2, 1, 1, costs);
  // F0 on rank 0, message, F0 and B0 on rank 1, message, B0 on rank 0.
  EXPECT_DOUBLE_EQ(r.makespan, 1 + 0.5 + 1 + 2 + 0.5 + 2);
}

// A SEND/RECV pair of a control word and a payload costs comm plus each
// transport message's latency + bytes / bandwidth.
TEST(SimulatorTest, MessageModelAddsLatencyAndBytesPerMessage) {
  SimulationCosts costs;
  costs.comm = 0.1;
  costs.message.latency = 0.05;
  costs.message.per_byte = 0.001;
  costs.message_bytes = {100, 200};  // 0.05 + 0.1, 0.05 + 0.2
  SimulationResult r = SimulateNamed("gpipe", 2, 1, 1, costs);
  EXPECT_DOUBLE_EQ(r.makespan, 1 + 0.5 + 1 + 2 + 0.5 + 2);
  costs.message_bytes = {-1};
  ScheduleOptions options;
  options.num_stages = 2;
  EXPECT_THAT(std::string(Simulate(*MakeSchedule("gpipe", options), costs).status().message()),
              HasSubstr("negative size -1"));
  costs.message_bytes = {};
  costs.message.per_byte = -1;
  EXPECT_FALSE(Simulate(*MakeSchedule("gpipe", options), costs).ok());
}

TEST(FitMessageCostTest, RecoversLatencyAndBandwidth) {
  std::vector<MessageSample> samples;
  for (double bytes : {512.0, 4096.0, 65536.0, 1048576.0}) {
    samples.push_back({bytes, 20e-6 + bytes / 2e9});
  }
  absl::StatusOr<MessageCost> fit = FitMessageCost(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->latency, 20e-6, 1e-12);
  EXPECT_NEAR(fit->per_byte, 1 / 2e9, 1e-18);
  EXPECT_NEAR(fit->Of(1e6), 20e-6 + 1e6 / 2e9, 1e-12);
}

TEST(FitMessageCostTest, NoisySamplesFitWithinTheNoise) {
  // +-5% alternating noise around 10 us + 1 ns/byte, two samples per size.
  std::vector<MessageSample> samples;
  for (double bytes : {1e3, 1e4, 1e5, 1e6}) {
    const double t = 10e-6 + bytes * 1e-9;
    samples.push_back({bytes, t * 1.05});
    samples.push_back({bytes, t * 0.95});
  }
  absl::StatusOr<MessageCost> fit = FitMessageCost(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->latency, 10e-6, 1e-6);
  EXPECT_NEAR(fit->per_byte, 1e-9, 0.05e-9);
}

TEST(FitMessageCostTest, KeepsBothParametersNonNegative) {
  // Time falls with size: no bandwidth term, latency is the weighted mean.
  absl::StatusOr<MessageCost> flat = FitMessageCost({{100, 2e-5}, {1000, 1e-5}});
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(flat->per_byte, 0);
  EXPECT_GT(flat->latency, 1e-5);
  EXPECT_LT(flat->latency, 2e-5);
  // Time grows faster than proportionally: the line would cross zero above
  // 0 bytes, so it goes through the origin instead.
  absl::StatusOr<MessageCost> origin = FitMessageCost({{100, 1e-6}, {1000, 2e-5}});
  ASSERT_TRUE(origin.ok()) << origin.status();
  EXPECT_EQ(origin->latency, 0);
  EXPECT_GT(origin->per_byte, 0);
}

TEST(FitMessageCostTest, RejectsTooFewSizesAndBadSamples) {
  EXPECT_THAT(std::string(FitMessageCost({{100, 1e-5}, {100, 2e-5}}).status().message()),
              HasSubstr("at least 2 distinct sizes; got 1"));
  EXPECT_FALSE(FitMessageCost({}).ok());
  EXPECT_THAT(std::string(FitMessageCost({{100, 1e-5}, {-5, 1e-5}}).status().message()),
              HasSubstr("message sample 1 (bytes -5"));
  EXPECT_FALSE(FitMessageCost({{100, 1e-5}, {200, 0}}).ok());
}

TEST(SimulatorTest, StageMultipliersScaleCompute) {
  SimulationCosts costs;
  costs.stage_multiplier = {1, 2};
  SimulationResult r = SimulateNamed("gpipe", 2, 1, 1, costs);
  EXPECT_DOUBLE_EQ(r.makespan, 1 + 2 + 4 + 2);
  EXPECT_THAT(r.busy, ElementsAre(3, 6));
  costs.stage_multiplier = {1};
  ScheduleOptions options;
  options.num_stages = 2;
  EXPECT_FALSE(Simulate(*MakeSchedule("gpipe", options), costs).ok());
}

TEST(SimulatorTest, InferenceKeepsOneActivation) {
  SimulationResult r = SimulateNamed("inference", 4, 8);
  EXPECT_DOUBLE_EQ(r.makespan, 8 + 3);
  EXPECT_THAT(r.peak_inflight, ElementsAre(1, 1, 1, 1));
}

TEST(SimulatorTest, TimelineHasComputeAndMessages) {
  SimulationResult r = SimulateNamed("1f1b", 2, 2);
  int computes = 0, messages = 0;
  for (const TraceEvent& e : r.timeline) {
    absl::StatusOr<Action> a = ParseAction(e.name);
    ASSERT_TRUE(a.ok());
    EXPECT_LE(e.start, e.end);
    computes += IsCompute(a->type);
    messages += IsCommunication(a->type);
  }
  EXPECT_EQ(computes, 8);
  EXPECT_EQ(messages, 8);  // 2 activations + 2 gradients, both ends
}

TEST(SimulationCostsTest, ParsesAndRejects) {
  absl::StatusOr<SimulationCosts> c = ParseSimulationCosts("F:1,B:2.5,W:0,comm:0.1");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->forward, 1);
  EXPECT_DOUBLE_EQ(c->backward, 2.5);
  EXPECT_DOUBLE_EQ(c->backward_weight, 0);
  EXPECT_DOUBLE_EQ(c->comm, 0.1);
  EXPECT_THAT(std::string(ParseSimulationCosts("X:1").status().message()), HasSubstr("\"X\""));
  EXPECT_FALSE(ParseSimulationCosts("F:-1").ok());
  // Issue #42 class 8: finite costs whose sums overflowed gave makespan inf.
  EXPECT_THAT(std::string(ParseSimulationCosts("F:1e308,B:1e308").status().message()),
              HasSubstr("bad cost \"F:1e308\" in \"F:1e308,B:1e308\": expected KEY:VALUE with "
                        "KEY in F, B, I, W, comm, SEND, RECV, STEP, REDUCE_TIED, REDUCE_GRAD, "
                        "OUT_S, OUT_T, IN_F, IN_B, VOCAB_COMM, VOCAB_BARRIERS, VOCAB_ASYNC and "
                        "VALUE a number in [0, 1e+12]"));
  EXPECT_THAT(std::string(ParseSimulationCosts("VOCAB_BARRIERS:3").status().message()),
              HasSubstr("must be 1 or 2"));
  EXPECT_THAT(std::string(ParseSimulationCosts("VOCAB_ASYNC:2").status().message()),
              HasSubstr("cost VOCAB_ASYNC:2 must be 0"));
  EXPECT_TRUE(ParseSimulationCosts("VOCAB_ASYNC:1")->vocab.asynchronous);
  EXPECT_FALSE(ParseSimulationCosts("VOCAB_ASYNC:0")->vocab.asynchronous);
  // The vocabulary passes' costs.
  c = ParseSimulationCosts("OUT_S:0.5,OUT_T:1,IN_F:0.1,IN_B:0.2,VOCAB_COMM:0.05");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->vocab.output_s, 0.5);
  EXPECT_DOUBLE_EQ(c->vocab.output_t, 1);
  EXPECT_DOUBLE_EQ(c->vocab.input_f, 0.1);
  EXPECT_DOUBLE_EQ(c->vocab.input_b, 0.2);
  EXPECT_DOUBLE_EQ(c->vocab.collective, 0.05);
  EXPECT_FALSE(ParseStageCosts("0:F:1e13").ok());
  EXPECT_FALSE(ParseRankCosts("0:STEP:1e13").ok());
  EXPECT_TRUE(ParseSimulationCosts("F:1e12").ok());
  EXPECT_FALSE(ParseSimulationCosts("F=1").ok());
}

SimulationCosts EqualFIW() {
  absl::StatusOr<SimulationCosts> costs = ParseSimulationCosts("F:1,I:1,W:1");
  EXPECT_TRUE(costs.ok()) << costs.status();
  return *costs;
}

// Per rank: time from its first compute's start to its last compute's end.
std::vector<double> ComputeSpans(const SimulationResult& r, int p) {
  std::vector<double> first(p, 1e300), last(p, 0);
  for (const TraceEvent& e : r.timeline) {
    if (!IsCompute(ParseAction(e.name)->type)) continue;
    first[e.rank] = std::min(first[e.rank], e.start);
    last[e.rank] = std::max(last[e.rank], e.end);
  }
  std::vector<double> spans(p);
  for (int i = 0; i < p; ++i) spans[i] = last[i] - first[i];
  return spans;
}

// zb_h1 with F = I = W: 1F1B's peak in-flight count (p, on rank 0) and a
// third of its bubble: idle (p - 1)(F + I - W) per rank against
// (p - 1)(F + I + W) (the paper's Table 2).
TEST(ZeroBubbleSimulationTest, H1KeepsMemoryAndCutsTheBubbleToAThird) {
  for (int p : {2, 3, 4, 6, 8}) {
    for (int m : {p, 2 * p, 3 * p + 1}) {
      SimulationResult zb = SimulateNamed("zb_h1", p, m, 1, EqualFIW());
      SimulationResult base = SimulateNamed("1f1b", p, m, 1, EqualFIW());
      EXPECT_EQ(*std::max_element(zb.peak_inflight.begin(), zb.peak_inflight.end()),
                *std::max_element(base.peak_inflight.begin(), base.peak_inflight.end()))
          << "p=" << p << " m=" << m;
      EXPECT_LE(*std::max_element(zb.peak_memory.begin(), zb.peak_memory.end()),
                *std::max_element(base.peak_memory.begin(), base.peak_memory.end()) + 1e-12);
      EXPECT_DOUBLE_EQ(base.makespan, 3.0 * m + 3.0 * (p - 1)) << "p=" << p << " m=" << m;
      EXPECT_DOUBLE_EQ(zb.makespan, 3.0 * m + 1.0 * (p - 1)) << "p=" << p << " m=" << m;
      for (int r = 0; r < p; ++r) EXPECT_DOUBLE_EQ(zb.idle[r] * 3, base.idle[r]);
    }
  }
}

// zb_h2 with F = I = W and m >= 2p - 1: 2p - 1 activations in flight on every
// rank and no idle time between a rank's first and last compute (the
// parallelogram), so the only bubble is the start offset of r forwards.
TEST(ZeroBubbleSimulationTest, H2HasNoIdleInsideARank) {
  for (int p : {2, 3, 4, 6, 8}) {
    for (int m : {2 * p - 1, 2 * p, 3 * p + 1}) {
      SimulationResult zb = SimulateNamed("zb_h2", p, m, 1, EqualFIW());
      std::vector<double> spans = ComputeSpans(zb, p);
      for (int r = 0; r < p; ++r) {
        EXPECT_NEAR(zb.inner_idle[r], 0, 1e-9) << "p=" << p << " m=" << m << " r=" << r;
        EXPECT_EQ(zb.peak_inflight[r], 2 * p - 1) << "p=" << p << " m=" << m << " r=" << r;
        EXPECT_DOUBLE_EQ(spans[r], 3.0 * m) << "p=" << p << " m=" << m << " r=" << r;
      }
      EXPECT_DOUBLE_EQ(zb.makespan, 3.0 * m + (p - 1));
    }
  }
  // zb_h1 does idle inside rank 0's span: (p - 1)(F + I - W) = 3 for p = 4.
  SimulationResult h1 = SimulateNamed("zb_h1", 4, 8, 1, EqualFIW());
  EXPECT_DOUBLE_EQ(ComputeSpans(h1, 4)[0], 27);
  // Rank r starts at r and ends at 27: idle inside 3 - r.
  EXPECT_THAT(h1.inner_idle, ElementsAre(3, 2, 1, 0));
}

// zb_h2 with m < 2p - 1 (F = I = W): a rank that waits for a gradient runs
// a pending W (the zero-bubble authors' bubble filling), so p = 4, m = 4
// takes their ZB-2p's 15 (the lower bound: rank 3 starts at 3 and works 12),
// not 16; never slower than the delay rule alone, never more memory than
// 2p - 1 activations.
TEST(ZeroBubbleSimulationTest, H2FillsWaitsWithWBelowTwoPMinusOne) {
  SimulationResult zb = SimulateNamed("zb_h2", 4, 4, 1, EqualFIW());
  EXPECT_DOUBLE_EQ(zb.makespan, 15);
  for (int p : {2, 3, 4, 6, 8}) {
    for (int m = 1; m < 2 * p - 1; ++m) {
      SimulationResult h2 = SimulateNamed("zb_h2", p, m, 1, EqualFIW());
      // No slower than zb_h1 and not below rank p - 1's start plus its work.
      SimulationResult h1 = SimulateNamed("zb_h1", p, m, 1, EqualFIW());
      EXPECT_LE(h2.makespan, h1.makespan + 1e-9) << "p=" << p << " m=" << m;
      EXPECT_GE(h2.makespan, 3.0 * m + (p - 1) - 1e-9) << "p=" << p << " m=" << m;
      for (int r = 0; r < p; ++r) EXPECT_LE(h2.peak_inflight[r], 2 * p - 1);
    }
  }
}

// vhalf (vhalf.cc) against zbv and 1F1B, each rank's work the same (F, I and
// W cost 1 per rank's layers: 1/2 per chunk under V placement): the paper's
// V-Half memory, at most p + 2 virtual-stage activations per rank at even p
// (p + 1 at odd p) where zbv holds 2p, every rank alike once m >= 2p, for a
// makespan below 1F1B's and at most p / 2 + 1 above zbv's.
TEST(VHalfSimulationTest, ZbvsWorkInAboutHalfItsMemory) {
  absl::StatusOr<SimulationCosts> half = ParseSimulationCosts("F:0.5,I:0.5,W:0.5");
  ASSERT_TRUE(half.ok()) << half.status();
  for (int p : {2, 3, 4, 6, 8}) {
    for (int m : {1, p, 2 * p, 3 * p + 1}) {
      SimulationResult vhalf = SimulateNamed("vhalf", p, m, 2, *half);
      SimulationResult zbv = SimulateNamed("zbv", p, m, 2, *half);
      SimulationResult base = SimulateNamed("1f1b", p, m, 1, EqualFIW());
      const int block = p % 2 == 0 ? p + 2 : p + 1;
      const int zbv_peak = *std::max_element(zbv.peak_inflight.begin(), zbv.peak_inflight.end());
      for (int r = 0; r < p; ++r) {
        EXPECT_LE(vhalf.peak_inflight[r], std::min(block, zbv_peak))
            << "p=" << p << " m=" << m << " r=" << r;
        if (m >= 2 * p) {
          EXPECT_EQ(vhalf.peak_inflight[r], block) << "p=" << p << " m=" << m;
        }
      }
      if (m >= 2 * p && p > 2) {
        EXPECT_EQ(zbv_peak, 2 * p);
      }
      EXPECT_LT(vhalf.makespan, base.makespan) << "p=" << p << " m=" << m;
      if (m >= 2 * p) {
        EXPECT_LE(vhalf.makespan, zbv.makespan + p / 2 + 1) << "p=" << p << " m=" << m;
      }
    }
  }
}

// F adds 1, B frees 1, I frees 42/74 and W 32/74 by default.
TEST(SimulatorMemoryTest, PeakMemoryFollowsTheSplit) {
  SimulationResult base = SimulateNamed("1f1b", 4, 8);
  EXPECT_THAT(base.peak_memory, ElementsAre(4, 3, 2, 1));
  // zb_h1, rank 3: F I pairs hold 32/74 each until W; the fourth F on top of
  // three I-only micro-batches is the peak.
  SimulationResult zb = SimulateNamed("zb_h1", 4, 8, 1, EqualFIW());
  EXPECT_DOUBLE_EQ(zb.peak_memory[0], 4);
  EXPECT_NEAR(zb.peak_memory[3], 1 + 3 * 32.0 / 74, 1e-12);
  EXPECT_NEAR(zb.peak_memory[1], 3 + 1 * 32.0 / 74, 1e-12);
  // I frees nothing: every F not yet W'd counts in full.
  SimulationCosts costs = EqualFIW();
  costs.memory = {0, 1};
  zb = SimulateNamed("zb_h1", 4, 8, 1, costs);
  EXPECT_THAT(zb.peak_memory, ElementsAre(4, 4, 4, 4));
  costs.memory = {0, 0};
  ScheduleOptions options;
  options.num_stages = 2;
  absl::StatusOr<SimulationResult> bad = Simulate(*MakeSchedule("zb_h1", options), costs);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("memory split"));
}

TEST(SimulationCostsTest, BackwardDefaultsToInputPlusWeight) {
  absl::StatusOr<SimulationCosts> c = ParseSimulationCosts("F:1,I:1.5,W:0.5");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->backward, 2);
  c = ParseSimulationCosts("F:1,B:5,I:1,W:1");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->backward, 5);
}

TEST(MemorySplitTest, ParsesAndRejects) {
  absl::StatusOr<MemorySplit> m = ParseMemorySplit("I:1,W:3");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_DOUBLE_EQ(m->InputFraction(), 0.25);
  EXPECT_NEAR(ParseMemorySplit("")->InputFraction(), 42.0 / 74, 1e-12);
  EXPECT_THAT(std::string(ParseMemorySplit("B:1").status().message()), HasSubstr("\"B\""));
  EXPECT_FALSE(ParseMemorySplit("I:-1").ok());
  EXPECT_THAT(std::string(ParseMemorySplit("I:0,W:0").status().message()), HasSubstr("> 0"));
}

// Tail, per-stage and send costs. The base case: gpipe, p = 2, m = 2, F = 1,
// B = 2: rank 0 computes F [0,1] [1,2], B [5,7] [7,9]; rank 1 F [1,2]
// [2,3], B [3,5] [5,7]. Makespan 9.
TEST(SimulatorCostModelTest, BaseCase) {
  EXPECT_DOUBLE_EQ(SimulateNamed("gpipe", 2, 2).makespan, 9);
}

// Stage 1's own F = 3: rank 1 F [1,4] [4,7], B [7,9] [9,11]; rank 0 B
// [9,11] [11,13]. The stage's own cost ignores the multiplier: with
// multipliers 2, stage 0 costs F 2, B 4 and stage 1 F 3 (own), B 4: rank 0
// F [0,2] [2,4], rank 1 F [2,5] [5,8], B [8,12] [12,16], rank 0 B [12,16]
// [16,20].
TEST(SimulatorCostModelTest, PerStageCostsOverrideTheGlobalOnes) {
  SimulationCosts costs;
  costs.stage_costs[1].forward = 3;
  SimulationResult r = SimulateNamed("gpipe", 2, 2, 1, costs);
  EXPECT_DOUBLE_EQ(r.makespan, 13);
  EXPECT_THAT(r.busy, ElementsAre(6, 10));
  costs.stage_multiplier = {2, 2};
  EXPECT_DOUBLE_EQ(SimulateNamed("gpipe", 2, 2, 1, costs).makespan, 20);
  // Own I and W without B: B = I + W (here 1 + 3 = 4 on stage 0: rank 0's
  // B [5,9] [9,13]).
  costs = {};
  costs.stage_costs[0].backward_input = 1;
  costs.stage_costs[0].backward_weight = 3;
  EXPECT_DOUBLE_EQ(SimulateNamed("gpipe", 2, 2, 1, costs).makespan, 13);
  // A split backward takes the stage's own I and W: zb_h1, p = 2, m = 1:
  // 1F0 [1,2] 1I0 [2,6] 1W0 [6,7], rank 0 0F0 [0,1] 0I0 [6,7] 0W0 [7,8] with stage 1's I = 4.
  costs = EqualFIW();
  costs.stage_costs[1].backward_input = 4;
  EXPECT_DOUBLE_EQ(SimulateNamed("zb_h1", 2, 1, 1, costs).makespan, 8);
}

// Tail costs: REDUCE_TIED 0.25 (a collective of both ranks by default),
// REDUCE_GRAD 0.5 (local), STEP 1 on rank 0 and 5 on rank 1 (local unless
// step_all_reduce). Rank 0 computes until 9, rank 1 until 7.
TEST(SimulatorCostModelTest, TailCostsAndCollectives) {
  SimulationCosts costs;
  costs.reduce_tied = 0.25;
  costs.reduce_grad = 0.5;
  costs.step = 1;
  costs.rank_costs[1].step = 5;
  // REDUCE_TIED gathers at 9: rank 1 9.25, 9.75, 14.75.
  SimulationResult r = SimulateNamed("gpipe", 2, 2, 1, costs);
  EXPECT_DOUBLE_EQ(r.makespan, 14.75);
  EXPECT_THAT(r.busy, ElementsAre(6, 6));  // the tail is not compute
  std::vector<std::string> tail;
  for (const TraceEvent& e : r.timeline) {
    if (e.rank == 1 && IsTail(ParseAction(e.name)->type)) {
      tail.push_back(absl::StrCat(e.name, "@", e.start, "-", e.end));
    }
  }
  EXPECT_THAT(tail, ElementsAre("REDUCE_TIED@9-9.25", "1REDUCE_GRAD@9.25-9.75", "STEP@9.75-14.75"));
  // No tie groups: REDUCE_TIED is a no-op; rank 1 ends at 7 + 0.5 + 5, rank 0
  // at 9 + 0.5 + 1.
  costs.tie_groups.emplace();
  EXPECT_DOUBLE_EQ(SimulateNamed("gpipe", 2, 2, 1, costs).makespan, 12.5);
  // STEP all-reduces the norm: it starts on both at 9.5; rank 1 ends 14.5.
  costs.step_all_reduce = true;
  EXPECT_DOUBLE_EQ(SimulateNamed("gpipe", 2, 2, 1, costs).makespan, 14.5);
}

// Tie groups name virtual stages; only their ranks synchronise. gpipe, p = 4,
// m = 1: rank r ends its B at 12 - 2r. Tying stages 0 and 3 makes ranks 0
// and 3 meet at 12; ranks 1 and 2 are in no group (REDUCE_TIED costs 0).
TEST(SimulatorCostModelTest, TieGroupsChooseTheParticipants) {
  SimulationCosts costs;
  costs.reduce_tied = 1;
  costs.tie_groups = std::vector<std::vector<int>>{{0, 3}};
  SimulationResult r = SimulateNamed("gpipe", 4, 1, 1, costs);
  EXPECT_DOUBLE_EQ(r.makespan, 13);
  std::vector<std::string> tied;
  for (const TraceEvent& e : r.timeline) {
    if (e.name == "REDUCE_TIED") tied.push_back(absl::StrCat(e.rank, "@", e.start, "-", e.end));
  }
  EXPECT_THAT(tied, ElementsAre("0@12-13", "3@12-13"));
  // Stages 1 and 2 tied instead: ranks 1 and 2 meet at 10; rank 0 ends at 12.
  costs.tie_groups = std::vector<std::vector<int>>{{1, 2}};
  EXPECT_DOUBLE_EQ(SimulateNamed("gpipe", 4, 1, 1, costs).makespan, 12);
  // Groups {0, 1} and {1, 3} link ranks 0, 1, 3 into one collective at 12.
  costs.tie_groups = std::vector<std::vector<int>>{{0, 1}, {1, 3}};
  r = SimulateNamed("gpipe", 4, 1, 1, costs);
  tied.clear();
  for (const TraceEvent& e : r.timeline) {
    if (e.name == "REDUCE_TIED") tied.push_back(absl::StrCat(e.rank, "@", e.start, "-", e.end));
  }
  EXPECT_THAT(tied, ElementsAre("0@12-13", "1@12-13", "3@12-13"));
}

// SEND 0.5 on the sending rank, buffered: rank 0 F [0,1] SEND [1,1.5] F
// [1.5,2.5] SEND [2.5,3]; rank 1 F [1.5,2.5] [3,4], B [4,6] SEND [6,6.5] B
// [6.5,8.5] SEND [8.5,9]; rank 0 B [6.5,8.5] [9,11]. Rendezvous: each pair
// ends at max(ready) + 0.5: the same times here. Rank 1's own SEND 0: its
// gradients arrive at 6 and 8, rank 0 B [6,8] [8,10].
TEST(SimulatorCostModelTest, SendCostOccupiesTheSender) {
  for (bool blocking : {false, true}) {
    SimulationCosts costs;
    costs.blocking_sends = blocking;
    costs.send = 0.5;
    EXPECT_DOUBLE_EQ(SimulateNamed("gpipe", 2, 2, 1, costs).makespan, 11) << blocking;
    costs.rank_costs[1].send = 0;
    EXPECT_DOUBLE_EQ(SimulateNamed("gpipe", 2, 2, 1, costs).makespan, 10) << blocking;
  }
}

// RECV 0.5 on the receiving rank once the message is there: rank 1 RECV
// [1,1.5] F [1.5,2.5] RECV (its message came at 2) [2.5,3] F [3,4], B [4,6]
// [6,8]; rank 0 RECV [6,6.5] B [6.5,8.5] RECV [8.5,9] B [9,11]. Rendezvous:
// each pair ends at max(ready) + 0.5, the same times here. Rank 0's own RECV
// 0: its B [6,8] [8,10].
TEST(SimulatorCostModelTest, RecvCostOccupiesTheReceiver) {
  for (bool blocking : {false, true}) {
    SimulationCosts costs;
    costs.blocking_sends = blocking;
    costs.recv = 0.5;
    EXPECT_DOUBLE_EQ(SimulateNamed("gpipe", 2, 2, 1, costs).makespan, 11) << blocking;
    costs.rank_costs[0].recv = 0;
    EXPECT_DOUBLE_EQ(SimulateNamed("gpipe", 2, 2, 1, costs).makespan, 10) << blocking;
  }
}

TEST(SimulatorCostModelTest, RejectsBadStagesRanksAndCosts) {
  ScheduleOptions options;
  options.num_stages = 2;
  options.num_microbatches = 2;
  const Schedule schedule = *MakeSchedule("gpipe", options);
  SimulationCosts costs;
  costs.stage_costs[2].forward = 1;
  EXPECT_THAT(std::string(Simulate(schedule, costs).status().message()),
              AllOf(HasSubstr("stage 2"), HasSubstr("0..1")));
  costs = {};
  costs.stage_costs[0].backward = -1;
  EXPECT_THAT(std::string(Simulate(schedule, costs).status().message()),
              AllOf(HasSubstr("stage 0"), HasSubstr(" B ")));
  costs = {};
  costs.rank_costs[2].step = 1;
  EXPECT_THAT(std::string(Simulate(schedule, costs).status().message()), HasSubstr("rank 2"));
  costs = {};
  costs.tie_groups = std::vector<std::vector<int>>{{0, 5}};
  EXPECT_THAT(std::string(Simulate(schedule, costs).status().message()),
              HasSubstr("tie group stage 5"));
  costs = {};
  costs.step = -1;
  EXPECT_THAT(std::string(Simulate(schedule, costs).status().message()), HasSubstr("STEP"));
}

// A collective that a participant reaches in another order never gathers.
TEST(SimulatorCostModelTest, MismatchedCollectivesDeadlock) {
  LoweredProgram program;
  program.schedule_name = "hand";
  program.num_stages = 2;
  program.num_microbatches = 1;
  program.stage_to_rank = {0, 1};
  program.ranks = {*ParseActions("0F0 0SEND_F0 0RECV_B0 0B0 REDUCE_TIED STEP"),
                   *ParseActions("1RECV_F0 1F0 1B0 1SEND_B0 STEP REDUCE_TIED")};
  SimulationCosts costs;
  EXPECT_TRUE(SimulateProgram(program, costs).ok());  // STEP is local
  costs.step_all_reduce = true;
  absl::StatusOr<SimulationResult> r = SimulateProgram(program, costs);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(
      std::string(r.status().message()),
      AllOf(HasSubstr("deadlock"), HasSubstr("REDUCE_TIED waits for the other participants"),
            HasSubstr("rank 1 is at step 4: STEP")));
}

TEST(SimulationCostsTest, ParsesTailSendStageAndRankCosts) {
  absl::StatusOr<SimulationCosts> c =
      ParseSimulationCosts("F:1,B:2,SEND:0.1,RECV:0.2,STEP:3,REDUCE_TIED:0.5,REDUCE_GRAD:0.25");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->send, 0.1);
  EXPECT_DOUBLE_EQ(c->recv, 0.2);
  EXPECT_DOUBLE_EQ(c->step, 3);
  EXPECT_DOUBLE_EQ(c->reduce_tied, 0.5);
  EXPECT_DOUBLE_EQ(c->reduce_grad, 0.25);

  absl::StatusOr<std::map<int, StageCosts>> s =
      ParseStageCosts("0:F:1,B:2;1:F:1.2,I:1,W:1.1,REDUCE_GRAD:0.3");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(*s->at(0).forward, 1);
  EXPECT_DOUBLE_EQ(*s->at(0).backward, 2);
  EXPECT_FALSE(s->at(0).backward_input.has_value());
  EXPECT_DOUBLE_EQ(*s->at(1).backward, 2.1);
  EXPECT_DOUBLE_EQ(*s->at(1).reduce_grad, 0.3);
  EXPECT_TRUE(ParseStageCosts("")->empty());
  EXPECT_THAT(std::string(ParseStageCosts("x:F:1").status().message()), HasSubstr("\"x:F:1\""));
  EXPECT_THAT(std::string(ParseStageCosts("0:STEP:1").status().message()), HasSubstr("\"STEP\""));
  EXPECT_THAT(std::string(ParseStageCosts("0:F:-1").status().message()), HasSubstr("\"F:-1\""));
  EXPECT_THAT(std::string(ParseStageCosts("0:F:1;0:B:1").status().message()),
              HasSubstr("stage 0 is given twice"));

  absl::StatusOr<std::map<int, RankCosts>> r =
      ParseRankCosts("0:STEP:0.005,SEND:0.0002;1:STEP:0.008,REDUCE_TIED:1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(*r->at(0).step, 0.005);
  EXPECT_DOUBLE_EQ(*r->at(0).send, 0.0002);
  EXPECT_FALSE(r->at(0).reduce_tied.has_value());
  EXPECT_DOUBLE_EQ(*r->at(1).reduce_tied, 1);
  EXPECT_THAT(std::string(ParseRankCosts("0:F:1").status().message()), HasSubstr("\"F\""));
  EXPECT_THAT(std::string(ParseRankCosts("-1:STEP:1").status().message()),
              HasSubstr("\"-1:STEP:1\""));
}

TEST(SimulationCostsTest, ParsesTieGroups) {
  EXPECT_FALSE(ParseTieGroups("")->has_value());
  EXPECT_TRUE(ParseTieGroups("none")->value().empty());
  absl::StatusOr<std::optional<std::vector<std::vector<int>>>> g = ParseTieGroups("0,3;1,2");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(**g, ElementsAre(ElementsAre(0, 3), ElementsAre(1, 2)));
  EXPECT_THAT(std::string(ParseTieGroups("0").status().message()), HasSubstr("fewer than 2"));
  EXPECT_THAT(std::string(ParseTieGroups("0,a").status().message()), HasSubstr("\"a\""));
  EXPECT_THAT(std::string(ParseTieGroups("0,-3").status().message()), HasSubstr("\"-3\""));
}

// The figures-only simulation (what Synthesize evaluates) gives every figure
// of the full one, with no timeline. Covering set: one schedule per family
// with a split backward, OVERLAP_F_B, V placement or interleaving, under
// per-stage, tail, send and comm costs, receives deferred or not.
TEST(SimulateFiguresAsExecutedTest, SameFiguresWithoutTheTimeline) {
  absl::StatusOr<SimulationCosts> costs =
      ParseSimulationCosts("F:1,I:1.2,W:0.7,comm:0.3,SEND:0.05,STEP:0.4,REDUCE_TIED:0.2");
  ASSERT_TRUE(costs.ok()) << costs.status();
  costs->step_all_reduce = true;
  for (const auto& [name, v] : std::vector<std::pair<std::string, int>>{
           {"1f1b", 1}, {"zb_h2", 1}, {"interleaved_zb", 2}, {"zbv", 2}, {"dualpipev", 2}}) {
    ScheduleOptions options;
    options.num_stages = 4;
    options.num_microbatches = 8;
    options.num_chunks = v;
    absl::StatusOr<Schedule> schedule = MakeSchedule(name, options);
    ASSERT_TRUE(schedule.ok()) << name << ": " << schedule.status();
    SimulationCosts with_stage = *costs;
    with_stage.stage_costs[1].forward = 2.5;
    for (bool defer : {false, true}) {
      SCOPED_TRACE(absl::StrCat(name, defer ? " deferred" : " as lowered"));
      absl::StatusOr<SimulationResult> full = SimulateAsExecuted(*schedule, with_stage, defer);
      absl::StatusOr<SimulationResult> figures =
          SimulateFiguresAsExecuted(*schedule, with_stage, defer);
      ASSERT_TRUE(full.ok()) << full.status();
      ASSERT_TRUE(figures.ok()) << figures.status();
      EXPECT_FALSE(full->timeline.empty());
      EXPECT_TRUE(figures->timeline.empty());
      EXPECT_EQ(figures->makespan, full->makespan);
      EXPECT_EQ(figures->busy, full->busy);
      EXPECT_EQ(figures->idle, full->idle);
      EXPECT_EQ(figures->bubble_fraction, full->bubble_fraction);
      EXPECT_EQ(figures->inner_idle, full->inner_idle);
      EXPECT_EQ(figures->peak_inflight, full->peak_inflight);
      EXPECT_EQ(figures->peak_memory, full->peak_memory);
    }
  }
  // Errors are the full simulation's.
  ScheduleOptions options;
  options.num_stages = 2;
  options.num_microbatches = 2;
  absl::StatusOr<Schedule> schedule = MakeSchedule("1f1b", options);
  ASSERT_TRUE(schedule.ok());
  SimulationCosts bad;
  bad.forward = -1;
  EXPECT_EQ(SimulateFiguresAsExecuted(*schedule, bad, false).status(),
            SimulateAsExecuted(*schedule, bad, false).status());
}

}  // namespace
}  // namespace pp
