// "synth": the synthesiser (synthesis.h) as a registered schedule (looped
// placement, any v), so every suite that iterates the registry (conformance,
// equivalence) covers its output. Without measured costs they synthesise for
// uniform costs (F = I = W = 1 per virtual stage) under 1F1B's peak memory in
// the same bytes (min(p, m) * v virtual-stage activations), with two list-scheduling variants and
// no local search (the conformance suite asks for 384 shapes, twice each); schedule_explorer
// --synthesize and bench_synthesis take costs, a cap and a larger budget, and the V placement
// (registered once, not twice, to keep the equivalence suite's run time: each registered name adds
// its cases).
#include <map>
#include <mutex>
#include <tuple>

#include "pipeline/schedule/schedules/registry.h"
#include "pipeline/schedule/schedules/synthesis.h"

namespace pp {
namespace {

constexpr int kRegisteredEvaluations = 0;

absl::StatusOr<Schedule> MakeSynth(const ScheduleOptions& options) {
  if (absl::Status common = CheckCommonOptions(options); !common.ok()) return common;
  // Deterministic, so one result per shape per process (suites ask twice).
  static std::mutex mutex;
  static auto* cache = new std::map<std::tuple<int, int, int>, Schedule>();
  const std::tuple<int, int, int> key{options.num_stages, options.num_microbatches,
                                      options.num_chunks};
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache->find(key); it != cache->end()) return it->second;
  }
  SynthesisOptions synthesis;
  synthesis.num_stages = options.num_stages;
  synthesis.num_microbatches = options.num_microbatches;
  synthesis.num_chunks = options.num_chunks;
  synthesis.max_evaluations = kRegisteredEvaluations;
  synthesis.all_variants = false;
  synthesis.seed_with_registered = false;
  synthesis.name = "synth";
  absl::StatusOr<SynthesisResult> result = Synthesize(synthesis);
  if (!result.ok()) return result.status();
  std::lock_guard<std::mutex> lock(mutex);
  return (*cache)[key] = std::move(result->schedule);
}

}  // namespace

PP_REGISTER_SCHEDULE("synth",
                     "synthesised (synthesis.h) for F=I=W=1 under 1F1B's peak memory "
                     "(min(p,m)*v stage activations), looped placement, any v",
                     MakeSynth);

}  // namespace pp
