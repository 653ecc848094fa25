// Trainer: owns a pipeline training step on one rank.
//
//   pp::TrainerOptions o; o.schedule = "1f1b"; o.num_microbatches = 8;
//   o.optimizer = {.name = "adamw", .lr = 1e-3};
//   PP_ASSIGN_OR_RETURN(auto trainer, pp::Trainer::Create(&grid, model.get(), loss_fn, &source,
//   o)); for (...) { PP_ASSIGN_OR_RETURN(pp::StepResult r, trainer->Step()); }
//
// A step: the schedule's lowered program runs on the StageExecutor; its tail
// all-reduces tied gradients within each tie group (SUM; the copies were
// broadcast from the lowest rank at Create, so they start and stay equal),
// averages gradients over the data-parallel group, clips by the global
// gradient norm (reduced over the pipe and data groups, each tied parameter
// counted once) and steps the optimizer with the scheduled learning rate.
//
// Tensor parallelism: with a grid whose model axis is > 1, build the model
// with PipelineModelOptions::layer_environment.model_parallel = this rank's
// model group (docs/tensor_parallelism.md). p2p, tie groups and the
// data-parallel average then work per tensor-parallel rank, and the norm is
// reduced over pipe x model with a parameter whole on every tp rank counted
// once and a sharded one once per shard, as in the dense model. Under
// sequence parallelism (a group made by ModelParallelGroupOf) the gradients
// of the parameters whole on every tp rank but applied to sequence shards
// (norms, row-parallel biases, position tables) are summed over the model
// group once per step, one flat all-reduce per rank at the step's first tail
// action, before the tied, data-parallel and distributed-optimizer
// reductions, the norm and the update (sequence_parallel_grads.h).
// Distributed optimizer (TrainerOptions::distributed_optimizer): REDUCE_GRAD
// reduce-scatters the stage's gradient buckets over the data group (after
// the tied all-reduce, so each tied gradient is whole before it is sliced),
// and STEP sums the norm from the slices, clips and updates them, and
// all-gathers the parameters (distributed_optimizer.h).
// The step's loss (mean over micro-batches, averaged over data-parallel
// replicas; with per-token loss the sum over the global batch's trained
// tokens over their count: micro_batch_source.h) is reported on every rank.
//
// Every rank of the grid calls every method in the same order (they contain
// collectives). Errors (timeouts naming the peer rank and action, c10::Error)
// come back as Status. Not thread-safe; borrows grid, model and source.
#ifndef PIPELINE_RUNTIME_TRAINER_H_
#define PIPELINE_RUNTIME_TRAINER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeline/layers/layer.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/action_observer.h"
#include "pipeline/runtime/action_timer.h"
#include "pipeline/runtime/device_batches.h"
#include "pipeline/runtime/distributed_optimizer.h"
#include "pipeline/runtime/grad_sync.h"
#include "pipeline/runtime/idle_core_threads.h"
#include "pipeline/runtime/mixed_precision.h"
#include "pipeline/runtime/optimizer.h"
#include "pipeline/runtime/p2p.h"
#include "pipeline/runtime/stage_executor.h"
#include "pipeline/runtime/vocab_layers.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/tensor_parallel/sequence_parallel_grads.h"
#include "topology/parallel_grid.h"

namespace pp {

struct TrainerOptions {
  std::string schedule = "1f1b";            // a registered training schedule
  std::string eval_schedule = "inference";  // a registered forward-only schedule
  int num_microbatches = 1;                 // per data-parallel replica and step
  OptimizerConfig optimizer;
  LrScheduleConfig lr_schedule;
  double max_grad_norm = 0.0;  // > 0: clip to this global norm
  // Compute the global gradient norm for StepResult even without clipping
  // (one pass over all gradients plus two scalar all-reduces per step).
  bool report_grad_norm = true;
  // A step whose global gradient norm is NaN or infinite applies no update
  // (StepResult::update_skipped); the norm is computed even when
  // report_grad_norm is false. Every rank sees the same norm, so all skip.
  bool skip_nonfinite_updates = false;
  // The executor's options (and through them p2p's), which are also the
  // Trainer's where they overlap:
  //   executor.p2p.timeout: every receive, send completion and collective
  //     waits at most this long;
  //   executor.p2p.device: where this rank computes: kCPU (Gloo), or the
  //     rank's CUDA device (the grid's groups need NCCL: GroupOptions::nccl).
  //     On a device the model must already be there (InvalidArgument naming a
  //     parameter elsewhere); the source's micro-batches are moved there
  //     (device_batches.h), p2p buffers and the step's small collectives
  //     (loss, norm, timings) live there, receives are not deferred
  //     (executor.defer_receives is ignored) and Create refuses a program
  //     whose transfers NCCL cannot pair (nccl_order.h).
  // Create sets what the grid decides: executor.data_parallel_id and
  // executor.p2p.global_ranks, and executor.p2p.split_payloads_over (below).
  StageExecutorOptions executor;
  // Megatron's scatter_gather_tensors_in_pipeline: with tensor parallelism
  // and without sequence parallelism, a stage's outputs and their gradients
  // are whole on every rank of its model group, so each rank sends 1/tp of
  // them and the receiving group all-gathers (P2POptions::
  // split_payloads_over). Under sequence parallelism each rank's outputs are
  // its own slice and go whole. Off: every rank sends the whole tensor.
  bool p2p_scatter_gather = true;
  // kBf16: Megatron's recipe (mixed_precision.h). Create takes the model in
  // fp32 (as built or loaded), keeps an fp32 master copy of every parameter
  // for the optimizer and turns the model's parameters into bf16; floating
  // inputs of each stage are cast to bf16 (so p2p carries bf16), the loss
  // function sees fp32 outputs, gradients are moved into fp32 after each
  // backward action and the tail (tied and data-parallel reductions, norm,
  // clipping, optimizer) works on the fp32 masters, which are cast back
  // into the model after the step.
  Precision precision = Precision::kFp32;
  // Set on every stage module (activation checkpointing); null keeps RunLayers.
  LayerRunner layer_runner;
  // Testing only: skip the tied-gradient all-reduce (shows that the
  // equivalence tests detect a missing reduction).
  bool reduce_tied_grads = true;
  // Megatron-core's distributed optimizer (DeepSpeed's ZeRO stage 1) over
  // the data group (distributed_optimizer.h): each data-parallel rank keeps
  // the optimizer state (fp32 masters, AdamW's moments) of a 1/dp slice of
  // every gradient bucket of its stage; REDUCE_GRAD reduce-scatters the
  // stage's buckets instead of all-reducing them, STEP updates the slice
  // (the norm summed from slices) and all-gathers the parameters in the
  // training dtype. With dp = 1 it is the plain optimizer in other clothes.
  bool distributed_optimizer = false;
  // Gradient bucket size of the distributed optimizer, in elements.
  int64_t bucket_numel = kDefaultBucketNumel;
  // Testing only: the gradient norm's squares summed in reverse parameter
  // order (the golden-value suite's planted change, experiments/golden/:
  // the same norm up to its last bits).
  bool reverse_grad_norm_order = false;
  // Testing only: a planted bug of the distributed optimizer.
  DistributedOptimizerOptions::PlantedFault distributed_optimizer_fault =
      DistributedOptimizerOptions::PlantedFault::kNone;
  // Vocabulary parallelism (issue #40): this rank's shards of the embedding
  // and the head, split over the pipe group, or pipe x model under tensor
  // parallelism (borrowed; MakeVocabularyLayers over VocabularyGroupOf from
  // the model's VocabularySplit); the model is the split's body. Create
  // adds the vocabulary passes to a schedule that has none
  // (AddVocabularyPasses; a *_vocab schedule keeps its own placement), the
  // shards train with the stages' parameters (data-parallel average or the
  // distributed optimizer's reduce-scatter at STEP, global norm, bf16
  // masters) and the loss is computed by the passes from
  // `vocabulary_labels_key` (per token with a loss mask). Under tensor
  // parallelism the body's hidden states are whole on every tensor rank, or
  // with sequence parallelism (the vocabulary group's flag) each rank's
  // slice of the sequence.
  VocabularyLayers* vocabulary = nullptr;
  std::string vocabulary_labels_key = "labels";
  // The output layer's algorithm of the passes Create (and
  // ReplaceTrainSchedule) place into a training schedule without them
  // (Schedule::vocab_barriers): 1 or 2 barriers; 0, not asked for: 2, and
  // --schedule=auto weighs registered schedules of either form, where 1 or 2
  // keeps it to that form (ChooseAutoSchedule). A schedule with its own
  // passes keeps its form; evaluation has no backward and always takes 2.
  int vocabulary_barriers = 0;
  // The vocabulary collectives of a training step start and are waited for
  // where their results are first read, so each rank computes while they
  // run (StageExecutorOptions::vocabulary_async_collectives, which this
  // sets): the same bits as blocking. --schedule=auto simulates it
  // (SimulationCosts::VocabCosts::asynchronous). Refused without
  // `vocabulary`.
  bool vocabulary_async_collectives = false;
  // threads.borrow_idle_cores, CPU only (idle_core_threads.h): this rank's
  // machine; each training step's actions that the schedule runs while
  // pipeline peers on the machine wait get their cores as BLAS threads,
  // set with `set_blas_threads` (topology's SetBlasThreads in a worker).
  // Nullopt: every action keeps the worker's threads.
  std::optional<IdleCoreOptions> idle_cores;
  std::function<bool(int)> set_blas_threads;
};

struct StepResult {
  int64_t step = 0;
  double loss = 0.0;       // mean over micro-batches and data-parallel replicas, or per token
  double grad_norm = 0.0;  // global, before clipping; 0 when not computed
  // Per-token loss (micro_batch_source.h): the tokens the global batch
  // trained on (its global_loss_tokens); else 0.
  int64_t trained_tokens = 0;
  // skip_nonfinite_updates: the gradient norm was not finite, the optimizer
  // did not step (the parameters are those before the step).
  bool update_skipped = false;
  double learning_rate = 0.0;
  // With StepObservation::busy_idle (else 0 and empty): this rank's wall
  // time of the program and, indexed by global rank, the time in compute
  // actions / the rest of the step.
  double step_seconds = 0.0;
  std::vector<double> busy_seconds;
  std::vector<double> idle_seconds;
};

// What a step measures beyond its loss. Each costs every rank time, so a
// driver asks for them on the steps it logs, evaluates or traces only; a step
// with neither reads no clock and waits for no device (action_observer.h).
struct StepObservation {
  // Per-action timings of this rank (last_step_timings, LastStepTrace): an
  // ActionTimer (action_timer.h; on a device, events around each action and
  // device waits at the step's start and end).
  bool trace = false;
  // StepResult::step_seconds, busy_seconds, idle_seconds: the same timer,
  // then one all-gather over the world group.
  bool busy_idle = false;
};

// With the distributed optimizer: counts each local stage's backward passes
// (B and W) during a step and tells the optimizer when a stage's last one
// has run, so the buckets it finalises start their reduce-scatter then
// (DistributedOptimizer::StageDone). An error is kept for the step's tail.
class BackwardProgress : public ActionObserver {
 public:
  explicit BackwardProgress(DistributedOptimizer* dist) : dist_(dist) {}
  // The per-stage totals of `rank`'s list of `program`.
  void Reset(const LoweredProgram& program, int rank);
  void StepStart(const ObservedStep& step) override;
  void ActionEnd(const ObservedStep& step, const Action& action) override;
  const absl::Status& status() const { return status_; }

 private:
  DistributedOptimizer* dist_;
  std::map<int, int> total_;
  std::map<int, int> done_;
  absl::Status status_;
};

class Trainer {
 public:
  // Builds the schedule programs, the tie groups (collective over the
  // members: every rank must call Create), broadcasts tied weights from the
  // lowest stage and makes the optimizer. InvalidArgument for options that do
  // not fit the grid or the model (named).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(ParallelGrid* grid, PipelineModel* model,
                                                         LossFn loss_fn, MicroBatchSource* source,
                                                         TrainerOptions options);

  // One training step on the source's next global batch. Every rank passes
  // the same `observe` (busy_idle is collective).
  absl::StatusOr<StepResult> Step(const StepObservation& observe = {});

  // Runs the forward-only schedule under no-grad on `source`'s batch `step`
  // and returns the mean loss (averaged over data-parallel replicas).
  absl::StatusOr<double> Evaluate(MicroBatchSource* source, int64_t step);

  // The last Step's per-action timings of all ranks as one Chrome-trace JSON
  // document (one row per global rank; the schedule package's writer).
  // Timestamps are steady_clock, aligned on one host. Collective over the
  // world group; every rank gets the document.
  absl::StatusOr<std::string> LastStepTrace();
  // This rank's timings of the last Step (absolute steady_clock microseconds,
  // program order; empty unless it was traced or timed). Not collective.
  const std::vector<ActionTiming>& last_step_timings() const { return last_timings_; }

  // Told about every Step and Evaluate (borrowed; null: none), beside the
  // Trainer's own timer: the driver's action logs and status page.
  void set_action_observer(ActionObserver* observer) { action_observer_ = observer; }

  int64_t step() const { return step_; }
  // This rank's p2p counters since Create (training and evaluation).
  P2PStats p2p_stats() const { return executor_->p2p().stats(); }
  // Continues from `step` after a checkpoint load: the next Step() reads the
  // source's batch `step` with the scheduled rate of `step`.
  void set_step(int64_t step) { step_ = step; }
  // The optimizer over the whole parameters; with the distributed optimizer
  // the one over this rank's slices (checkpoints go through
  // distributed_optimizer() then).
  torch::optim::Optimizer& optimizer() { return dist_ ? dist_->shard_optimizer() : *optimizer_; }
  // This rank's optimizer state in bytes, from the tensors' storage: the
  // optimizer's state tensors and, under bf16, the fp32 masters (with the
  // distributed optimizer: its slices, DistributedOptimizer::StateBytes).
  int64_t OptimizerStateBytes() const;
  // Null unless TrainerOptions::distributed_optimizer.
  DistributedOptimizer* distributed_optimizer() { return dist_.get(); }
  // bf16: the fp32 master of a model parameter (what checkpoints hold); fp32:
  // the parameter itself.
  const torch::Tensor& MasterOf(const torch::Tensor& param) const {
    return master_ ? master_->MasterOf(param) : param;
  }
  // After the masters were written (a checkpoint load): the model's bf16
  // parameters from them. Nothing under fp32.
  void MastersChanged() {
    if (master_ && !dist_) master_->CopyToModel();
  }
  const LoweredProgram& train_program() const { return train_program_; }
  // Trains the following steps with `schedule` instead of the one named in
  // the options (e.g. a schedule synthesised from this run's measured costs).
  // It must train, have this run's stages, micro-batches and chunks, and
  // place virtual stages as the model was partitioned; InvalidArgument names
  // what differs, and the current schedule stays. Every rank calls it with
  // the same schedule between steps. Model, optimizer state and step count
  // are untouched.
  absl::Status ReplaceTrainSchedule(const Schedule& schedule);
  const LoweredProgram& eval_program() const { return eval_program_; }
  // TrainerOptions::idle_cores's lender (its plan, the actions it lent
  // threads to); null without it.
  const IdleCoreLender* idle_core_lender() const { return idle_cores_.get(); }
  // TrainerOptions::vocabulary (null without vocabulary parallelism).
  VocabularyLayers* vocabulary() const { return options_.vocabulary; }
  // TrainerOptions::vocabulary_barriers.
  int vocabulary_barriers() const { return options_.vocabulary_barriers; }
  // TrainerOptions::vocabulary_async_collectives.
  bool vocabulary_async_collectives() const { return options_.vocabulary_async_collectives; }
  const TrainerOptions& options() const { return options_; }
  // Whether the executor runs DeferReceives(program): executor.defer_receives
  // on CPU, never on a device. What a simulation of this Trainer's steps
  // should time (SimulateAsExecuted).
  bool defers_receives() const { return defers_receives_; }

 private:
  Trainer() = default;
  absl::Status Tail(const Action& action, StepResult& result);
  // Sums the sequence-parallel replicated parameters' gradients (their fp32
  // masters under bf16) over the model group: one flat all-reduce.
  absl::Status SumSequenceParallelGrads();
  absl::Status OptimizerStep();
  // The global gradient norm (GlobalGradNorm, or ShardedGradNorm from the
  // distributed optimizer's slices).
  absl::StatusOr<double> GradNorm();
  absl::Status MakeDistributedOptimizer();
  absl::Status DistributedOptimizerStep(StepResult& result);
  absl::StatusOr<double> ReduceLoss(const StepStats& stats);
  // Busy/idle of every rank (StepResult) from this rank's timer.
  absl::Status GatherBusyIdle(StepResult& result);

  std::chrono::milliseconds timeout() const { return options_.executor.p2p.timeout; }
  const torch::Device& device() const { return options_.executor.p2p.device; }

  ParallelGrid* grid_ = nullptr;
  PipelineModel* model_ = nullptr;
  TrainerOptions options_;
  bool defers_receives_ = false;
  LoweredProgram train_program_;
  LoweredProgram eval_program_;
  std::vector<TiedParams> ties_;
  std::vector<torch::Tensor> params_;                      // this rank's parameters, each once
  std::vector<torch::Tensor> counted_params_;              // params_ minus non-owner tied copies
  std::unique_ptr<DeviceMicroBatchSource> device_source_;  // on a device only
  std::unique_ptr<StageExecutor> executor_;
  std::unique_ptr<ActionTimer> timer_;
  ActionObserver* action_observer_ = nullptr;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<MasterWeights> master_;  // bf16 only
  std::unique_ptr<DistributedOptimizer> dist_;
  // Virtual stage -> distributed optimizer group (-1: the vocabulary shards).
  std::map<int, int> dist_group_of_stage_;
  std::unique_ptr<BackwardProgress> progress_;  // with dist_
  std::unique_ptr<IdleCoreLender> idle_cores_;  // with options_.idle_cores
  std::set<const void*> reduced_this_step_;     // params averaged over data this step
  // Armed under sequence parallelism (null otherwise); summed at the step's
  // first tail action.
  std::shared_ptr<tensor_parallel::SequenceParallelGrads> sequence_parallel_grads_;
  bool sequence_parallel_summed_ = false;
  std::vector<ActionTiming> last_timings_;
  int64_t step_ = 0;
};

}  // namespace pp

#endif  // PIPELINE_RUNTIME_TRAINER_H_
