// Variable shapes through every registered training schedule (issue #41's
// property test): thousands of micro-batches of random rows and lengths
// (VarlenToySource) at pp 2 and 4, two chunks where the schedule takes them,
// each run to the end with p2p's dynamic shapes: no deadlock (every wait has
// the harness's timeout, so a hang fails), and receive buffers bounded by
// the pool: a rank allocates at most one buffer per size class and receive
// that can be outstanding at once (activations stashed until their backward,
// gradients until used: 2 m v per class), and far fewer than the messages it
// receives. Per (schedule, pp): 24 steps x 8 micro-batches.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipeline/runtime/equivalence_testing.h"
#include "pipeline/runtime/p2p.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace testing_runtime {
namespace {

constexpr int kSteps = 24;
constexpr int kMicrobatches = 8;

struct Shape {
  std::string schedule;
  int pp;
  int chunks;
};

void PrintTo(const Shape& s, std::ostream* os) { *os << s.schedule << "_pp" << s.pp; }

std::vector<Shape> Shapes() {
  std::vector<Shape> shapes;
  for (const ScheduleInfo& info : RegisteredSchedules()) {
    for (int pp : {2, 4}) {
      for (int chunks : {2, 1}) {
        ScheduleOptions o;
        o.num_stages = pp;
        o.num_microbatches = kMicrobatches;
        o.num_chunks = chunks;
        absl::StatusOr<Schedule> s = MakeSchedule(info.name, o);
        if (!s.ok()) continue;
        if (!s->forward_only) shapes.push_back({info.name, pp, chunks});
        break;
      }
    }
  }
  return shapes;
}

class VarlenPropertyTest : public ::testing::TestWithParam<Shape> {};

TEST_P(VarlenPropertyTest, EveryShapeRunsWithBoundedBuffers) {
  const Shape& shape = GetParam();
  RunConfig c;
  c.schedule = shape.schedule;
  c.pp = shape.pp;
  c.chunks = shape.chunks;
  c.microbatches = kMicrobatches;
  c.steps = kSteps;
  c.optimizer.lr = 0.05;
  c.varlen_seed = 1 + shape.pp;
  absl::StatusOr<RunResult> run = TrainPipeline(c);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->losses.size(), static_cast<size_t>(kSteps));
  // The size classes the activations ([rows, length, kHidden] floats) and
  // their gradients fall in.
  VarlenToySource source(c.varlen_seed, kMicrobatches);
  std::set<int64_t> classes;
  int64_t messages = 0;
  for (int step = 0; step < kSteps; ++step) {
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      absl::StatusOr<MicroBatchData> d = source.Get(step, mb);
      ASSERT_TRUE(d.ok()) << d.status();
      classes.insert(P2PBufferCapacity(d->inputs[0].numel() * kHidden));
    }
  }
  // Every stage boundary crossing ranks carries an activation and a gradient
  // per micro-batch.
  messages = 2LL * kSteps * kMicrobatches * (shape.pp * shape.chunks - 1);
  const int64_t bound = static_cast<int64_t>(classes.size()) * 2 * kMicrobatches * shape.chunks;
  EXPECT_LE(run->max_buffers_allocated_per_rank, bound)
      << classes.size() << " size classes; " << run->buffers_allocated
      << " allocated over all ranks";
  EXPECT_LT(run->buffers_allocated * 4, messages)
      << "pooling should serve most receives: " << run->buffers_allocated << " allocations, "
      << run->buffers_reused << " reuses, " << messages << " payload messages";
}

INSTANTIATE_TEST_SUITE_P(Registry, VarlenPropertyTest, ::testing::ValuesIn(Shapes()),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           std::string name =
                               absl::StrCat(info.param.schedule, "_pp", info.param.pp);
                           for (char& ch : name) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace testing_runtime
}  // namespace pp
