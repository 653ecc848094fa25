// bench_synthesis: the synthesiser (pipeline/schedule/schedules/synthesis.h) against
// every registered schedule over a grid of simulated cases (issue #27):
//   p in {2, 4, 8}; m in {p, 2p, 4p};
//   costs: uniform, W half of I, the last 1/p of the model 1.5x heavier, the
//          first 1/p 1.3x heavier (the model as 2p equal blocks, so v = 1
//          and v = 2 split the same model);
//   communication 0 and 10% of F; caps at 1F1B's peak (min(p, m) in one
//   rank's share of the activations), 1.5x and 2x.
// Per case: the best registered schedule whose simulated peak fits the cap
// (any v it takes, its own placement), the synthesised makespan (best of
// looped v = 1, looped v = 2 and V), and the lower bound (of the placement
// that won). Costs per micro-batch through one rank's share: F = I = W = 1
// (W = 0.5 for w_half), each chunk 1/v of it.
//
// Appends one JSON record (date, commit, machine facts, command, every case
// and the summary) to --out, and prints the summary.
//
//   bazel run -c opt //bench:bench_synthesis -- --out=bench/results/synthesis_grid.jsonl
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/schedules/registry.h"
#include "pipeline/schedule/schedules/synthesis.h"

ABSL_FLAG(std::string, out, "",
          "append the JSON record to this file (relative to the workspace under bazel run)");
ABSL_FLAG(int, max_evaluations, 1000, "local search evaluations per synthesis");
ABSL_FLAG(std::string, stages, "2,4,8", "p values");
ABSL_FLAG(int, seed, 0, "synthesis seed");

namespace pp {
namespace {

// Cost of one of 2p equal model blocks for `shape` (F, I, W of one block).
struct BlockCost {
  double f, i, w;
};

BlockCost Block(const std::string& shape, int block, int p) {
  BlockCost c{0.5, 0.5, shape == "w_half" ? 0.25 : 0.5};  // two blocks = one rank's share
  double mult = 1;
  if (shape == "last_heavy" && block >= 2 * p - 2) mult = 1.5;
  if (shape == "first_heavy" && block < 2) mult = 1.3;
  return {c.f * mult, c.i * mult, c.w * mult};
}

// Costs for p ranks with v chunks (v in {1, 2}): virtual stage s holds the
// blocks [s * 2 / v, (s + 1) * 2 / v).
SimulationCosts CaseCosts(const std::string& shape, double comm, int p, int v) {
  SimulationCosts costs;
  costs.comm = comm;
  const int blocks_per_stage = 2 / v;
  for (int s = 0; s < p * v; ++s) {
    StageCosts sc;
    double f = 0, i = 0, w = 0;
    for (int b = s * blocks_per_stage; b < (s + 1) * blocks_per_stage; ++b) {
      BlockCost c = Block(shape, b, p);
      f += c.f;
      i += c.i;
      w += c.w;
    }
    sc.forward = f;
    sc.backward_input = i;
    sc.backward_weight = w;
    sc.backward = i + w;
    costs.stage_costs[s] = sc;
  }
  return costs;
}

double MaxOf(const std::vector<double>& xs) {
  double out = 0;
  for (double x : xs) out = std::max(out, x);
  return out;
}

std::string Shell(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[256];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// The best schedule of one case: its simulated makespan and name; for a
// synthesised one also its lower bound and the evaluations spent.
struct Candidate {
  double makespan = std::numeric_limits<double>::infinity();
  std::string name;
  double lower_bound = 0;
  int evaluations = 0;
};

// The best registered schedule (1 or 2 chunks) within the memory cap.
Candidate BestRegistered(int p, int m, const std::string& shape, double comm, double cap_share) {
  Candidate best;
  best.name = "none";
  for (const std::string& name : RegisteredScheduleNames()) {
    if (name.rfind("synth", 0) == 0) continue;
    for (int v : {1, 2}) {
      absl::StatusOr<Schedule> s = MakeSchedule(name, {p, m, v, 0});
      if (!s.ok() || s->forward_only) continue;
      absl::StatusOr<SimulationResult> sim = Simulate(*s, CaseCosts(shape, comm, p, v));
      if (!sim.ok()) continue;
      if (MaxOf(sim->peak_memory) / v > cap_share + 1e-9) continue;
      if (sim->makespan < best.makespan - 1e-12) {
        best.makespan = sim->makespan;
        best.name = absl::StrCat(name, " v=", v);
      }
    }
  }
  return best;
}

// The best of three synthesised placements (looped v=1, looped v=2, V).
Candidate BestSynthesized(int p, int m, const std::string& shape, double comm, double cap_share) {
  Candidate best;
  for (auto [v, placement] :
       std::vector<std::pair<int, SynthesisPlacement>>{{1, SynthesisPlacement::kLooped},
                                                       {2, SynthesisPlacement::kLooped},
                                                       {2, SynthesisPlacement::kV}}) {
    SynthesisOptions o;
    o.num_stages = p;
    o.num_microbatches = m;
    o.num_chunks = v;
    o.placement = placement;
    o.costs = CaseCosts(shape, comm, p, v);
    o.memory_cap = cap_share * v;
    o.max_evaluations = absl::GetFlag(FLAGS_max_evaluations);
    o.seed = absl::GetFlag(FLAGS_seed);
    absl::StatusOr<SynthesisResult> r = Synthesize(o);
    if (!r.ok()) {
      std::cerr << "p=" << p << " m=" << m << " v=" << v << ": " << r.status() << "\n";
      continue;
    }
    best.evaluations += r->evaluations;
    if (r->makespan < best.makespan - 1e-12) {
      best.makespan = r->makespan;
      best.lower_bound = r->lower_bound;
      best.name = absl::StrCat(placement == SynthesisPlacement::kV ? "V" : "looped", " v=", v,
                               " from ", r->start);
    }
  }
  return best;
}

// Appends the run's record (date, commit, machine, command, summary, cases)
// to --out; 1 when it cannot be written.
int AppendRecord(int argc, char** argv, const nlohmann::json& summary,
                 const nlohmann::json& cases) {
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  const std::string dir = workspace != nullptr ? workspace : ".";
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::vector<std::string> args(argv, argv + argc);
  std::ifstream loadavg("/proc/loadavg");
  std::string load;
  std::getline(loadavg, load);
  nlohmann::json record = {
      {"date", date},
      {"commit", Shell(absl::StrCat("git -C '", dir, "' rev-parse HEAD 2>/dev/null"))},
      {"dirty",
       !Shell(absl::StrCat("git -C '", dir, "' status --porcelain -uno 2>/dev/null")).empty()},
      {"machine",
       {{"nproc", sysconf(_SC_NPROCESSORS_ONLN)},
        {"loadavg", load},
        {"hostname", Shell("hostname")}}},
      {"command", absl::StrJoin(args, " ")},
      {"max_evaluations", absl::GetFlag(FLAGS_max_evaluations)},
      {"seed", absl::GetFlag(FLAGS_seed)},
      {"summary", summary},
      {"cases", cases}};
  std::string path = absl::GetFlag(FLAGS_out);
  if (!path.empty()) {
    if (!std::filesystem::path(path).is_absolute() && workspace != nullptr) {
      path = (std::filesystem::path(workspace) / path).string();
    }
    std::ofstream file(path, std::ios::app);
    file << record.dump() << "\n";
    if (!file) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
    std::fprintf(stderr, "appended to %s\n", path.c_str());
  }
  return 0;
}

int Main(int argc, char** argv) {
  std::vector<int> stages;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_stages), ',')) {
    int p = 0;
    if (!absl::SimpleAtoi(part, &p) || p < 1) {
      std::fprintf(stderr, "--stages: \"%s\" is not a positive integer\n",
                   std::string(part).c_str());
      return 2;
    }
    stages.push_back(p);
  }
  nlohmann::json cases = nlohmann::json::array();
  int total = 0, better = 0, never_worse = 0;
  double sum_gain = 0, max_gain = 0, sum_gap = 0, max_gap = 0, sum_best_gap = 0;
  int at_bound = 0;
  for (int p : stages) {
    for (int m : {p, 2 * p, 4 * p}) {
      for (const std::string shape : {"uniform", "w_half", "last_heavy", "first_heavy"}) {
        for (double comm : {0.0, 0.1}) {
          for (double factor : {1.0, 1.5, 2.0}) {
            const double cap_share = factor * std::min(p, m);
            const Candidate registered = BestRegistered(p, m, shape, comm, cap_share);
            const Candidate synthesized = BestSynthesized(p, m, shape, comm, cap_share);
            const double best = registered.makespan, synth = synthesized.makespan;
            const double bound = synthesized.lower_bound;
            const std::string& best_name = registered.name;
            const std::string& synth_name = synthesized.name;
            const int evaluations = synthesized.evaluations;
            ++total;
            never_worse += synth <= best + 1e-9;
            const double gain = best / synth - 1;
            if (synth < best - 1e-9) {
              ++better;
              sum_gain += gain;
              max_gain = std::max(max_gain, gain);
            }
            const double gap = synth / bound - 1;
            sum_gap += gap;
            max_gap = std::max(max_gap, gap);
            sum_best_gap += best / bound - 1;
            at_bound += gap < 1e-9;
            cases.push_back({{"p", p},
                             {"m", m},
                             {"costs", shape},
                             {"comm", comm},
                             {"cap_x_1f1b", factor},
                             {"cap_stage_activations", cap_share},
                             {"best_registered", best_name},
                             {"best_registered_makespan", best},
                             {"synthesized_makespan", synth},
                             {"synthesized", synth_name},
                             {"lower_bound", bound},
                             {"evaluations", evaluations}});
            std::printf(
                "p=%d m=%-2d %-11s comm %.1f cap %.1fx: best %-22s %8.3f  synth %8.3f  "
                "bound %8.3f  %s\n",
                p, m, shape.c_str(), comm, factor, best_name.c_str(), best, synth, bound,
                synth_name.c_str());
            std::fflush(stdout);
          }
        }
      }
    }
  }
  nlohmann::json summary = {{"cases", total},
                            {"never_worse", never_worse},
                            {"better", better},
                            {"mean_gain_where_better", better > 0 ? sum_gain / better : 0},
                            {"max_gain", max_gain},
                            {"mean_gap_to_lower_bound", sum_gap / total},
                            {"max_gap_to_lower_bound", max_gap},
                            {"mean_best_registered_gap_to_lower_bound", sum_best_gap / total},
                            {"at_lower_bound", at_bound}};
  std::printf("%s\n", summary.dump(2).c_str());

  if (AppendRecord(argc, argv, summary, cases) != 0) return 1;
  return never_worse == total ? 0 : 1;
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  (void)positional;
  return pp::Main(argc, argv);
}
