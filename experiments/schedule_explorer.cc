// schedule_explorer: make, validate, lower, simulate and draw any registered
// schedule, or compare several side by side. Thin main: all logic lives in
// pipeline/schedule/.
//
//   bazel run //experiments:schedule_explorer -- --schedule=1f1b --stages=4
//       --microbatches=8 [--chunks=2] [--group=4] [--costs=F:1,B:2,W:0,comm:0]
//       [--stage_costs='0:F:1,B:2;1:F:1.2,B:2.1'] [--rank_costs='1:STEP:0.5']
//       [--tie_groups=0,3|none] [--step_all_reduce] [--memory_split=I:42,W:32]
//       [--format=text|json|svg|chrome|csv|csv_comms] [--out=FILE]
//       [--schedule=csv:FILE [--stage_to_rank=looped|v|0,1,1,0]]
//       [--compare=gpipe,1f1b,interleaved_1f1b] [--defer_receives] [--list]
//       [--synthesize [--memory_cap=4] [--placement=looped|v] [--seed=0]
//        [--max_evaluations=2000] [--compare=all|NAME,...]]
//       [--stage_bytes=params:10,act:4,boundary:0.25[,recompute:1,pending:6]
//        [--optimizer=adamw|momentum|sgd] [--fp32_master_weights]]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/field_checks.h"
#include "common/status_macros.h"
#include "pipeline/schedule/analysis/memory_plan.h"
#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/analysis/validator.h"
#include "pipeline/schedule/formats/csv.h"
#include "pipeline/schedule/formats/render.h"
#include "pipeline/schedule/ir/chrome_trace.h"
#include "pipeline/schedule/ir/defer_receives.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/schedule/schedules/registry.h"
#include "pipeline/schedule/schedules/synthesis.h"

ABSL_FLAG(std::string, schedule, "1f1b",
          "registered schedule name (see --list), or csv:FILE: a schedule file in PyTorch's "
          "CSV layout (either form; its shape comes from the file, not --stages/--microbatches/"
          "--chunks; see pipeline/schedule/formats/csv.h)");
ABSL_FLAG(std::string, stage_to_rank, "",
          "placement of a csv:FILE schedule: looped, v, or a rank per virtual stage (0,1,1,0); "
          "empty: the file's '# stage_to_rank:' line, else looped");
ABSL_FLAG(int, stages, 4, "pipeline stages (ranks), p");
ABSL_FLAG(int, microbatches, 8, "micro-batches per step, m");
ABSL_FLAG(int, chunks, 1, "model chunks (virtual stages) per rank, v");
ABSL_FLAG(int, group, 0, "micro-batch group size for interleaved schedules (0 = p)");
ABSL_FLAG(std::string, costs, "F:1,B:2,I:1,W:1,comm:0",
          "KEY:VALUE,...: F, B, I, W: costs of one micro-batch through one rank's share of "
          "the model (with v chunks each chunk's action costs 1/v of it; a missing B is I + W); "
          "comm: per message (its transfer); SEND, RECV: time a SEND occupies the sending rank, "
          "a RECV the receiving one once its message is there; "
          "STEP, REDUCE_TIED: the tail's optimizer step and tied-gradient all-reduce per rank; "
          "REDUCE_GRAD: one rank's data-parallel gradient reduce (1/v per chunk); OUT_S, OUT_T, "
          "IN_F, IN_B: a rank's vocabulary passes per micro-batch (1f1b_vocab, zbv_vocab; "
          "OUT_S and OUT_T as in the two-barrier form: 1f1b_vocab1 and zbv_vocab1 move half of "
          "OUT_T into OUT_S), "
          "VOCAB_COMM: each of their collectives. Collectives "
          "start on all their ranks at the latest arrival: see --tie_groups, --step_all_reduce");
ABSL_FLAG(std::string, microbatch_multiplier, "",
          "X0,X1,...: one multiplier per micro-batch of every compute cost (variable-length "
          "micro-batches, e.g. each packed micro-batch's cost over their mean); empty: all 1");
ABSL_FLAG(std::string, stage_costs, "",
          "per virtual stage costs replacing --costs' for that stage, as is (not divided by v): "
          "STAGE:KEY:VALUE[,KEY:VALUE...] with ';' between stages, KEY in F, B, I, W, "
          "REDUCE_GRAD (B = I + W when only I and W are given), e.g. "
          "'0:F:1,B:2;1:F:1.2,B:2.1'");
ABSL_FLAG(std::string, rank_costs, "",
          "per rank tail and send costs replacing --costs': RANK:KEY:VALUE[,KEY:VALUE...] with "
          "';' between ranks, KEY in STEP, REDUCE_TIED, SEND, RECV, e.g. '0:STEP:5;1:STEP:8'");
ABSL_FLAG(std::string, tie_groups, "",
          "virtual stages whose tied parameters REDUCE_TIED all-reduces: groups like '0,3;1,2' "
          "(ranks linked through groups synchronise there; a rank in none skips it), 'none', or "
          "empty: all ranks in one group (a GPT with tied embedding and head on p = 2)");
ABSL_FLAG(bool, step_all_reduce, false,
          "STEP all-reduces the gradient norm over all ranks (global grad-norm clipping), "
          "so it starts on every rank at the latest arrival");
ABSL_FLAG(std::string, memory_split, "I:42,W:32",
          "parts of one forward's activations freed by I and by W (the zero-bubble "
          "paper's 74 = 42 + 32); a full B frees all of it");
ABSL_FLAG(bool, blocking_sends, false,
          "simulate rendezvous sends (a SEND waits for its RECV) instead of "
          "buffered ones");
ABSL_FLAG(std::string, format, "text",
          "text, json, svg, chrome, csv (PyTorch's compute-only CSV) or csv_comms (its compute + "
          "comms CSV: the lowered program)");
ABSL_FLAG(std::string, out, "", "write the output to this file instead of stdout");
ABSL_FLAG(std::string, compare, "",
          "comma-separated schedules to compare: makespan, bubble, inner (the idle "
          "share left when steps overlap: idle between each rank's first and last "
          "compute), peak in-flight activations and peak memory per rank");
ABSL_FLAG(bool, defer_receives, false,
          "lower, then move each receive to just before its consumer (DeferReceives), "
          "as the runtime executes it by default");
ABSL_FLAG(bool, list, false, "list the registered schedules and exit");
ABSL_FLAG(
    bool, synthesize, false,
    "synthesise a schedule (pipeline/schedule/schedules/synthesis.h) for --costs/--stage_costs/"
    "--memory_split under --memory_cap with --chunks and --placement, print it with its "
    "lower bound (or write it in --format); with --compare, next to those registered "
    "schedules (all: every one) under the same cap");
ABSL_FLAG(double, memory_cap, 0,
          "--synthesize: per rank cap on peak memory in one rank's share of the model's "
          "activations for one micro-batch (the 'peak memory (x stage)' column; v chunks: "
          "cap * v virtual-stage activations); 0: 1F1B's peak, min(p, m)");
ABSL_FLAG(std::string, placement, "looped",
          "--synthesize: looped (any --chunks) or v (--chunks=2, rank r holds r and 2p-1-r)");
ABSL_FLAG(std::string, stage_bytes, "",
          "MiB per virtual stage for the byte planner (pipeline/schedule/analysis/memory_plan.h): "
          "params:P,act:A,boundary:B[,recompute:R,pending:W] (parameters as fp32, one "
          "micro-batch's activations kept for the backward, its p2p message, what a "
          "checkpointed backward regenerates, what a split backward's I leaves for W). Adds "
          "each rank's predicted peak in bytes to the text output and a peak MiB column to "
          "--compare");
ABSL_FLAG(std::string, optimizer, "adamw",
          "--stage_bytes: optimizer state per parameter: adamw (2), momentum (1) or sgd (0)");
ABSL_FLAG(bool, fp32_master_weights, false,
          "--stage_bytes: bf16 parameters with fp32 master weights (mixed precision)");
ABSL_FLAG(int, seed, 0, "--synthesize: seed of the local search");
ABSL_FLAG(int, max_evaluations, 2000, "--synthesize: simulator evaluations of the local search");

namespace pp {
namespace {

struct Explored {
  Schedule schedule;
  LoweredProgram program;
  SimulationCosts costs;
  SimulationResult sim;
};

// `bazel run` starts the binary in its runfiles tree; a relative path a
// person typed is relative to the workspace.
std::string FromWorkspace(const std::string& path) {
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (path.empty() || std::filesystem::path(path).is_absolute() || workspace == nullptr) {
    return path;
  }
  return (std::filesystem::path(workspace) / path).string();
}

// The simulator's costs from the flags for a schedule of `num_virtual`
// stages with `chunks` per rank.
absl::StatusOr<SimulationCosts> FlagCosts(int num_virtual, int chunks) {
  PP_ASSIGN_OR_RETURN(SimulationCosts costs, ParseSimulationCosts(absl::GetFlag(FLAGS_costs)));
  costs.blocking_sends = absl::GetFlag(FLAGS_blocking_sends);
  PP_ASSIGN_OR_RETURN(costs.memory, ParseMemorySplit(absl::GetFlag(FLAGS_memory_split)));
  costs.stage_multiplier.assign(num_virtual, 1.0 / chunks);
  PP_ASSIGN_OR_RETURN(costs.stage_costs, ParseStageCosts(absl::GetFlag(FLAGS_stage_costs)));
  PP_ASSIGN_OR_RETURN(costs.rank_costs, ParseRankCosts(absl::GetFlag(FLAGS_rank_costs)));
  PP_ASSIGN_OR_RETURN(costs.tie_groups, ParseTieGroups(absl::GetFlag(FLAGS_tie_groups)));
  costs.step_all_reduce = absl::GetFlag(FLAGS_step_all_reduce);
  PP_ASSIGN_OR_RETURN(costs.microbatch_multiplier,
                      ParseMicrobatchMultipliers(absl::GetFlag(FLAGS_microbatch_multiplier)));
  return costs;
}

// A simulation of finite costs whose sums overflow (--costs=F:1e308) has no
// figures worth printing.
absl::Status CheckFiniteSimulation(const SimulationResult& sim) {
  if (std::isfinite(sim.makespan)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the simulated makespan is ", sim.makespan,
                   ": the costs given are too large to add up; give smaller ones"));
}

// Lowers and simulates a made schedule.
absl::StatusOr<Explored> ExploreSchedule(Schedule schedule) {
  Explored out;
  out.schedule = std::move(schedule);
  PP_RETURN_IF_ERROR(ValidateSchedule(out.schedule));
  PP_ASSIGN_OR_RETURN(out.costs,
                      FlagCosts(out.schedule.num_virtual_stages(), out.schedule.num_chunks));
  PP_ASSIGN_OR_RETURN(out.program, Lower(out.schedule, LoweringFor(out.costs)));
  if (absl::GetFlag(FLAGS_defer_receives)) out.program = DeferReceives(out.program);
  PP_ASSIGN_OR_RETURN(out.sim, SimulateProgram(out.program, out.costs));
  PP_RETURN_IF_ERROR(CheckFiniteSimulation(out.sim));
  return out;
}

// The shape flags' bounds (issue #42, class 8): the training binaries' own
// for parallelism.pp, chunks and num_microbatches, and a cap on the compute
// actions p x m x v (the schedule's lists, lowering and the simulator's
// timeline grow with it; --stages=100000 --microbatches=100000 was a
// bad_alloc). --synthesize evaluates its candidate many times: it gets a
// smaller cap, the largest size issue 43 plans for (64 stages x 512
// micro-batches: 12 s of CPU with default costs,
// bench/results/schedule_synthesis_scale.jsonl), so that --stages=10000 or
// --microbatches=1000000 is refused at once instead of running for minutes.
constexpr int64_t kMaxExploredActions = int64_t{1} << 20;
constexpr int64_t kMaxSynthesizedActions = int64_t{1} << 15;

absl::Status CheckShapeFlags(bool synthesize) {
  const int64_t p = absl::GetFlag(FLAGS_stages);
  const int64_t m = absl::GetFlag(FLAGS_microbatches);
  const int64_t v = absl::GetFlag(FLAGS_chunks);
  PP_RETURN_IF_ERROR(CheckIntField("--stages", p, 1, 1024, "as parallelism.pp"));
  PP_RETURN_IF_ERROR(
      CheckIntField("--microbatches", m, 1, 65536, "as parallelism.num_microbatches"));
  PP_RETURN_IF_ERROR(CheckIntField("--chunks", v, 1, 64, "as parallelism.chunks"));
  PP_RETURN_IF_ERROR(
      CheckIntField("--group", absl::GetFlag(FLAGS_group), 0, m, "at most --microbatches"));
  PP_RETURN_IF_ERROR(
      CheckIntField("--max_evaluations", absl::GetFlag(FLAGS_max_evaluations), 0, 1000000));
  const int64_t cap = synthesize ? kMaxSynthesizedActions : kMaxExploredActions;
  if (p * m * v > cap) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stages (", p, ") x --microbatches (", m, ") x --chunks (", v,
                     ") = ", p * m * v, " compute actions per kind; ",
                     synthesize ? "--synthesize takes" : "the explorer takes", " at most ", cap,
                     synthesize ? " (each search evaluates the schedule hundreds of times)" : ""));
  }
  return absl::OkStatus();
}

absl::StatusOr<Explored> Explore(const std::string& name, int chunks) {
  ScheduleOptions options;
  options.num_stages = absl::GetFlag(FLAGS_stages);
  options.num_microbatches = absl::GetFlag(FLAGS_microbatches);
  options.num_chunks = chunks;
  options.group_size = absl::GetFlag(FLAGS_group);
  Explored out;
  if (absl::StartsWith(name, kCsvSchedulePrefix)) {
    CsvReadOptions csv;
    csv.stage_to_rank = absl::GetFlag(FLAGS_stage_to_rank);
    PP_ASSIGN_OR_RETURN(
        out.schedule,
        LoadCsvScheduleFile(FromWorkspace(name.substr(kCsvSchedulePrefix.size())), csv));
  } else {
    PP_ASSIGN_OR_RETURN(out.schedule, MakeSchedule(name, options));
  }
  return ExploreSchedule(std::move(out.schedule));
}

nlohmann::json RankLists(const RankActions& ranks) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::vector<std::string> actions;
    for (const Action& a : ranks[r]) actions.push_back(ActionToString(a));
    out.push_back({{"rank", r}, {"actions", actions}});
  }
  return out;
}

// Peak memory per rank divided by `chunks` (so in units of one rank's share of
// the model's activations for one micro-batch), 2 decimals at most.
std::string MemoryList(const std::vector<double>& memory, int chunks, const char* separator) {
  return absl::StrJoin(memory, separator, [chunks](std::string* out, double m) {
    absl::StrAppend(out, absl::StrFormat("%.3g", m / chunks));
  });
}

// --stage_bytes as one virtual stage's bytes; InvalidArgument naming a bad item.
absl::StatusOr<StageMemory> ParseStageBytes(const std::string& spec) {
  StageMemory stage;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    const std::vector<std::string> kv = absl::StrSplit(item, absl::MaxSplits(':', 1));
    double mib = 0;
    if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &mib) || !std::isfinite(mib) || mib < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stage_bytes: '", item, "' is not KEY:MiB with a finite MiB >= 0"));
    }
    const double bytes = mib * 1024 * 1024;
    if (kv[0] == "params") {
      stage.parameter_bytes = bytes;
    } else if (kv[0] == "act") {
      stage.activation_bytes = bytes;
    } else if (kv[0] == "boundary") {
      stage.boundary_bytes = bytes;
    } else if (kv[0] == "recompute") {
      stage.recompute_bytes = bytes;
    } else if (kv[0] == "pending") {
      stage.weight_pending_bytes = bytes;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--stage_bytes: unknown key '", kv[0],
                       "'; valid: params, act, boundary, recompute, pending"));
    }
  }
  return stage;
}

// --stage_bytes: the byte planner's plan of `s` (nullopt without the flag).
absl::StatusOr<std::optional<MemoryPlan>> BytePlan(const Schedule& s) {
  const std::string spec = absl::GetFlag(FLAGS_stage_bytes);
  if (spec.empty()) return std::optional<MemoryPlan>();
  PP_ASSIGN_OR_RETURN(const StageMemory stage, ParseStageBytes(spec));
  MemoryPlanOptions options;
  PP_ASSIGN_OR_RETURN(options.optimizer, ParseOptimizerKind(absl::GetFlag(FLAGS_optimizer)));
  PP_ASSIGN_OR_RETURN(options.split, ParseMemorySplit(absl::GetFlag(FLAGS_memory_split)));
  options.fp32_master_weights = absl::GetFlag(FLAGS_fp32_master_weights);
  PP_ASSIGN_OR_RETURN(
      MemoryPlan plan,
      PlanMemory(s, std::vector<StageMemory>(s.num_virtual_stages(), stage), options));
  return std::optional<MemoryPlan>(std::move(plan));
}

std::string Title(const Schedule& s) {
  return absl::StrFormat("%s: p=%d, m=%d, v=%d", s.name, s.num_stages, s.num_microbatches,
                         s.num_chunks);
}

std::string Render(const Explored& e, const std::string& format) {
  const Schedule& s = e.schedule;
  if (format == "json") {
    // Virtual stage -> rank, keyed by the stage as a string (looped or V).
    nlohmann::json placement = nlohmann::json::object();
    for (size_t stage = 0; stage < s.stage_to_rank.size(); ++stage) {
      placement[std::to_string(stage)] = s.stage_to_rank[stage];
    }
    nlohmann::json j = {
        {"schedule", s.name},
        {"stages", s.num_stages},
        {"microbatches", s.num_microbatches},
        {"chunks", s.num_chunks},
        {"stage_to_rank", placement},
        // 0 without vocabulary passes, else Schedule::vocab_barriers.
        {"vocab_barriers", s.vocab_parallel ? s.vocab_barriers : 0},
        {"ranks", RankLists(s.ranks)},
        {"lowered", RankLists(e.program.ranks)},
        {"simulation",
         {{"makespan", e.sim.makespan},
          {"bubble_fraction", e.sim.bubble_fraction},
          {"busy", e.sim.busy},
          {"idle", e.sim.idle},
          {"peak_inflight", e.sim.peak_inflight},
          {"inner_idle", e.sim.inner_idle},
          {"peak_memory", e.sim.peak_memory},
          {"peak_memory_units", "one virtual stage's activations for one micro-batch"},
          {"memory_split", {{"I", e.costs.memory.input}, {"W", e.costs.memory.weight}}}}}};
    return j.dump() + "\n";
  }
  if (format == "svg") {
    SvgOptions options;
    options.title = Title(s);
    options.num_stages = s.num_stages;
    return RenderSvg(e.sim, options);
  }
  if (format == "chrome") {
    // The collectives in flight (VOCAB_ASYNC) in the background process, as
    // train_gpt's trace.json shows them.
    std::vector<TraceEvent> events = e.sim.timeline;
    events.insert(events.end(), e.sim.in_flight.begin(), e.sim.in_flight.end());
    return ChromeTraceJson(events) + "\n";
  }
  if (format == "csv") return ScheduleToCsv(s);
  if (format == "csv_comms") return ProgramToCsv(e.program);
  std::string text =
      absl::StrCat(Title(s), "\n\ncompute order (step x rank):\n", FormatGrid(s.ranks),
                   "\nsimulated timeline (costs ", absl::GetFlag(FLAGS_costs), "):\n",
                   FormatTimelineGrid(e.sim), "\nlowered program:\n");
  for (size_t r = 0; r < e.program.ranks.size(); ++r) {
    absl::StrAppend(&text, "  rank ", r, ": ", ActionsToString(e.program.ranks[r]), "\n");
  }
  absl::StrAppend(
      &text, absl::StrFormat(
                 "\nmakespan %g  bubble %.4f  busy [%s]  peak in-flight [%s]  peak memory [%s]\n",
                 e.sim.makespan, e.sim.bubble_fraction, absl::StrJoin(e.sim.busy, ", "),
                 absl::StrJoin(e.sim.peak_inflight, ", "), MemoryList(e.sim.peak_memory, 1, ", ")));
  absl::StatusOr<std::optional<MemoryPlan>> plan = BytePlan(s);
  if (!plan.ok()) {
    absl::StrAppend(&text, "\nmemory plan: ", plan.status().message(), "\n");
  } else if (plan->has_value()) {
    absl::StrAppend(&text, "\nmemory plan (bytes, --stage_bytes):\n", FormatMemoryPlan(**plan));
  }
  return text;
}

std::string CompareHeader() {
  return absl::StrFormat(
      "p=%d m=%d costs %s%s memory split %s\n%-18s %3s %10s %8s %8s %20s %16s %26s%s\n",
      absl::GetFlag(FLAGS_stages), absl::GetFlag(FLAGS_microbatches), absl::GetFlag(FLAGS_costs),
      absl::GetFlag(FLAGS_blocking_sends) ? " (blocking sends)" : "",
      absl::GetFlag(FLAGS_memory_split), "schedule", "v", "makespan", "bubble", "inner",
      "peak act (chunks)", "peak (x stage)", "peak memory (x stage)",
      absl::GetFlag(FLAGS_stage_bytes).empty() ? "" : absl::StrFormat(" %12s", "peak MiB"));
}

// --compare's byte column: the largest rank's predicted peak ("" without
// --stage_bytes).
std::string PeakMibCell(const Schedule& s) {
  absl::StatusOr<std::optional<MemoryPlan>> plan = BytePlan(s);
  if (!plan.ok()) return absl::StrCat(" ", plan.status().message());
  if (!plan->has_value()) return "";
  double peak = 0;
  for (const RankMemoryPlan& r : (*plan)->ranks) peak = std::max(peak, r.peak_bytes);
  return absl::StrFormat(" %12.2f", peak / (1024.0 * 1024.0));
}

std::string CompareRow(const std::string& name, const Explored& e) {
  int peak = 0;
  for (int v : e.sim.peak_inflight) peak = std::max(peak, v);
  double inner_idle = 0;
  for (double idle : e.sim.inner_idle) inner_idle += idle;
  const double inner =
      e.sim.makespan > 0 ? inner_idle / (e.schedule.num_stages * e.sim.makespan) : 0;
  return absl::StrFormat(
      "%-18s %3d %10g %7.1f%% %7.1f%% %20s %16g %26s%s\n", name, e.schedule.num_chunks,
      e.sim.makespan, 100 * e.sim.bubble_fraction, 100 * inner,
      absl::StrCat("[", absl::StrJoin(e.sim.peak_inflight, ","), "]"),
      static_cast<double>(peak) / e.schedule.num_chunks,
      absl::StrCat("[", MemoryList(e.sim.peak_memory, e.schedule.num_chunks, ","), "]"),
      PeakMibCell(e.schedule));
}

// The named schedule at --chunks, or at the count it takes: two (V schedules:
// zbv, dualpipev), else one; its first error otherwise.
absl::StatusOr<Explored> ExploreAnyChunks(const std::string& name) {
  const int chunks = absl::GetFlag(FLAGS_chunks);
  absl::StatusOr<Explored> e = Explore(name, chunks);
  for (int fallback : {2, 1}) {
    if (e.ok() || fallback == chunks || e.status().code() != absl::StatusCode::kInvalidArgument) {
      continue;
    }
    absl::StatusOr<Explored> retry = Explore(name, fallback);
    if (retry.ok()) e = std::move(retry);
  }
  return e;
}

std::string Compare(const std::vector<std::string>& names) {
  std::string out = CompareHeader();
  for (const std::string& name : names) {
    absl::StatusOr<Explored> e = ExploreAnyChunks(name);
    if (!e.ok()) {
      absl::StrAppend(&out, absl::StrFormat("%-18s %s\n", name, e.status().message()));
      continue;
    }
    absl::StrAppend(&out, CompareRow(name, *e));
  }
  return out;
}

double MaxOf(const std::vector<double>& xs) {
  double out = 0;
  for (double x : xs) out = std::max(out, x);
  return out;
}

// --synthesize: the synthesised schedule (and its figures), in --format, or
// with --compare next to registered schedules under the same cap.
absl::StatusOr<std::string> Synthesize(const std::string& format) {
  SynthesisOptions o;
  o.num_stages = absl::GetFlag(FLAGS_stages);
  o.num_microbatches = absl::GetFlag(FLAGS_microbatches);
  o.num_chunks = absl::GetFlag(FLAGS_chunks);
  const std::string placement = absl::GetFlag(FLAGS_placement);
  if (placement == "v") {
    o.placement = SynthesisPlacement::kV;
  } else if (placement != "looped") {
    return absl::InvalidArgumentError(
        absl::StrCat("--placement=", placement, ": expected looped or v"));
  }
  const double cap = absl::GetFlag(FLAGS_memory_cap);
  if (cap < 0 || !std::isfinite(cap)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--memory_cap=", cap, ": expected 0 (1F1B's peak) or a positive cap"));
  }
  // In one rank's share: 1F1B's peak is min(p, m).
  const double cap_share = cap > 0 ? cap : std::min(o.num_stages, o.num_microbatches);
  o.memory_cap = cap_share * o.num_chunks;
  o.seed = absl::GetFlag(FLAGS_seed);
  o.max_evaluations = absl::GetFlag(FLAGS_max_evaluations);
  if (o.num_stages >= 1 && o.num_chunks >= 1) {
    PP_ASSIGN_OR_RETURN(o.costs, FlagCosts(o.num_stages * o.num_chunks, o.num_chunks));
  }
  // --costs without I and W: no split backward to schedule.
  o.split_backward = absl::StrContains(absl::GetFlag(FLAGS_costs), "I:") ||
                     !absl::StrContains(absl::GetFlag(FLAGS_costs), "B:");
  // Searched on the program the explorer shows and times (ExploreSchedule).
  o.defer_receives = absl::GetFlag(FLAGS_defer_receives);
  PP_ASSIGN_OR_RETURN(SynthesisResult r, pp::Synthesize(o));
  PP_ASSIGN_OR_RETURN(Explored e, ExploreSchedule(r.schedule));
  if (absl::GetFlag(FLAGS_compare).empty()) {
    std::string out = Render(e, format);
    if (format == "text") {
      absl::StrAppend(
          &out,
          absl::StrFormat("memory cap %g (x stage)  peak memory %g (x stage)\n"
                          "lower bound %g (busiest rank %g, critical path %g): gap %.1f%%\n"
                          "start %s (%g), %d simulator evaluations\n",
                          cap_share, r.peak_memory / o.num_chunks, r.lower_bound, r.rank_work_bound,
                          r.critical_path_bound, 100 * (r.makespan / r.lower_bound - 1), r.start,
                          r.start_makespan, r.evaluations));
    }
    return out;
  }
  std::vector<std::string> names;
  if (absl::GetFlag(FLAGS_compare) == "all") {
    for (const std::string& name : RegisteredScheduleNames()) names.push_back(name);
  } else {
    names = absl::StrSplit(absl::GetFlag(FLAGS_compare), ',', absl::SkipEmpty());
  }
  std::string out = absl::StrCat(CompareHeader(), CompareRow("synthesized", e));
  double best = std::numeric_limits<double>::infinity();
  std::string best_name = "none";
  for (const std::string& name : names) {
    absl::StatusOr<Explored> other = ExploreAnyChunks(name);
    if (!other.ok()) {
      absl::StrAppend(&out, absl::StrFormat("%-18s %s\n", name, other.status().message()));
      continue;
    }
    if (other->schedule.forward_only) continue;
    std::string row = CompareRow(name, *other);
    const double peak_share = MaxOf(other->sim.peak_memory) / other->schedule.num_chunks;
    if (peak_share > cap_share + 1e-9) {
      row.pop_back();
      absl::StrAppend(&row, "  over the cap\n");
    } else if (other->sim.makespan < best) {
      best = other->sim.makespan;
      best_name = name;
    }
    absl::StrAppend(&out, row);
  }
  absl::StrAppend(&out,
                  absl::StrFormat("memory cap %g (x stage); lower bound %g; synthesized %g; best "
                                  "registered under the cap: %s %g\n",
                                  cap_share, r.lower_bound, r.makespan, best_name, best));
  return out;
}

// A refusal as the training binaries give one: "error: ..." on stderr, exit 2.
int Refuse(const absl::Status& status) {
  std::cerr << "error: " << status.message() << std::endl;
  return 2;
}

int Main() {
  std::string output;
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "text" && format != "json" && format != "svg" && format != "chrome" &&
      format != "csv" && format != "csv_comms") {
    return Refuse(absl::InvalidArgumentError(
        absl::StrCat("--format=", format, ": expected text, json, svg, chrome, csv or csv_comms")));
  }
  if (!absl::GetFlag(FLAGS_stage_bytes).empty()) {
    absl::Status bad = ParseStageBytes(absl::GetFlag(FLAGS_stage_bytes)).status();
    if (bad.ok()) bad = ParseOptimizerKind(absl::GetFlag(FLAGS_optimizer)).status();
    if (!bad.ok()) return Refuse(bad);
  }
  if (absl::Status bad = CheckShapeFlags(absl::GetFlag(FLAGS_synthesize)); !bad.ok()) {
    return Refuse(bad);
  }
  // Costs before any schedule: --compare would otherwise print the error in
  // every row and exit 0.
  for (const absl::Status& bad :
       {ParseSimulationCosts(absl::GetFlag(FLAGS_costs)).status(),
        ParseStageCosts(absl::GetFlag(FLAGS_stage_costs)).status(),
        ParseRankCosts(absl::GetFlag(FLAGS_rank_costs)).status(),
        ParseMemorySplit(absl::GetFlag(FLAGS_memory_split)).status(),
        ParseMicrobatchMultipliers(absl::GetFlag(FLAGS_microbatch_multiplier)).status()}) {
    if (!bad.ok()) return Refuse(bad);
  }
  if (absl::GetFlag(FLAGS_list)) {
    for (const ScheduleInfo& info : RegisteredSchedules()) {
      output += absl::StrFormat("%-18s %s\n", info.name, info.description);
    }
  } else if (absl::GetFlag(FLAGS_synthesize)) {
    absl::StatusOr<std::string> synthesized = Synthesize(format);
    if (!synthesized.ok()) return Refuse(synthesized.status());
    output = *synthesized;
  } else if (!absl::GetFlag(FLAGS_compare).empty()) {
    output = Compare(absl::StrSplit(absl::GetFlag(FLAGS_compare), ',', absl::SkipEmpty()));
  } else {
    absl::StatusOr<Explored> e =
        Explore(absl::GetFlag(FLAGS_schedule), absl::GetFlag(FLAGS_chunks));
    if (!e.ok()) return Refuse(e.status());
    output = Render(*e, format);
  }
  const std::string path = absl::GetFlag(FLAGS_out);
  if (path.empty()) {
    std::cout << output;
    return 0;
  }
  std::ofstream file(path);
  file << output;
  file.close();
  if (!file) return Refuse(absl::UnavailableError(absl::StrCat("cannot write ", path)));
  std::fprintf(stderr, "wrote %s\n", path.c_str());
  return 0;
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  std::string usage =
      "Explore pipeline schedules: validate, lower, simulate, draw.\n"
      "Registered schedules:\n";
  for (const pp::ScheduleInfo& info : pp::RegisteredSchedules()) {
    absl::StrAppend(&usage, "  ", info.name, ": ", info.description, "\n");
  }
  absl::SetProgramUsageMessage(usage);
  absl::ParseCommandLine(argc, argv);
  return pp::Main();
}
