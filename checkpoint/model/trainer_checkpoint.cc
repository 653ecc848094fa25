#include "checkpoint/model/trainer_checkpoint.h"

#include <cstdlib>
#include <optional>
#include <set>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "checkpoint/model/checkpoint_dir.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "pipeline/runtime/grad_sync.h"
#include "pipeline/runtime/optimizer.h"
#include "topology/rendezvous.h"

namespace pp {
namespace {

constexpr char kCpuRngKey[] = "cpu_rng_state";

}  // namespace

CheckpointRank CheckpointRankOf(const ParallelGrid& grid, std::chrono::milliseconds timeout) {
  CheckpointRank rank;
  rank.rank = grid.global_rank();
  rank.world_size = grid.world_size();
  rank.stage = grid.stage_id();
  rank.num_stages = grid.num_stages();
  rank.data_rank = grid.data_parallel_id();
  rank.data_size = grid.data_parallel_size();
  rank.model_rank = grid.model_parallel_id();
  rank.model_size = grid.model_parallel_size();
  rank.world = grid.world_group();
  rank.timeout = timeout;
  return rank;
}

ModelState ModelStateOf(const PipelineModel& model) {
  ModelState state;
  state.num_layers = model.num_layers();
  std::set<const void*> seen;
  for (const StageModule& chunk : model.chunks()) {
    ModelState part = ModelStateOfModule(*chunk, model.num_layers());
    for (auto& [name, t] : part.tensors) {
      if (seen.insert(t.unsafeGetTensorImpl()).second) state.tensors.emplace_back(name, t);
    }
  }
  for (const TieGroup& group : model.tie_groups()) {
    if (!group.stages.empty())
      state.tie_writer_stage[group.key] = static_cast<int>(group.stages.front());
  }
  state.shard_dims = ModelShardDims(model);
  return state;
}

namespace {

// ModelStateOf with each parameter replaced by the Trainer's fp32 master
// (bf16 training): checkpoints hold the master weights, so they load into an
// fp32 or a bf16 run alike, and the optimizer state (keyed by the masters)
// matches. Under fp32 the masters are the parameters.
// With the distributed optimizer the masters and the optimizer state are
// slices: `whole` stands in for them unsharded (gathered to save, scattered
// after a load), so the files are those of a run without it and load into any
// layout, with or without it.
ModelState MasterStateOf(const PipelineModel& model, const Trainer& trainer,
                         const DistributedOptimizer::WholeState* whole = nullptr) {
  ModelState state = ModelStateOf(model);
  for (auto& [name, t] : state.tensors) {
    torch::Tensor value = whole != nullptr ? whole->ValueOf(t) : torch::Tensor();
    t = value.defined() ? value : trainer.MasterOf(t);
  }
  return state;
}

// The vocabulary layers' shards (TrainerOptions::vocabulary) live outside the
// model's layer files: a checkpoint without them would resume wrong.
absl::Status CheckNoVocabularyLayers(const Trainer& trainer, const char* what) {
  if (trainer.vocabulary() == nullptr) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      what,
      " a vocabulary-parallel run (TrainerOptions::vocabulary) is not implemented yet: "
      "the tables' shards and their optimizer state are not in the model's layer files"));
}

}  // namespace

absl::StatusOr<std::string> SaveTrainingCheckpoint(const TrainingCheckpointOptions& options,
                                                   const ParallelGrid& grid,
                                                   const PipelineModel& model, Trainer& trainer) {
  PP_RETURN_IF_ERROR(CheckNoVocabularyLayers(trainer, "saving a checkpoint of"));
  std::optional<DistributedOptimizer::WholeState> whole;
  if (trainer.distributed_optimizer() != nullptr) {
    PP_ASSIGN_OR_RETURN(whole, trainer.distributed_optimizer()->GatherWholeState());
  }
  ModelState state = MasterStateOf(model, trainer, whole ? &*whole : nullptr);
  SaveRequest request;
  request.root = options.root;
  request.step = trainer.step();
  request.keep_last = options.keep_last;
  request.model = &state;
  request.optimizer = whole ? whole->optimizer.get() : &trainer.optimizer();
  const TrainerOptions& to = trainer.options();
  request.trainer.set_step(trainer.step());
  request.trainer.set_lr_step(trainer.step());
  // The data sources are indexed by step: the position is the step itself.
  request.trainer.set_data_position(trainer.step());
  request.trainer.set_seed(options.seed);
  request.trainer.set_lr(LearningRateAt(to.lr_schedule, to.optimizer.lr, trainer.step()));
  request.topology.set_pipe(grid.num_stages());
  request.topology.set_data(grid.data_parallel_size());
  request.topology.set_model(grid.model_parallel_size());
  request.topology.set_num_chunks(static_cast<int32_t>(model.num_chunks()));
  request.topology.set_schedule(to.schedule);
  request.config = options.config;
  request.owner = options.owner;
  request.metadata["writer"] = "pipe SaveTrainingCheckpoint";
  request.metadata["optimizer"] = to.optimizer.name;
  request.rank_state.emplace_back(kCpuRngKey, at::detail::getDefaultCPUGenerator().get_state());
  return SaveCheckpoint(request, CheckpointRankOf(grid));
}

absl::StatusOr<LoadReport> LoadTrainingCheckpoint(const std::string& path, const ParallelGrid& grid,
                                                  PipelineModel& model, Trainer& trainer,
                                                  const LoadOptions& options) {
  PP_RETURN_IF_ERROR(CheckNoVocabularyLayers(trainer, "loading a checkpoint into"));
  std::optional<DistributedOptimizer::WholeState> whole;
  if (trainer.distributed_optimizer() != nullptr) {
    whole = trainer.distributed_optimizer()->NewWholeState();
  }
  ModelState state = MasterStateOf(model, trainer, whole ? &*whole : nullptr);
  PP_ASSIGN_OR_RETURN(
      LoadReport report,
      LoadCheckpoint(path, state, whole ? whole->optimizer.get() : &trainer.optimizer(),
                     CheckpointRankOf(grid), options));
  if (whole) {
    // This rank's slices of the loaded masters and state, and the model's
    // parameters from the masters.
    PP_RETURN_IF_ERROR(trainer.distributed_optimizer()->ScatterWholeState(*whole));
  }
  // bf16: the loaded fp32 masters, rounded into the model.
  PP_RETURN_IF_ERROR(TorchCall("casting the loaded master weights into the model",
                               [&] { trainer.MastersChanged(); }));
  trainer.set_step(report.manifest.trainer().step());
  bool rng_restored = false;
  for (const auto& [key, t] : report.rank_state) {
    if (key != kCpuRngKey) continue;
    PP_RETURN_IF_ERROR(
        TorchCall(absl::StrCat("restoring the CPU RNG state from ", report.dir), [&] {
          at::Generator gen = at::detail::getDefaultCPUGenerator();
          std::lock_guard<std::mutex> lock(gen.mutex());
          gen.set_state(t);
        }));
    rng_restored = true;
  }
  if (!rng_restored) {
    LOG(INFO)
        << "checkpoint " << report.dir << " was written under another layout (pipe "
        << report.manifest.topology().pipe() << " x data " << report.manifest.topology().data()
        << "): weights, optimizer state and step restored, RNG states not (dropout masks differ)";
  }
  return report;
}

absl::StatusOr<TrainingCheckpointer> TrainingCheckpointer::Create(CheckpointPolicy policy) {
  if (policy.save_interval < 0) {
    return absl::InvalidArgumentError(absl::StrCat("save_interval (", policy.save_interval,
                                                   ") must be >= 0 (0: no periodic saves)"));
  }
  if (policy.dir.empty() &&
      (policy.save_interval > 0 || policy.save_final || policy.resume == "auto")) {
    return absl::InvalidArgumentError(
        "saving checkpoints (save_interval > 0 or save_final) or resume=auto needs a checkpoint "
        "dir");
  }
  return TrainingCheckpointer(std::move(policy));
}

absl::StatusOr<bool> TrainingCheckpointer::MaybeResume(const ParallelGrid& grid,
                                                       PipelineModel& model, Trainer& trainer) {
  const bool saves = policy_.save_interval > 0 || policy_.save_final || policy_.save_on_signal;
  if (saves && policy_.lock_dir && lock_ == nullptr) {
    absl::Status locked = absl::OkStatus();
    if (grid.global_rank() == 0) {
      const char* run_id = std::getenv(kRunIdVariable);
      absl::StatusOr<std::unique_ptr<CheckpointDirLock>> lock = CheckpointDirLock::Acquire(
          policy_.dir, ThisProcessAsHolder(run_id == nullptr ? "" : run_id, policy_.owner));
      if (lock.ok()) {
        if (!(*lock)->recovered().empty()) LOG(WARNING) << (*lock)->recovered();
        lock_ = std::move(*lock);
      } else {
        locked = lock.status();
      }
    }
    // Every rank stops when rank 0 could not take it.
    PP_RETURN_IF_ERROR(
        AgreeOnCheckpointStatus(CheckpointRankOf(grid), locked, "locking " + policy_.dir));
  }
  std::string path = policy_.resume;
  // A restart continues from what the failed attempt saved.
  if (policy_.restarted && !policy_.dir.empty() && !CheckRootHoldsNoCheckpoints(policy_.dir).ok()) {
    path = "auto";
  }
  if (path.empty()) {
    if (saves) PP_RETURN_IF_ERROR(CheckRootHoldsNoCheckpoints(policy_.dir));
    return false;
  }
  if (path == "auto") {
    PP_ASSIGN_OR_RETURN(ResumeChoice choice, ChooseResumeCheckpoint(policy_.dir));
    if (choice.dir.empty()) {
      LOG(INFO) << "resume=auto: no checkpoint in " << policy_.dir << "; starting fresh";
      return false;
    }
    if (!choice.warning.empty()) LOG(WARNING) << "resume=auto: " << choice.warning;
    path = choice.dir;
  } else {
    PP_ASSIGN_OR_RETURN(path, ResolveCheckpointDir(path));
  }
  {
    PP_ASSIGN_OR_RETURN(checkpoint::Manifest manifest, ReadManifest(path));
    PP_RETURN_IF_ERROR(
        CheckCheckpointOwner(path, manifest, policy_.owner, policy_.resume_other_runs));
    if (policy_.check_manifest) PP_RETURN_IF_ERROR(policy_.check_manifest(manifest));
  }
  PP_ASSIGN_OR_RETURN(LoadReport report, LoadTrainingCheckpoint(path, grid, model, trainer));
  LOG(INFO) << report.Summary() << "; continuing at step " << trainer.step();
  return true;
}

absl::StatusOr<std::string> TrainingCheckpointer::AfterStep(const ParallelGrid& grid,
                                                            const PipelineModel& model,
                                                            Trainer& trainer, int64_t last_step) {
  const int64_t step = trainer.step();
  bool due = policy_.save_interval > 0 && step % policy_.save_interval == 0;
  due = due || (policy_.save_final && step == last_step);
  if (!due) return std::string();
  return Save(grid, model, trainer);
}

absl::StatusOr<std::string> TrainingCheckpointer::Save(const ParallelGrid& grid,
                                                       const PipelineModel& model,
                                                       Trainer& trainer) {
  if (policy_.before_save) PP_RETURN_IF_ERROR(policy_.before_save());
  TrainingCheckpointOptions options;
  options.root = policy_.dir;
  options.keep_last = policy_.keep_last;
  options.config = policy_.config;
  options.seed = policy_.seed;
  options.owner = policy_.owner;
  return SaveTrainingCheckpoint(options, grid, model, trainer);
}

}  // namespace pp
