#include "pipeline/runtime/trainer.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "pipeline/runtime/nccl_order.h"
#include "pipeline/schedule/ir/chrome_trace.h"
#include "pipeline/schedule/ir/vocab_passes.h"
#include "pipeline/schedule/schedules/registry.h"
#include "topology/wait_work.h"

namespace pp {
namespace {

// The vocabulary passes' stage in the IR (they belong to no virtual stage).
constexpr int kVocabularyStage = -1;

// The schedule a run with (`vocab`) or without vocabulary parallelism trains:
// `schedule` with the vocabulary passes added where it has none, with
// `barriers` (TrainerOptions::vocabulary_barriers; 0: two); refused when it
// has them but the run has no vocabulary layers.
absl::StatusOr<Schedule> WithVocabulary(Schedule schedule, bool vocab, int barriers) {
  if (vocab && !schedule.vocab_parallel) {
    return AddVocabularyPasses(schedule, PlacedVocabBarriers(barriers));
  }
  if (!vocab && schedule.vocab_parallel) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule '", schedule.name,
                     "' has vocabulary passes but the run has no vocabulary layers "
                     "(TrainerOptions::vocabulary: the model's VocabularySplit)"));
  }
  return schedule;
}

// `placement`: the model's; an evaluation schedule is re-placed onto it.
// `vocab_async`: lowered for asynchronous vocabulary collectives
// (LoweringOptions::vocab_async_collectives).
absl::StatusOr<LoweredProgram> MakeProgram(const std::string& name, const ScheduleOptions& options,
                                           bool want_forward_only, bool vocab, int barriers,
                                           const std::vector<int>* placement = nullptr,
                                           bool vocab_async = false) {
  PP_ASSIGN_OR_RETURN(Schedule schedule, MakeSchedule(name, options));
  if (placement != nullptr && schedule.forward_only && schedule.stage_to_rank != *placement) {
    // An evaluation schedule is placement-agnostic: each rank runs its
    // virtual stages in ascending order, every micro-batch (a rank's later
    // stages only wait on lower stages, so this cannot deadlock).
    schedule.stage_to_rank = *placement;
    for (int r = 0; r < schedule.num_stages; ++r) {
      schedule.ranks[r].clear();
      for (int s = 0; s < static_cast<int>(placement->size()); ++s) {
        if ((*placement)[s] != r) continue;
        for (int mb = 0; mb < schedule.num_microbatches; ++mb)
          schedule.ranks[r].push_back(F(s, mb));
      }
    }
  }
  if (schedule.forward_only != want_forward_only) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule '", name, "' is ", schedule.forward_only ? "forward-only" : "a training schedule",
        "; expected ",
        want_forward_only ? "a forward-only (evaluation) schedule" : "a training schedule"));
  }
  PP_ASSIGN_OR_RETURN(schedule, WithVocabulary(std::move(schedule), vocab, barriers));
  LoweringOptions lowering;
  lowering.vocab_async_collectives = vocab_async;
  return Lower(schedule, lowering);
}

// Trainer::Create's steps.

absl::Status CheckTrainerInputs(ParallelGrid* grid, PipelineModel* model, const LossFn& loss_fn,
                                MicroBatchSource* source, const TrainerOptions& options) {
  if (options.idle_cores && (!options.executor.p2p.device.is_cpu() || !options.set_blas_threads)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TrainerOptions::idle_cores lends CPU cores to BLAS threads: it needs device cpu (not ",
        options.executor.p2p.device.str(), ") and set_blas_threads"));
  }
  if (grid == nullptr || model == nullptr || source == nullptr || !loss_fn) {
    return absl::InvalidArgumentError(
        "Trainer::Create needs a grid, a model, a loss function and a source");
  }
  PP_RETURN_IF_ERROR(ValidateOptimizerConfig(options.optimizer));
  PP_RETURN_IF_ERROR(ValidateLrSchedule(options.lr_schedule));
  if (model->num_stages() != grid->num_stages() || model->stage() != grid->stage_id()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model is stage ", model->stage(), " of ", model->num_stages(),
        " but the grid puts this rank at stage ", grid->stage_id(), " of ", grid->num_stages()));
  }
  if (options.num_microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_microbatches (", options.num_microbatches, ") must be >= 1"));
  }
  if (options.vocabulary_async_collectives && options.vocabulary == nullptr) {
    return absl::InvalidArgumentError(
        "TrainerOptions::vocabulary_async_collectives (true) runs the vocabulary passes' "
        "collectives asynchronously, but the run has no vocabulary layers "
        "(TrainerOptions::vocabulary); set them, or leave it false");
  }
  if (options.vocabulary != nullptr) {
    // Split over the replica's pipe x model ranks, pipe-major
    // (VocabularyGroupOf).
    const VocabularyLayers& v = *options.vocabulary;
    const int64_t tp = grid->model_parallel_size();
    const int64_t want_rank =
        static_cast<int64_t>(grid->stage_id()) * tp + grid->model_parallel_id();
    if (v.tensor_size() != tp || v.group().size != grid->num_stages() * tp ||
        v.group().rank != want_rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the vocabulary layers are rank ", v.group().rank, " of ", v.group().size, " (",
          v.tensor_size(), " tensor-parallel ranks per stage) but this rank is stage ",
          grid->stage_id(), " of ", grid->num_stages(), ", tensor-parallel rank ",
          grid->model_parallel_id(), " of ", tp, " (vocabulary rank ", want_rank,
          "); split them over VocabularyGroupOf(grid)"));
    }
  }
  return absl::OkStatus();
}

// Tie groups: one process group per key over this replica's stages holding
// it, created in key order by the members only.
absl::StatusOr<std::vector<TiedParams>> MakeTies(ParallelGrid& grid, PipelineModel& model) {
  std::vector<TiedParams> ties;
  for (const TieGroup& group : model.LocalTieGroups()) {
    TiedParams tie;
    tie.key = group.key;
    std::vector<int> ranks;
    for (int64_t stage : group.stages) {
      PP_ASSIGN_OR_RETURN(int r,
                          grid.StageToGlobal(static_cast<int>(stage), grid.data_parallel_id()));
      ranks.push_back(r);
    }
    tie.members = grid.DescribeGroup("tie group", ranks);
    if (ranks.size() > 1) {
      // One tie group per data-parallel replica and tensor-parallel rank:
      // each rank's shard of a tied weight is tied to the same shard.
      PP_ASSIGN_OR_RETURN(
          tie.group,
          grid.NewGroup(ranks, absl::StrCat("tie.", group.key, ".dp", grid.data_parallel_id(),
                                            ".mp", grid.model_parallel_id())));
    }
    PP_ASSIGN_OR_RETURN(auto named, model.TiedParameters(group.key));
    for (const auto& item : named) tie.params.push_back(item.value());
    tie.counts_in_norm = !group.stages.empty() && group.stages.front() == grid.stage_id();
    ties.push_back(std::move(tie));
  }
  return ties;
}

// `params` less the tied copies whose owner is another stage (the gradient
// norm counts each tied parameter once) and, on tensor-parallel ranks other
// than 0, less the parameters every tensor-parallel rank holds whole (norm
// weights, a row-parallel layer's bias) and the slices a lower rank holds too
// (ShardSpec::replicas): the norm is reduced over pipe x model, so a
// replicated parameter counts once and a sharded one once per slice, as the
// dense model's norm does.
std::vector<torch::Tensor> CountedParams(const std::vector<torch::Tensor>& params,
                                         const std::vector<TiedParams>& ties,
                                         const PipelineModel& model, const ParallelGrid& grid) {
  std::set<const void*> non_owner;
  for (const TiedParams& tie : ties) {
    if (tie.counts_in_norm) continue;
    for (const torch::Tensor& p : tie.params) non_owner.insert(p.unsafeGetTensorImpl());
  }
  if (grid.model_parallel_size() > 1 && grid.model_parallel_id() != 0) {
    const std::map<std::string, tensor_parallel::ShardSpec> sharded = ModelShardDims(model);
    for (const auto& item : model.named_parameters()) {
      auto it = sharded.find(item.key());
      // A slice several ranks hold counts on the first of them.
      if (it == sharded.end() || grid.model_parallel_id() % it->second.replicas != 0) {
        non_owner.insert(item.value().unsafeGetTensorImpl());
      }
    }
  }
  std::vector<torch::Tensor> counted;
  for (const torch::Tensor& p : params) {
    if (non_owner.count(p.unsafeGetTensorImpl()) == 0) counted.push_back(p);
  }
  return counted;
}

absl::Status CheckFp32ForBf16(const std::vector<torch::Tensor>& params) {
  for (const torch::Tensor& p : params) {
    if (p.scalar_type() != torch::kFloat) {
      return absl::InvalidArgumentError(
          absl::StrCat("TrainerOptions::precision bf16 takes the model in fp32 (the masters are "
                       "copied from it) but a parameter is ",
                       c10::toString(p.scalar_type())));
    }
  }
  return absl::OkStatus();
}

// The executor's forward of each local virtual stage.
std::map<int, std::function<Activations(const Activations&, const MicroBatch&)>> StageForwards(
    PipelineModel& model, Precision precision) {
  std::map<int, std::function<Activations(const Activations&, const MicroBatch&)>> stages;
  for (int64_t c = 0; c < model.num_chunks(); ++c) {
    StageModule chunk = model.chunk(c);
    const int vstage = static_cast<int>(chunk->virtual_stage());
    if (precision == Precision::kBf16) {
      // A stage's floating inputs in bf16: the first stage's (from the
      // source) are cast; received ones already are, so p2p carries bf16.
      stages[vstage] = [chunk](const Activations& in, const MicroBatch& batch) mutable {
        return chunk->Forward(CastFloating(in, torch::kBFloat16), batch);
      };
    } else {
      stages[vstage] = [chunk](const Activations& in, const MicroBatch& batch) mutable {
        return chunk->Forward(in, batch);
      };
    }
  }
  return stages;
}

// Refuses `tensor` off the run's device: "... but <what_is> on <its device>;
// move <move>".
absl::Status CheckOnDevice(const torch::Tensor& tensor, const std::string& what_is,
                           const torch::Device& device, const std::string& move) {
  if (tensor.device() == device) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("TrainerOptions::executor.p2p.device is ",
                                                 device.str(), " but ", what_is, " on ",
                                                 tensor.device().str(), "; move ", move));
}

absl::Status CheckParametersOn(const PipelineModel& model, const torch::Device& device) {
  for (const auto& item : model.named_parameters()) {
    PP_RETURN_IF_ERROR(CheckOnDevice(item.value(), absl::StrCat("parameter ", item.key(), " is"),
                                     device, "the model first (PipelineModel::to)"));
  }
  return absl::OkStatus();
}

absl::Status CheckVocabularyOn(const VocabularyLayers& vocabulary, const torch::Device& device) {
  for (const torch::Tensor& shard : vocabulary.parameters()) {
    PP_RETURN_IF_ERROR(CheckOnDevice(
        shard, absl::StrCat("the vocabulary shards (", c10::str(shard.sizes()), ") are"), device,
        "them first (VocabularyLayers::to)"));
  }
  return absl::OkStatus();
}

}  // namespace

void BackwardProgress::Reset(const LoweredProgram& program, int rank) {
  total_.clear();
  for (const Action& action : program.ranks[rank]) {
    for (const Action& a : Leaves(action)) {
      if (a.type == ActionType::kBackward || a.type == ActionType::kBackwardWeight) {
        ++total_[a.stage];
      }
    }
  }
}

void BackwardProgress::StepStart(const ObservedStep& step) {
  done_.clear();
  status_ = absl::OkStatus();
}

void BackwardProgress::ActionEnd(const ObservedStep& step, const Action& a) {
  if (a.type != ActionType::kBackward && a.type != ActionType::kBackwardWeight) return;
  if (++done_[a.stage] == total_[a.stage] && status_.ok()) status_ = dist_->StageDone(a.stage);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(ParallelGrid* grid, PipelineModel* model,
                                                         LossFn loss_fn, MicroBatchSource* source,
                                                         TrainerOptions options) {
  PP_RETURN_IF_ERROR(CheckTrainerInputs(grid, model, loss_fn, source, options));
  std::unique_ptr<Trainer> t(new Trainer());
  t->grid_ = grid;
  t->model_ = model;
  t->options_ = options;
  ScheduleOptions so;
  so.num_stages = grid->num_stages();
  so.num_microbatches = options.num_microbatches;
  so.num_chunks = static_cast<int>(model->num_chunks());
  const bool vocab = options.vocabulary != nullptr;
  PP_ASSIGN_OR_RETURN(t->train_program_,
                      MakeProgram(options.schedule, so, false, vocab, options.vocabulary_barriers,
                                  /*placement=*/nullptr, options.vocabulary_async_collectives));
  if (t->train_program_.stage_to_rank != model->placement()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule '", options.schedule, "' places virtual stages on ranks [",
        absl::StrJoin(t->train_program_.stage_to_rank, ","),
        "] but the model was partitioned for [", absl::StrJoin(model->placement(), ","),
        "]; build the PipelineModel with PipelineModelOptions::stage_to_rank = the schedule's"));
  }
  PP_ASSIGN_OR_RETURN(t->eval_program_, MakeProgram(options.eval_schedule, so, true, vocab,
                                                    /*barriers=*/0, &model->placement()));

  if (options.layer_runner) model->set_layer_runner(options.layer_runner);
  const ModelParallelGroup& model_group = model->options().layer_environment.model_parallel;
  if (model_group.is_parallel() && model_group.sequence_parallel &&
      model_group.sequence_parallel_grads) {
    // From now on the layers leave these gradients partial for the tail.
    t->sequence_parallel_grads_ = model_group.sequence_parallel_grads;
    t->sequence_parallel_grads_->set_deferred(true);
  }
  t->params_ = model->parameters();
  PP_ASSIGN_OR_RETURN(t->ties_, MakeTies(*grid, *model));
  t->counted_params_ = CountedParams(t->params_, t->ties_, *model, *grid);
  if (vocab) {
    PP_RETURN_IF_ERROR(CheckVocabularyOn(*options.vocabulary, options.executor.p2p.device));
    // Each rank's rows are its own (over pipe x model, which the norm is
    // reduced over): every shard counts in the norm.
    for (const torch::Tensor& p : options.vocabulary->parameters()) {
      t->params_.push_back(p);
      t->counted_params_.push_back(p);
    }
  }
  PP_RETURN_IF_ERROR(BroadcastTiedParams(t->ties_, options.executor.p2p.timeout));
  if (options.precision == Precision::kBf16) {
    PP_RETURN_IF_ERROR(CheckFp32ForBf16(t->params_));
    // After the broadcast: every tied copy's master starts from the same value.
    t->master_ = std::make_unique<MasterWeights>(t->params_);
    for (TiedParams& tie : t->ties_) tie.params = t->master_->MastersOf(tie.params);
    t->counted_params_ = t->master_->MastersOf(t->counted_params_);
    // The loss (log-softmax, cross entropy) on fp32 logits.
    loss_fn = [inner = std::move(loss_fn)](const Activations& out, const MicroBatch& batch) {
      return inner(CastFloating(out, torch::kFloat), batch);
    };
  }

  StageExecutorOptions eo = options.executor;
  MicroBatchSource* run_source = source;
  if (!options.executor.p2p.device.is_cpu()) {
    // On a device: parameters there, micro-batches moved there, and p2p in
    // program order (NCCL pairs by order; DeferReceives breaks it, and device
    // receives do not block the host anyway: device_streams.h).
    PP_RETURN_IF_ERROR(CheckParametersOn(*model, options.executor.p2p.device));
    eo.defer_receives = false;
    for (const LoweredProgram* program : {&t->train_program_, &t->eval_program_}) {
      PP_RETURN_IF_ERROR(CheckPairwiseP2POrder(*program));
    }
    t->device_source_ =
        std::make_unique<DeviceMicroBatchSource>(source, options.executor.p2p.device);
    run_source = t->device_source_.get();
  }
  eo.p2p.global_ranks = grid->pipe_group_ranks();
  if (options.p2p_scatter_gather && model_group.is_parallel() && !model_group.sequence_parallel) {
    eo.p2p.split_payloads_over = model_group;
  }
  eo.vocabulary_async_collectives = options.vocabulary_async_collectives;
  eo.data_parallel_id = grid->data_parallel_id();
  eo.data_parallel_size = grid->data_parallel_size();
  t->defers_receives_ = eo.defer_receives;
  t->executor_ =
      std::make_unique<StageExecutor>(grid->stage_id(), StageForwards(*model, options.precision),
                                      std::move(loss_fn), run_source, grid->pipe_group(), eo);
  if (vocab) t->executor_->set_vocabulary(options.vocabulary, options.vocabulary_labels_key);
  PP_RETURN_IF_ERROR(t->executor_->Validate(t->train_program_));
  PP_RETURN_IF_ERROR(t->executor_->Validate(t->eval_program_));
  t->timer_ =
      std::make_unique<ActionTimer>(options.executor.p2p.device, options.executor.p2p.timeout);
  if (options.idle_cores) {
    t->idle_cores_ =
        std::make_unique<IdleCoreLender>(*options.idle_cores, options.set_blas_threads);
    PP_RETURN_IF_ERROR(t->idle_cores_->Plan(t->train_program_, grid->stage_id()));
  }
  if (t->master_) {
    t->executor_->set_after_backward([master = t->master_.get()] { master->AccumulateGrads(); });
  }
  if (options.distributed_optimizer) {
    PP_RETURN_IF_ERROR(t->MakeDistributedOptimizer());
  } else {
    t->optimizer_ =
        MakeOptimizer(options.optimizer, t->master_ ? t->master_->masters() : t->params_);
  }
  return t;
}

absl::Status Trainer::MakeDistributedOptimizer() {
  std::set<const void*> counted;
  for (const torch::Tensor& p : counted_params_) counted.insert(p.unsafeGetTensorImpl());
  std::set<const void*> tied;  // holders summed with other ranks' copies
  for (const TiedParams& tie : ties_) {
    if (!tie.group || tie.group->getSize() == 1) continue;
    for (const torch::Tensor& p : tie.params) tied.insert(p.unsafeGetTensorImpl());
  }
  // Under sequence parallelism a parameter whole on every tp rank may be
  // one whose gradient is summed over the model group at the step's first
  // tail action (which ones is learnt in the forwards): none of them starts
  // early, so its bucket waits for its stage's REDUCE_GRAD, after that sum.
  std::set<const void*> sequence_partial;
  if (sequence_parallel_grads_) {
    const std::map<std::string, tensor_parallel::ShardSpec> sharded = ModelShardDims(*model_);
    for (const auto& item : model_->named_parameters()) {
      if (sharded.count(item.key()) == 0)
        sequence_partial.insert(item.value().unsafeGetTensorImpl());
    }
  }
  // Which local stages' backward passes write each parameter's gradient.
  std::map<const void*, std::vector<int>> writers;
  for (int64_t c = 0; c < model_->num_chunks(); ++c) {
    for (const auto& item : model_->chunk_named_parameters(c)) {
      writers[item.value().unsafeGetTensorImpl()].push_back(
          static_cast<int>(model_->chunk(c)->virtual_stage()));
    }
  }
  // One group per local virtual stage (its REDUCE_GRAD starts what has not
  // started early); a module shared by two chunks of this rank belongs to
  // the first.
  std::set<const void*> seen;
  std::vector<std::vector<ShardedParam>> groups;
  for (int64_t c = 0; c < model_->num_chunks(); ++c) {
    std::vector<ShardedParam> group;
    for (const auto& item : model_->chunk_named_parameters(c)) {
      const torch::Tensor& p = item.value();
      if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
      ShardedParam sharded;
      sharded.param = p;
      sharded.holder = MasterOf(p);
      sharded.counts_in_norm = counted.count(sharded.holder.unsafeGetTensorImpl()) > 0;
      if (sequence_partial.count(p.unsafeGetTensorImpl()) == 0) {
        sharded.writer_stages = writers.at(p.unsafeGetTensorImpl());
      }
      sharded.tied_across_ranks = tied.count(sharded.holder.unsafeGetTensorImpl()) > 0;
      group.push_back(std::move(sharded));
    }
    dist_group_of_stage_[static_cast<int>(model_->chunk(c)->virtual_stage())] =
        static_cast<int>(groups.size());
    groups.push_back(std::move(group));
  }
  if (options_.vocabulary != nullptr) {
    // The vocabulary shards, a group of their own under the passes' stage
    // (-1, as their actions name it): written until the step's last pass,
    // so reduce-scattered at STEP.
    std::vector<ShardedParam> group;
    for (const torch::Tensor& p : options_.vocabulary->parameters()) {
      ShardedParam sharded;
      sharded.param = p;
      sharded.holder = MasterOf(p);
      group.push_back(std::move(sharded));
    }
    dist_group_of_stage_[kVocabularyStage] = static_cast<int>(groups.size());
    groups.push_back(std::move(group));
  }
  DistributedOptimizerOptions o;
  o.optimizer = options_.optimizer;
  o.bucket_numel = options_.bucket_numel;
  o.timeout = timeout();
  o.planted_fault = options_.distributed_optimizer_fault;
  PP_ASSIGN_OR_RETURN(dist_, DistributedOptimizer::Create(
                                 std::move(groups), grid_->data_group(),
                                 grid_->DescribeGroup("data group", grid_->data_group_ranks()), o));
  // The slices keep their own fp32 masters; the full ones keep only their
  // gradients (the fp32 accumulators).
  if (master_) master_->ReleaseValues();
  progress_ = std::make_unique<BackwardProgress>(dist_.get());
  progress_->Reset(train_program_, grid_->stage_id());
  return absl::OkStatus();
}

absl::Status Trainer::ReplaceTrainSchedule(const Schedule& schedule) {
  const std::string what =
      absl::StrCat("replacing the training schedule with '", schedule.name, "'");
  if (schedule.forward_only) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": it is forward-only"));
  }
  const int chunks = static_cast<int>(model_->num_chunks());
  if (schedule.num_stages != grid_->num_stages() ||
      schedule.num_microbatches != options_.num_microbatches || schedule.num_chunks != chunks) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": it has p=", schedule.num_stages, " m=", schedule.num_microbatches,
                     " v=", schedule.num_chunks, " but this run has p=", grid_->num_stages(),
                     " m=", options_.num_microbatches, " v=", chunks));
  }
  PP_ASSIGN_OR_RETURN(Schedule with_vocab, WithVocabulary(schedule, options_.vocabulary != nullptr,
                                                          options_.vocabulary_barriers));
  LoweringOptions lowering;
  lowering.vocab_async_collectives = options_.vocabulary_async_collectives;
  PP_ASSIGN_OR_RETURN(LoweredProgram program, Lower(with_vocab, lowering));
  if (program.stage_to_rank != model_->placement()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": it places virtual stages on ranks [", absl::StrJoin(program.stage_to_rank, ","),
        "] but the model was partitioned for [", absl::StrJoin(model_->placement(), ","), "]"));
  }
  if (!device().is_cpu()) PP_RETURN_IF_ERROR(CheckPairwiseP2POrder(program));
  PP_RETURN_IF_ERROR(executor_->Validate(program));
  if (idle_cores_) PP_RETURN_IF_ERROR(idle_cores_->Plan(program, grid_->stage_id()));
  train_program_ = std::move(program);
  if (progress_) progress_->Reset(train_program_, grid_->stage_id());
  return absl::OkStatus();
}

absl::Status Trainer::SumSequenceParallelGrads() {
  if (!sequence_parallel_grads_) return absl::OkStatus();
  std::vector<torch::Tensor> holders = sequence_parallel_grads_->Recorded(params_);
  if (master_) holders = master_->MastersOf(holders);
  return TorchCall("the sequence-parallel gradients' all-reduce", [&] {
    sequence_parallel_grads_->SumGrads(holders, model_->options().layer_environment.model_parallel);
  });
}

absl::Status Trainer::Tail(const Action& action, StepResult& result) {
  // The first tail action runs after every backward (B and W) of the step
  // and before anything reads a gradient.
  if (!sequence_parallel_summed_) {
    sequence_parallel_summed_ = true;
    PP_RETURN_IF_ERROR(SumSequenceParallelGrads());
  }
  switch (action.type) {
    case ActionType::kReduceTiedGrads:
      if (!options_.reduce_tied_grads) return absl::OkStatus();
      return AllReduceTiedGrads(ties_, timeout());
    case ActionType::kReduceGrads: {
      // A tied module shared by two chunks of this rank belongs to both
      // stages: average it only once.
      int64_t chunk = 0;
      while (chunk < model_->num_chunks() &&
             model_->chunk(chunk)->virtual_stage() != action.stage) {
        ++chunk;
      }
      if (chunk == model_->num_chunks()) {
        return absl::InternalError(
            absl::StrCat(ActionToString(action), ": this rank holds no such virtual stage"));
      }
      if (dist_) {
        PP_RETURN_IF_ERROR(progress_->status());
        return dist_->StartReduceScatter(dist_group_of_stage_.at(action.stage));
      }
      std::vector<torch::Tensor> params;
      for (const auto& item : model_->chunk_named_parameters(chunk)) {
        if (reduced_this_step_.insert(item.value().unsafeGetTensorImpl()).second)
          params.push_back(item.value());
      }
      if (master_) params = master_->MastersOf(params);
      return AverageGrads(params, grid_->data_group(), timeout());
    }
    case ActionType::kOptimizerStep: {
      if (dist_ && options_.vocabulary != nullptr) {
        PP_RETURN_IF_ERROR(dist_->StartReduceScatter(dist_group_of_stage_.at(kVocabularyStage)));
      }
      if (dist_) PP_RETURN_IF_ERROR(dist_->FinishReduceScatter());
      if (options_.vocabulary != nullptr && !dist_) {
        // The vocabulary shards belong to no stage: averaged over the data
        // group here, after every pass of the step has written them.
        std::vector<torch::Tensor> shards = options_.vocabulary->parameters();
        if (master_) shards = master_->MastersOf(shards);
        PP_RETURN_IF_ERROR(AverageGrads(shards, grid_->data_group(), timeout()));
      }
      if (options_.max_grad_norm <= 0 && !options_.report_grad_norm &&
          !options_.skip_nonfinite_updates) {
        return OptimizerStep();
      }
      PP_ASSIGN_OR_RETURN(result.grad_norm, GradNorm());
      if (options_.skip_nonfinite_updates && !std::isfinite(result.grad_norm)) {
        result.update_skipped = true;
        return absl::OkStatus();
      }
      if (options_.max_grad_norm > 0) {
        if (dist_) {
          const double coef = ClipCoefficient(result.grad_norm, options_.max_grad_norm);
          if (coef < 1.0) dist_->ScaleGrads(coef);
        } else {
          ClipGradsToNorm(master_ ? master_->masters() : params_, result.grad_norm,
                          options_.max_grad_norm);
        }
      }
      return OptimizerStep();
    }
    default:
      return absl::InternalError(absl::StrCat("not a tail action: ", ActionToString(action)));
  }
}

int64_t Trainer::OptimizerStateBytes() const {
  if (dist_) return dist_->StateBytes();
  int64_t bytes = pp::OptimizerStateBytes(*optimizer_);
  if (master_) {
    for (const torch::Tensor& m : master_->masters()) {
      bytes += static_cast<int64_t>(m.storage().nbytes());
    }
  }
  return bytes;
}

absl::StatusOr<double> Trainer::GradNorm() {
  // Over the stages, and with tensor parallelism over the stages and
  // tensor-parallel ranks (pipe x model, CountedParams).
  const bool tp = grid_->model_parallel_size() > 1;
  const c10::intrusive_ptr<c10d::ProcessGroup>& across =
      tp ? grid_->model_parallel_group() : grid_->pipe_group();
  absl::StatusOr<double> norm =
      dist_ ? ShardedGradNorm(dist_->LocalSquaredNorm(), across, grid_->data_group(), timeout(),
                              device())
            : GlobalGradNorm(
                  options_.reverse_grad_norm_order
                      ? std::vector<torch::Tensor>(counted_params_.rbegin(), counted_params_.rend())
                      : counted_params_,
                  across, grid_->data_group(), timeout(), device());
  if (norm.ok()) return norm;
  return absl::Status(
      norm.status().code(),
      absl::StrCat(
          norm.status().message(), "; ",
          tp ? grid_->DescribeGroup("model-parallel group", grid_->model_parallel_group_ranks())
             : grid_->DescribeGroup("pipe group", grid_->pipe_group_ranks()),
          ", ", grid_->DescribeGroup("data group", grid_->data_group_ranks())));
}

absl::Status Trainer::OptimizerStep() {
  if (dist_) return dist_->Step();
  return TorchCall("optimizer step", [&] {
    optimizer_->step();
    // The updated fp32 masters, rounded into the bf16 model.
    if (master_) master_->CopyToModel();
  });
}

absl::StatusOr<double> Trainer::ReduceLoss(const StepStats& stats) {
  torch::Tensor loss = torch::tensor({stats.loss_sum}, torch::kDouble).to(device());
  std::vector<at::Tensor> one = {loss};
  if (grid_->num_stages() > 1) {
    PP_RETURN_IF_ERROR(RunCollective(
        "loss all-reduce", grid_->DescribeGroup("pipe group", grid_->pipe_group_ranks()), timeout(),
        [&] { return grid_->pipe_group()->allreduce(one); }));
  }
  if (grid_->data_parallel_size() > 1) {
    PP_RETURN_IF_ERROR(RunCollective(
        "loss all-reduce", grid_->DescribeGroup("data group", grid_->data_group_ranks()), timeout(),
        [&] { return grid_->data_group()->allreduce(one); }));
  }
  // Per-token loss: the sum over every trained token of the global batch over
  // their count; else the mean of the micro-batches' means.
  const double count =
      stats.global_loss_tokens > 0
          ? static_cast<double>(stats.global_loss_tokens)
          : static_cast<double>(options_.num_microbatches * grid_->data_parallel_size());
  return loss.cpu().item<double>() / count;
}

absl::StatusOr<StepResult> Trainer::Step(const StepObservation& observe) {
  StepResult result;
  result.step = step_;
  result.learning_rate = LearningRateAt(options_.lr_schedule, options_.optimizer.lr, step_);
  reduced_this_step_.clear();
  sequence_parallel_summed_ = false;
  PP_RETURN_IF_ERROR(TorchCall("zero grads", [&] {
    if (dist_) {
      dist_->SetLearningRate(result.learning_rate);
      dist_->ZeroGrad();
    } else {
      SetLearningRate(*optimizer_, result.learning_rate);
      optimizer_->zero_grad();
    }
  }));
  model_->train();
  const bool timed = observe.trace || observe.busy_idle;
  // The timer last: it times the action, not the other observers.
  // The distributed optimizer's progress first: its ActionEnd runs last,
  // outside the timed action.
  ActionObservers observers(std::vector<ActionObserver*>{
      progress_.get(), action_observer_, idle_cores_.get(), timed ? timer_.get() : nullptr});
  executor_->set_observer(observers.empty() ? nullptr : &observers);
  absl::StatusOr<StepStats> stats =
      executor_->Run(train_program_, step_, [&](const Action& a) { return Tail(a, result); });
  executor_->set_observer(nullptr);
  PP_RETURN_IF_ERROR(stats.status());
  PP_ASSIGN_OR_RETURN(result.loss, ReduceLoss(*stats));
  result.trained_tokens = stats->global_loss_tokens;
  if (observe.busy_idle) PP_RETURN_IF_ERROR(GatherBusyIdle(result));
  last_timings_.clear();
  if (timed) last_timings_ = timer_->TakeTimings();
  ++step_;
  return result;
}

absl::Status Trainer::GatherBusyIdle(StepResult& result) {
  result.step_seconds = static_cast<double>(timer_->wall_us()) * 1e-6;
  const int world = grid_->world_size();
  torch::Tensor mine = torch::tensor({static_cast<double>(timer_->busy_us()),
                                      static_cast<double>(timer_->wall_us())},
                                     torch::kDouble)
                           .to(device());
  std::vector<std::vector<at::Tensor>> gathered(1);
  for (int r = 0; r < world; ++r) {
    gathered[0].push_back(torch::empty({2}, torch::dtype(torch::kDouble).device(device())));
  }
  std::vector<at::Tensor> input = {mine};
  PP_RETURN_IF_ERROR(
      RunCollective("busy-time all-gather", grid_->DescribeWorldGroup(), timeout(),
                    [&] { return grid_->world_group()->allgather(gathered, input); }));
  for (int r = 0; r < world; ++r) {
    torch::Tensor got = gathered[0][r].cpu();
    const double busy = got[0].item<double>() * 1e-6;
    const double wall = got[1].item<double>() * 1e-6;
    result.busy_seconds.push_back(busy);
    result.idle_seconds.push_back(std::max(0.0, wall - busy));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Trainer::Evaluate(MicroBatchSource* source, int64_t step) {
  model_->eval();
  std::optional<DeviceMicroBatchSource> on_device;
  if (!device().is_cpu() && source != nullptr) source = &on_device.emplace(source, device());
  executor_->set_observer(action_observer_);
  absl::StatusOr<StepStats> stats = executor_->Run(eval_program_, step, nullptr, source);
  executor_->set_observer(nullptr);
  model_->train();
  PP_RETURN_IF_ERROR(stats.status());
  return ReduceLoss(*stats);
}

namespace {

// Trace table rows that are reduction windows, not actions (no ActionType
// is negative): ended as the backend reported, or at the wait for it.
constexpr int64_t kReductionWindowRow = -1;
constexpr int64_t kReductionWindowEndedAtWaitRow = -2;

// "gradient reduce-scatter, stage 1 bucket 0" (the vocabulary's shards are a
// group of their own: kVocabularyStage), "(end: the wait)" when the backend
// reported no completion time.
std::string ReductionWindowName(int stage, int64_t bucket, bool ended_at_wait) {
  return absl::StrCat(
      "gradient reduce-scatter, ",
      stage == kVocabularyStage ? std::string("vocabulary") : absl::StrCat("stage ", stage),
      " bucket ", bucket, ended_at_wait ? " (end: the wait)" : "");
}

}  // namespace

absl::StatusOr<std::string> Trainer::LastStepTrace() {
  // Encode (stage, type, mb, start, end, completed) per action (completed:
  // when the collective it started without waiting completed, else -1), and
  // per reduction window of the distributed optimizer (stage,
  // kReductionWindowRow, bucket, start, end, -1); all-gather the counts, then
  // the padded event tables.
  const int world = grid_->world_size();
  std::vector<DistributedOptimizer::ReductionWindow> windows;
  if (dist_) windows = dist_->ReductionWindows();
  std::map<int, int> stage_of_group;
  for (const auto& [stage, group] : dist_group_of_stage_) stage_of_group[group] = stage;
  const int64_t n = static_cast<int64_t>(last_timings_.size() + windows.size());
  std::vector<std::vector<at::Tensor>> counts(1);
  const auto on_device = torch::dtype(torch::kLong).device(device());
  for (int r = 0; r < world; ++r) counts[0].push_back(torch::empty({1}, on_device));
  std::vector<at::Tensor> my_count = {torch::tensor({n}, torch::kLong).to(device())};
  PP_RETURN_IF_ERROR(
      RunCollective("trace count all-gather", grid_->DescribeWorldGroup(), timeout(),
                    [&] { return grid_->world_group()->allgather(counts, my_count); }));
  for (int r = 0; r < world; ++r) counts[0][r] = counts[0][r].cpu();
  int64_t max_n = 1;
  for (int r = 0; r < world; ++r) max_n = std::max(max_n, counts[0][r].item<int64_t>());
  constexpr int64_t kColumns = 6;
  torch::Tensor table = torch::full({max_n, kColumns}, -1, torch::kLong);
  for (size_t i = 0; i < last_timings_.size(); ++i) {
    const ActionTiming& t = last_timings_[i];
    table[i][0] = t.action.stage;
    table[i][1] = static_cast<int64_t>(t.action.type);
    table[i][2] = t.action.microbatch;
    table[i][3] = t.start_us;
    table[i][4] = t.end_us;
    table[i][5] = t.completed_us;
  }
  for (size_t k = 0; k < windows.size(); ++k) {
    const int64_t i = static_cast<int64_t>(last_timings_.size() + k);
    table[i][0] = stage_of_group.at(windows[k].group);
    table[i][1] = windows[k].end_at_wait ? kReductionWindowEndedAtWaitRow : kReductionWindowRow;
    table[i][2] = windows[k].bucket;
    table[i][3] = windows[k].start_us;
    table[i][4] = windows[k].end_us;
  }
  std::vector<std::vector<at::Tensor>> tables(1);
  for (int r = 0; r < world; ++r) tables[0].push_back(torch::empty({max_n, kColumns}, on_device));
  std::vector<at::Tensor> mine = {table.to(device())};
  PP_RETURN_IF_ERROR(RunCollective("trace all-gather", grid_->DescribeWorldGroup(), timeout(),
                                   [&] { return grid_->world_group()->allgather(tables, mine); }));
  for (int r = 0; r < world; ++r) tables[0][r] = tables[0][r].cpu();
  int64_t t0 = INT64_MAX;
  for (int r = 0; r < world; ++r) {
    const int64_t cnt = counts[0][r].item<int64_t>();
    for (int64_t i = 0; i < cnt; ++i) t0 = std::min(t0, tables[0][r][i][3].item<int64_t>());
  }
  std::vector<TraceEvent> events;
  for (int r = 0; r < world; ++r) {
    const int64_t cnt = counts[0][r].item<int64_t>();
    auto acc = tables[0][r].accessor<int64_t, 2>();
    for (int64_t i = 0; i < cnt; ++i) {
      const double start = static_cast<double>(acc[i][3] - t0);
      const double end = static_cast<double>(acc[i][4] - t0);
      if (acc[i][1] == kReductionWindowRow || acc[i][1] == kReductionWindowEndedAtWaitRow) {
        TraceEvent e{r,
                     ReductionWindowName(static_cast<int>(acc[i][0]), acc[i][2],
                                         acc[i][1] == kReductionWindowEndedAtWaitRow),
                     start, end};
        e.background = true;
        events.push_back(std::move(e));
        continue;
      }
      Action a{static_cast<int>(acc[i][0]), static_cast<ActionType>(acc[i][1]),
               static_cast<int>(acc[i][2])};
      events.push_back(TraceEvent{r, ActionToString(a), start, end});
      if (acc[i][5] >= 0) {
        events.push_back(
            InFlightEvent(r, ActionToString(a), start, static_cast<double>(acc[i][5] - t0)));
      }
    }
  }
  ChromeTraceOptions options;
  options.microseconds_per_unit = 1;
  options.process_name = absl::StrCat("pipeline ", train_program_.schedule_name, " (measured)");
  return ChromeTraceJson(events, options);
}

}  // namespace pp
