#include "driver/run_observability.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <glog/logging.h>
#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/torch_compat.h"
#include "driver/memory_budget.h"
#include "observability/memory_tracker.h"
#include "observability/rank_log.h"
#include "observability/trace_merge.h"
#include "pipeline/schedule/analysis/memory_plan.h"
#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/ir/action.h"
#include "topology/blas_kernel.h"
#include "topology/wait_work.h"

namespace pp {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Rank 0's run directory on every rank: its length, then its bytes, broadcast
// over the world group.
absl::StatusOr<std::string> ShareRunDir(const ParallelGrid& grid, const std::string& run_dir,
                                        std::chrono::milliseconds timeout) {
  const bool rank0 = grid.global_rank() == 0;
  std::vector<at::Tensor> length = {
      torch::tensor({rank0 ? static_cast<int64_t>(run_dir.size()) : int64_t{0}}, torch::kLong)};
  PP_RETURN_IF_ERROR(RunCollective("run directory length broadcast", grid.DescribeWorldGroup(),
                                   timeout, [&] { return grid.world_group()->broadcast(length); }));
  const int64_t n = length[0].item<int64_t>();
  if (n <= 0) return absl::InternalError("rank 0 shared an empty run directory");
  std::vector<at::Tensor> bytes = {torch::zeros({n}, torch::kUInt8)};
  if (rank0) std::memcpy(bytes[0].data_ptr<uint8_t>(), run_dir.data(), run_dir.size());
  PP_RETURN_IF_ERROR(RunCollective("run directory broadcast", grid.DescribeWorldGroup(), timeout,
                                   [&] { return grid.world_group()->broadcast(bytes); }));
  return std::string(reinterpret_cast<const char*>(bytes[0].data_ptr<uint8_t>()),
                     static_cast<size_t>(n));
}

std::string Mib(int64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

// The trainer's device's figures; where memory_tracker cannot read that
// device yet (CUDA until the GPU path lands) the CPU tracker's, said once.
absl::StatusOr<MemoryStats> StepMemoryStats(const c10::Device& device, bool reset) {
  c10::Device use = device;
  if (!device.is_cpu()) {
    absl::StatusOr<MemoryStats> probe = MemoryStatsFor(device);
    if (absl::IsUnimplemented(probe.status())) {
      LOG_FIRST_N(WARNING, 1) << "memory figures are the CPU tracker's: "
                              << probe.status().message();
      use = c10::Device(c10::kCPU);
    }
  }
  if (reset) PP_RETURN_IF_ERROR(ResetPeakMemoryFor(use));
  return MemoryStatsFor(use);
}

}  // namespace

absl::Status StartWorkerObservability() {
  PP_RETURN_IF_ERROR(InstallCpuMemoryTracking());
  StartRankLogging();
  SetLogVerbosity(VerbosityFlag());
  return absl::OkStatus();
}

absl::StatusOr<std::optional<StepRange>> ProfileStepsFor(const ExperimentConfig& config) {
  const std::string spec = ProfileStepsFlag();
  if (spec.empty()) return std::optional<StepRange>();
  absl::StatusOr<StepRange> parsed = ParseStepRange(spec);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--profile_steps: ", parsed.status().message()));
  }
  const StepRange range = *parsed;
  if (range.first < 1 || range.last > config.steps()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--profile_steps=", spec, ": steps are numbered 1 to ", config.steps(),
        " (the run's steps, as in metrics.jsonl); give A:B with 1 <= A <= B <= ", config.steps()));
  }
  return std::optional<StepRange>(range);
}

absl::StatusOr<std::unique_ptr<RunObservability>> RunObservability::Create(
    const ExperimentConfig& config, const ParallelGrid& grid, const std::string& run_dir,
    std::chrono::milliseconds timeout) {
  std::unique_ptr<RunObservability> obs(new RunObservability());
  obs->grid_ = &grid;
  obs->config_ = config;
  obs->timeout_ = timeout;
  obs->rank0_ = grid.global_rank() == 0;
  PP_ASSIGN_OR_RETURN(obs->run_dir_, ShareRunDir(grid, run_dir, timeout));
  const int rank = grid.global_rank();
  PP_RETURN_IF_ERROR(OpenRankLog(
      (fs::path(obs->run_dir_) / "logs" / absl::StrCat("rank_", rank, ".log")).string(),
      absl::StrFormat("rank=%d stage=%d data=%d", rank, grid.stage_id(), grid.data_parallel_id())));
  LOG(INFO) << "rank " << rank << " of " << grid.world_size() << ": stage " << grid.stage_id()
            << " of " << grid.num_stages() << ", data-parallel replica " << grid.data_parallel_id()
            << " of " << grid.data_parallel_size() << "; run directory " << obs->run_dir_
            << "; --v=" << VerbosityFlag();
  PP_ASSIGN_OR_RETURN(std::optional<StepRange> profile, ProfileStepsFor(config));
  if (profile.has_value()) {
    PP_ASSIGN_OR_RETURN(obs->profiler_,
                        OperatorProfiler::Create({.steps = *profile, .rank = rank}));
    obs->profile_ = profile;
    LOG(INFO) << "profiling steps " << profile->first << " to " << profile->last;
  }
  if (obs->rank0_) {
    // A run resumed into the same directory within the second its previous
    // part started names the same event file: the resumed part takes the
    // next free suffix (TensorBoard reads every event file of the folder).
    const std::string tb_dir = (fs::path(obs->run_dir_) / "tb").string();
    absl::StatusOr<std::unique_ptr<TensorBoardWriter>> tb = TensorBoardWriter::Create(tb_dir);
    for (int part = 1; part < 100 && absl::IsAlreadyExists(tb.status()); ++part) {
      tb = TensorBoardWriter::Create(tb_dir, {.filename_suffix = absl::StrCat(".", part)});
    }
    PP_ASSIGN_OR_RETURN(obs->tb_, std::move(tb));
    LOG(INFO) << "TensorBoard events: " << obs->tb_->path();
  }
  return obs;
}

absl::Status RunObservability::BeforeStep(int64_t step, const Trainer& trainer) {
  PP_ASSIGN_OR_RETURN(MemoryStats m,
                      StepMemoryStats(trainer.options().executor.p2p.device, /*reset=*/true));
  step_start_bytes_ = m.current_bytes;
  step_start_ = std::chrono::steady_clock::now();
  if (profiler_ != nullptr) PP_RETURN_IF_ERROR(profiler_->BeginStep(step));
  VLOG(1) << "step " << step << " (train step " << step - 1 << ") begins; " << m.current_bytes
          << " bytes live";
  return absl::OkStatus();
}

absl::StatusOr<StepMemory> RunObservability::AfterStep(int64_t step, const Trainer& trainer,
                                                       bool gather) {
  // Memory first: the gather below allocates.
  PP_ASSIGN_OR_RETURN(MemoryStats m,
                      StepMemoryStats(trainer.options().executor.p2p.device, /*reset=*/false));
  local_max_peak_ = std::max(local_max_peak_, m.peak_bytes);
  if (profiler_ != nullptr) {
    const bool recorded = profiler_->recording();
    PP_RETURN_IF_ERROR(profiler_->EndStep(step));
    if (recorded) {
      for (const ActionTiming& t : trainer.last_step_timings()) {
        profiled_actions_.push_back(TraceEvent{grid_->global_rank(), ActionToString(t.action),
                                               static_cast<double>(t.start_us),
                                               static_cast<double>(t.end_us)});
      }
    }
  }
  // One line per step in every rank's log: where each rank was, when.
  LOG(INFO) << "step " << step << " done in "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - step_start_)
                   .count()
            << " ms; memory peak " << m.peak_bytes << " B, live " << m.current_bytes << " B";
  if (!gather) return StepMemory();
  const int world = grid_->world_size();
  const P2PStats p2p = trainer.p2p_stats();
  std::vector<at::Tensor> mine = {torch::tensor(
      {static_cast<int64_t>(grid_->stage_id()), step_start_bytes_, m.current_bytes, m.peak_bytes,
       local_max_peak_, trainer.OptimizerStateBytes(), p2p.tensor_messages, p2p.payload_bytes_sent},
      torch::kLong)};
  std::vector<std::vector<at::Tensor>> all(1);
  for (int r = 0; r < world; ++r) all[0].push_back(torch::empty({8}, torch::kLong));
  PP_RETURN_IF_ERROR(RunCollective("memory all-gather", grid_->DescribeWorldGroup(), timeout_,
                                   [&] { return grid_->world_group()->allgather(all, mine); }));
  StepMemory memory;
  max_peak_.assign(world, 0);
  for (int r = 0; r < world; ++r) {
    auto a = all[0][r].accessor<int64_t, 1>();
    memory.stage.push_back(static_cast<int>(a[0]));
    memory.start_bytes.push_back(a[1]);
    memory.current_bytes.push_back(a[2]);
    memory.peak_bytes.push_back(a[3]);
    max_peak_[r] = a[4];
    memory.optimizer_state_bytes.push_back(a[5]);
    memory.p2p_messages_sent.push_back(a[6]);
    memory.p2p_bytes_sent.push_back(a[7]);
  }
  if (rank0_) last_memory_ = memory;
  return memory;
}

absl::Status RunObservability::Metrics(nlohmann::json& line, const StepMemory& memory) {
  if (!memory.stage.empty()) {  // a gathered step
    line["mem_current_bytes"] = memory.current_bytes;
    line["mem_peak_bytes"] = memory.peak_bytes;
    line["mem_optimizer_state_bytes"] = memory.optimizer_state_bytes;
    line["p2p_bytes_sent"] = memory.p2p_bytes_sent;
  }
  const double wall = NowWallTimeSeconds();
  line["time"] = wall;
  if (tb_ == nullptr) return absl::OkStatus();
  const int64_t step = line.at("step").get<int64_t>();
  const std::pair<const char*, const char*> kScalars[] = {
      {"loss", "train/loss"},           {"lr", "train/lr"},
      {"grad_norm", "train/grad_norm"}, {"tokens_per_s", "train/tokens_per_s"},
      {"step_s", "train/step_time_s"},  {"eval_loss", "eval/loss"},
  };
  for (const auto& [key, tag] : kScalars) {
    if (line.contains(key)) {
      PP_RETURN_IF_ERROR(tb_->AddScalar(tag, step, line[key].get<double>(), wall));
    }
  }
  const std::pair<const char*, const char*> kPerRank[] = {
      {"bubble", "bubble_fraction"},
      {"mem_peak_bytes", "peak_memory_bytes"},
      {"mem_current_bytes", "current_memory_bytes"},
      {"mem_optimizer_state_bytes", "optimizer_state_bytes"},
  };
  for (const auto& [key, name] : kPerRank) {
    if (!line.contains(key)) continue;
    const nlohmann::json& values = line[key];
    for (size_t r = 0; r < values.size(); ++r) {
      PP_RETURN_IF_ERROR(
          tb_->AddScalar(absl::StrCat("rank_", r, "/", name), step, values[r].get<double>(), wall));
    }
  }
  return absl::OkStatus();
}

absl::Status RunObservability::Text(const std::string& tag, int64_t step, const std::string& text) {
  if (tb_ == nullptr) return absl::OkStatus();
  return tb_->AddText(tag, step, text);
}

absl::Status RunObservability::Barrier(const char* what) {
  std::vector<at::Tensor> t = {torch::zeros({1}, torch::kLong)};
  return RunCollective(what, grid_->DescribeWorldGroup(), timeout_,
                       [&] { return grid_->world_group()->allreduce(t); });
}

absl::StatusOr<std::string> RunObservability::Finish(const Trainer& trainer) {
  const int rank = grid_->global_rank();
  if (profiler_ != nullptr) {
    // A run that ended inside the range (it cannot start past it: the launcher
    // checked the range) keeps what it recorded.
    if (profiler_->recording()) PP_RETURN_IF_ERROR(profiler_->Stop());
    const fs::path dir = fs::path(run_dir_) / "profile";
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
    }
    PP_RETURN_IF_ERROR(
        profiler_->WriteChromeTrace((dir / absl::StrCat("rank_", rank, ".json")).string()));
    ChromeTraceOptions actions_options;
    actions_options.microseconds_per_unit = 1;
    actions_options.process_name = "pipe actions";
    PP_RETURN_IF_ERROR(
        WriteChromeTrace((dir / absl::StrCat("actions_rank_", rank, ".json")).string(),
                         profiled_actions_, actions_options));
    LOG(INFO) << "operator profile: " << profiler_->events().size() << " events in "
              << (dir / absl::StrCat("rank_", rank, ".json")).string();
    PP_RETURN_IF_ERROR(Barrier("profile files barrier"));
    if (rank0_) {
      // Every rank's actions in one trace (a row per rank), then the merge.
      std::vector<TraceEvent> actions;
      std::vector<std::string> operator_paths;
      for (int r = 0; r < grid_->world_size(); ++r) {
        operator_paths.push_back((dir / absl::StrCat("rank_", r, ".json")).string());
        const fs::path path = dir / absl::StrCat("actions_rank_", r, ".json");
        PP_ASSIGN_OR_RETURN(std::string text, ReadText(path));
        const nlohmann::json trace =
            nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (trace.is_discarded() || !trace.contains("traceEvents")) {
          return absl::InternalError(absl::StrCat(path.string(), " is not a Chrome trace"));
        }
        for (const nlohmann::json& e : trace["traceEvents"]) {
          if (e.value("ph", "") != "X") continue;
          const double ts = e["ts"].get<double>();
          actions.push_back(TraceEvent{e["tid"].get<int>(), e["name"].get<std::string>(), ts,
                                       ts + e["dur"].get<double>()});
        }
        fs::remove(path, ec);
      }
      PP_RETURN_IF_ERROR(
          WriteChromeTrace((dir / "actions.json").string(), actions, actions_options));
      PP_RETURN_IF_ERROR(MergeTraceFiles(operator_paths, (dir / "actions.json").string(),
                                         (dir / "merged.json").string()));
      LOG(INFO) << "merged profile: " << (dir / "merged.json").string();
    }
  }
  std::string summary;
  if (rank0_ && last_memory_.has_value()) {
    // The simulator's memory model for this schedule: per pipeline rank, the
    // peak of activations held, in one virtual stage's activations of one
    // micro-batch.
    const LoweredProgram& program = trainer.train_program();
    absl::StatusOr<SimulationResult> sim = SimulateProgram(program, {});
    // The byte planner's prediction for the schedule trained last (config
    // validation checks it against parallelism.memory_cap_mib before launch).
    const Schedule trained = ScheduleOf(program);
    absl::StatusOr<std::optional<MemoryPlan>> plan = PlanRunMemory(config_, trained);
    if (!plan.ok()) LOG(WARNING) << "no memory prediction: " << plan.status();
    summary = "memory per rank (CPU tensors; step peak = the largest over the run):\n";
    nlohmann::json figures;
    // What the figures depend on beside the config (the golden-value suite
    // compares exactly only on the same machine facts).
    const BlasKernel kernel = ThisBlasKernel();
    nlohmann::json machine;
    machine["libtorch"] = torch_compat::LibTorchVersion();
    machine["blas"] = kernel.blas;
    machine["blas_kernel"] = kernel.core;
    machine["cpu"] = kernel.cpu.model;
    machine["cpu_features"] = kernel.cpu.avx512 ? "avx512" : kernel.cpu.avx2 ? "avx2" : "none";
    figures["machine"] = machine;
    figures["schedule"] = program.schedule_name;
    figures["steps"] = trainer.step();
    figures["ranks"] = nlohmann::json::array();
    for (size_t r = 0; r < max_peak_.size(); ++r) {
      const int stage = last_memory_->stage[r];
      nlohmann::json rank = {
          {"rank", r},
          {"stage", stage},
          {"peak_bytes", max_peak_[r]},
          {"current_bytes", last_memory_->current_bytes[r]},
          {"optimizer_state_bytes", last_memory_->optimizer_state_bytes[r]},
          {"planner_peak_bytes", nullptr},
          {"p2p_messages_sent", last_memory_->p2p_messages_sent[r]},
          {"p2p_bytes_sent", last_memory_->p2p_bytes_sent[r]},
      };
      std::string predicted;
      if (sim.ok() && stage >= 0 && stage < static_cast<int>(sim->peak_memory.size())) {
        predicted = absl::StrFormat("   simulator: peak activations %g micro-batch x stage",
                                    sim->peak_memory[stage]);
      }
      if (plan.ok() && plan->has_value() && stage >= 0 &&
          stage < static_cast<int>((*plan)->ranks.size())) {
        const double bytes = (*plan)->ranks[stage].peak_bytes;
        rank["planner_peak_bytes"] = static_cast<int64_t>(bytes);
        absl::StrAppendFormat(&predicted, "   planner: peak %s (%+.0f%%)",
                              Mib(static_cast<int64_t>(bytes)),
                              max_peak_[r] > 0 ? 100 * (bytes / max_peak_[r] - 1) : 0.0);
      }
      summary +=
          absl::StrFormat("  rank %d stage %d: step peak %s, current %s, optimizer state %s%s\n", r,
                          stage, Mib(max_peak_[r]), Mib(last_memory_->current_bytes[r]),
                          Mib(last_memory_->optimizer_state_bytes[r]), predicted);
      figures["ranks"].push_back(std::move(rank));
    }
    std::ofstream out(fs::path(run_dir_) / kRunSummaryFile);
    out << figures.dump(1) << "\n";
    if (!out) {
      return absl::InternalError(
          absl::StrCat("cannot write ", (fs::path(run_dir_) / kRunSummaryFile).string()));
    }
  }
  if (tb_ != nullptr) PP_RETURN_IF_ERROR(tb_->Close());
  return summary;
}

}  // namespace pp
