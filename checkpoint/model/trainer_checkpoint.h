// Saving and restoring everything one rank of pipeline training needs to
// continue exactly: the stage's weights and buffers, its optimizer state (per
// layer, so it reshards), the step (which fixes the data position and the
// learning rate, both functions of the step), and the CPU RNG state (dropout).
//
//   pp::TrainingCheckpointOptions ckpt{.root = "/ckpt", .keep_last = 3};
//   if (step % 100 == 0) PP_RETURN_IF_ERROR(pp::SaveTrainingCheckpoint(ckpt, grid, *model,
//   *trainer).status());
//   ...
//   PP_ASSIGN_OR_RETURN(pp::LoadReport r, pp::LoadTrainingCheckpoint("/ckpt", grid, *model,
//   *trainer));
//
// Saving is collective over grid.world_group(); loading is local. Loading
// under another layout (pipe/data degree, schedule, chunks) restores weights,
// optimizer state and step; RNG states only come back under the same layout
// (the report says whether they did). A vocabulary-parallel Trainer
// (TrainerOptions::vocabulary) saves the dense model's files, the tables
// gathered whole, and loads any layout's (its rows cut from them).
//
// Next: checkpoint/model/model_checkpoint.h (the files), docs/checkpoints.md.
#ifndef CHECKPOINT_MODEL_TRAINER_CHECKPOINT_H_
#define CHECKPOINT_MODEL_TRAINER_CHECKPOINT_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/model/checkpoint_lock.h"
#include "checkpoint/model/model_checkpoint.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/trainer.h"
#include "topology/parallel_grid.h"

namespace pp {

// This rank's place for checkpointing, from its grid.
CheckpointRank CheckpointRankOf(const ParallelGrid& grid,
                                std::chrono::milliseconds timeout = std::chrono::minutes(5));

// The stage's parameters and buffers under global names (each once), each tie
// key written by the lowest stage holding it.
ModelState ModelStateOf(const PipelineModel& model);

struct TrainingCheckpointOptions {
  std::string root;
  // Keep this many newest checkpoints (<= 0: all).
  int keep_last = 0;
  // The experiment config (text format) stored in the manifest.
  std::string config;
  // The run's base seed, stored for reference.
  int64_t seed = 0;
  // The run (Manifest.owner), stable across its restarts.
  std::string owner;
};

// Saves the state after trainer.step() steps as <root>/step_<N>. Every rank
// of the grid calls it (after the same Step()).
absl::StatusOr<std::string> SaveTrainingCheckpoint(const TrainingCheckpointOptions& options,
                                                   const ParallelGrid& grid,
                                                   const PipelineModel& model, Trainer& trainer);

// Loads `path` (a checkpoint or a root with `latest`) into the model, the
// trainer's optimizer and step, and the CPU RNG when the layout matches.
absl::StatusOr<LoadReport> LoadTrainingCheckpoint(const std::string& path, const ParallelGrid& grid,
                                                  PipelineModel& model, Trainer& trainer,
                                                  const LoadOptions& options = {});

// What a training binary's --checkpoint_dir / --save_interval / --keep_last /
// --resume flags (or an ExperimentConfig's checkpoint message) ask for.
struct CheckpointPolicy {
  // Root holding step_N/ and `latest`.
  std::string dir;
  // Save after every `save_interval` steps (0: never, except save_final).
  int64_t save_interval = 0;
  int keep_last = 0;
  // "": start fresh. "auto": continue from `dir`'s latest checkpoint when
  // there is one, else start fresh. Anything else: a checkpoint directory or
  // a root with `latest` that must load.
  std::string resume;
  // This process belongs to a restart of a failed attempt of the run (the
  // launcher's --max_restarts): continue from the newest checkpoint of `dir`
  // that verifies when `dir` holds any (resume=auto), whatever `resume` says;
  // else as `resume` says (the first attempt's start, again).
  bool restarted = false;
  // Save after the last step as well.
  bool save_final = false;
  // The caller may save at any step (Save()): take the lock and refuse a dir
  // holding another run's checkpoints as a run saving periodically does.
  bool save_on_signal = false;
  std::string config;
  int64_t seed = 0;
  // Optional: called with the manifest of the checkpoint about to be resumed
  // from, before anything is loaded; an error stops the resume (e.g. the
  // experiment's config differs in a way that breaks an exact continuation).
  std::function<absl::Status(const checkpoint::Manifest&)> check_manifest;
  // Optional: called by every rank when a save is due, before it starts; an
  // error means no save (e.g. the weights are not finite). Must give every
  // rank the same answer (the save is collective).
  std::function<absl::Status()> before_save;
  // Who this run is across its restarts, written into every manifest as its
  // owner (the driver passes the run's name). Empty: unknown, no check.
  std::string owner;
  // Resume from a checkpoint whose manifest names another owner (by default
  // refused: CheckCheckpointOwner).
  bool resume_other_runs = false;
  // A run that saves holds `<dir>/.lock` (checkpoint_lock.h) from MaybeResume
  // on, for as long as any copy of the checkpointer lives; global rank 0
  // takes it and every rank returns the refusal when another live run holds
  // it. Off for a driver that takes the lock itself (in its launcher).
  bool lock_dir = true;
};

// Drives checkpoints from a training loop. Every rank of the grid calls the
// same methods at the same steps. Copyable; holds no references.
//
//   PP_ASSIGN_OR_RETURN(auto ckpt, pp::TrainingCheckpointer::Create(policy));
//   PP_RETURN_IF_ERROR(ckpt.MaybeResume(grid, *model, *trainer).status());
//   while (trainer->step() < steps) {
//     PP_RETURN_IF_ERROR(trainer->Step().status());
//     PP_RETURN_IF_ERROR(ckpt.AfterStep(grid, *model, *trainer, steps).status());
//   }
class TrainingCheckpointer {
 public:
  // InvalidArgument for a negative interval, or saving/resuming "auto" without a dir.
  static absl::StatusOr<TrainingCheckpointer> Create(CheckpointPolicy policy);

  // Loads per the policy. Returns whether a checkpoint was loaded; the
  // trainer's step tells where training continues. resume=auto takes what
  // ChooseResumeCheckpoint picks (logging a warning when `latest` was
  // unusable) and refuses a root whose checkpoints are all unusable; a fresh
  // run that saves refuses a dir that already holds checkpoints
  // (CheckRootHoldsNoCheckpoints), so no run replaces or prunes checkpoints of
  // another. A run that saves first takes the dir's lock (policy.lock_dir),
  // and a checkpoint written by another owner is refused unless
  // policy.resume_other_runs.
  absl::StatusOr<bool> MaybeResume(const ParallelGrid& grid, PipelineModel& model,
                                   Trainer& trainer);

  // Saves when trainer.step() is a multiple of save_interval, or equals
  // `last_step` with save_final. Returns the directory written, or "".
  absl::StatusOr<std::string> AfterStep(const ParallelGrid& grid, const PipelineModel& model,
                                        Trainer& trainer, int64_t last_step);

  // Saves the state at trainer.step() now (every rank, as AfterStep).
  absl::StatusOr<std::string> Save(const ParallelGrid& grid, const PipelineModel& model,
                                   Trainer& trainer);

  const CheckpointPolicy& policy() const { return policy_; }

 private:
  explicit TrainingCheckpointer(CheckpointPolicy policy) : policy_(std::move(policy)) {}
  CheckpointPolicy policy_;
  // Shared by copies: released when the last one goes.
  std::shared_ptr<CheckpointDirLock> lock_;
};

}  // namespace pp

#endif  // CHECKPOINT_MODEL_TRAINER_CHECKPOINT_H_
