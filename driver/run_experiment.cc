#include "driver/run_experiment.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <glog/logging.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/model/checkpoint_dir.h"
#include "checkpoint/model/checkpoint_lock.h"
#include "checkpoint/model/trainer_checkpoint.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "driver/memory_budget.h"
#include "driver/preflight.h"
#include "driver/progress.h"
#include "driver/resume_config.h"
#include "driver/run_observability.h"
#include "driver/run_report.h"
#include "driver/save_on_signal.h"
#include "driver/worker_status_observer.h"
#include "models/registry.h"
#include "pipeline/auto_schedule/auto_schedule.h"
#include "pipeline/autograd/activation_checkpointing.h"
#include "pipeline/partition/partitioner.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/action_log.h"
#include "pipeline/runtime/action_observer.h"
#include "pipeline/runtime/mixed_precision.h"
#include "pipeline/runtime/model_parallel_group.h"
#include "pipeline/runtime/nonfinite_guard.h"
#include "pipeline/runtime/trainer.h"
#include "pipeline/runtime/vocab_layers.h"
#include "pipeline/schedule/schedules/registry.h"
#include "topology/launcher.h"
#include "topology/launcher_status.h"
#include "topology/parallel_grid.h"
#include "topology/process_topology.h"
#include "topology/rendezvous.h"
#include "topology/wait_work.h"
#include "topology/worker_resources.h"

namespace pp {
namespace {

// The named steps of RunExperiment, each on the state the earlier ones built.

// Rendezvous and the pipe x data x model grid (tensor-parallel peers on
// neighbouring ranks). The World outlives the grid's groups.
struct Cluster {
  World world;
  std::unique_ptr<ParallelGrid> grid;
};

absl::StatusOr<Cluster> JoinCluster(const driver::ParallelismConfig& par,
                                    std::chrono::milliseconds timeout) {
  RendezvousOptions ro;
  ro.timeout = timeout;
  PP_ASSIGN_OR_RETURN(ro.device, ParseDeviceKind(par.device()));
  ro.transport_thread_nice = par.transport_thread_nice();
  ro.ranks_per_device = par.ranks_per_device();
  Cluster cluster;
  PP_ASSIGN_OR_RETURN(cluster.world, RendezvousFromEnv(ro));
  PP_ASSIGN_OR_RETURN(ProcessTopology topology,
                      par.tp() > 1 ? PipeModelDataParallelTopology(par.pp(), par.tp(), par.dp())
                                   : PipeDataParallelTopology(par.pp(), par.dp()));
  PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(cluster.world, topology));
  cluster.grid = std::make_unique<ParallelGrid>(std::move(grid));
  return cluster;
}

// threads.borrow_idle_cores: this rank's machine. Ranks are numbered node by
// node (the launcher, torchrun), so this node's are [rank - local_rank,
// rank - local_rank + local_world_size).
absl::StatusOr<IdleCoreOptions> IdleCoresOf(const World& world, const ParallelGrid& grid) {
  if (const char* bound = std::getenv(kBoundCoresVariable); bound != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "threads.borrow_idle_cores lends a rank its idle peers' cores, but this worker is bound "
        "to cores ",
        bound, " (the launcher's --bind_cores): drop one of them"));
  }
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr) {
    LOG(WARNING) << "threads.borrow_idle_cores without OPENBLAS_THREAD_TIMEOUT (pipe's launcher "
                    "sets 4): after each lent action OpenBLAS's idle threads yield in a loop for "
                    "~0.1 s on the cores they were lent";
  }
  IdleCoreOptions o;
  o.machine_cores = std::max<int>(1, static_cast<int>(AllowedCores().size()));
  o.machine_ranks = world.local_world_size;
  o.base_threads = CurrentWorkerThreads().blas;
  if (o.base_threads < 1) {
    return absl::FailedPreconditionError(
        "threads.borrow_idle_cores: this process's BLAS threads cannot be read or set");
  }
  const int first = world.rank - world.local_rank;
  const std::vector<int>& pipe = grid.pipe_group_ranks();
  for (int s = 0; s < static_cast<int>(pipe.size()); ++s) {
    if (s != grid.stage_id() && pipe[s] >= first && pipe[s] < first + world.local_world_size) {
      o.pipe_peers_on_machine.push_back(s);
    }
  }
  return o;
}

// The partition method every rank builds its stage with. `profile` times the
// layers, so ranks would disagree on the bounds: global rank 0 profiles every
// layer on the training data's first micro-batch and broadcasts the bounds
// over the world group; every rank then cuts by `explicit:<bounds>`. The
// broadcast carries rank 0's success, so a failed profile fails every rank
// with rank 0's reason instead of leaving them to time out.
// Under vocabulary parallelism `specs` is the split's body, whose first layer
// takes the token embeddings: rank 0 profiles on its share of them
// (`vocabulary`'s rows of the sample's ids; the shape and dtype the layer
// gets, and the passes themselves cost every rank alike).
absl::StatusOr<std::string> ResolvePartitionMethod(const ExperimentConfig& config,
                                                   const std::vector<LayerSpec>& specs,
                                                   MicroBatchSource& train, ParallelGrid& grid,
                                                   std::chrono::milliseconds timeout,
                                                   const VocabularyLayers* vocabulary) {
  const auto& par = config.parallelism();
  const std::string& method = par.partition_method();
  if (method.substr(0, method.find(':')) != "profile") return method;
  const int64_t parts = par.pp() * par.chunks();
  // [ok, b_0, ..., b_parts]
  std::vector<at::Tensor> shared = {torch::zeros({parts + 2}, torch::kLong)};
  absl::Status profiled = absl::OkStatus();
  if (grid.global_rank() == 0) {
    absl::StatusOr<Bounds> bounds = [&]() -> absl::StatusOr<Bounds> {
      PP_ASSIGN_OR_RETURN(MicroBatchData sample, train.Get(0, 0));
      if (vocabulary != nullptr) {
        PP_RETURN_IF_ERROR(TorchCall("embedding the profile's sample", [&] {
          sample.inputs = {vocabulary->Embed(sample.inputs.at(0))};
        }));
      }
      PartitionRequest request;
      request.specs = &specs;
      request.num_parts = parts;
      request.base_seed = config.seed();
      request.sample_inputs = std::move(sample.inputs);
      request.sample_batch = std::move(sample.batch);
      return Partition(method, request);
    }();
    if (bounds.ok() && static_cast<int64_t>(bounds->size()) != parts + 1) {
      bounds = absl::InternalError(absl::StrCat("the profile partitioner returned ", bounds->size(),
                                                " bounds for ", parts, " parts"));
    }
    profiled = bounds.status();
    if (bounds.ok()) {
      auto b = shared[0].accessor<int64_t, 1>();
      b[0] = 1;
      for (int64_t i = 0; i <= parts; ++i) b[i + 1] = (*bounds)[i];
    }
  }
  PP_RETURN_IF_ERROR(RunCollective("partition bounds broadcast", grid.DescribeWorldGroup(), timeout,
                                   [&] { return grid.world_group()->broadcast(shared); }));
  if (!profiled.ok()) {
    return absl::Status(profiled.code(), absl::StrCat("parallelism.partition_method 'profile': ",
                                                      profiled.message()));
  }
  auto b = shared[0].accessor<int64_t, 1>();
  if (b[0] != 1) {
    return absl::FailedPreconditionError(
        "parallelism.partition_method 'profile': rank 0 could not profile the model (its log "
        "names the reason)");
  }
  std::vector<int64_t> bounds;
  for (int64_t i = 0; i <= parts; ++i) bounds.push_back(b[i + 1]);
  const std::string resolved = absl::StrCat("explicit:", absl::StrJoin(bounds, ","));
  LOG(INFO) << "partition '" << method
            << "' measured by rank 0 on the first training micro-batch: " << resolved;
  return resolved;
}

// This rank's stage of the model the config names, cut by `partition_method`
// (ResolvePartitionMethod), its layers told the `device` and dtype they train
// in and their tensor-parallel group.
absl::StatusOr<std::unique_ptr<PipelineModel>> BuildStage(
    const ExperimentConfig& config, const std::vector<LayerSpec>& specs,
    const std::string& partition_method, int stage, torch::Device device,
    const ModelParallelGroup& model_parallel) {
  const auto& par = config.parallelism();
  PipelineModelOptions mo;
  mo.layer_environment.model_parallel = model_parallel;
  mo.num_stages = par.pp();
  mo.chunks = par.chunks();
  mo.partition_method = partition_method;
  mo.base_seed = config.seed();
  mo.layer_environment.device = device;
  PP_ASSIGN_OR_RETURN(const Precision precision, ParsePrecision(config.precision()));
  mo.layer_environment.param_dtype = ComputeDtype(precision);
  // The schedule's placement (V for zbv); its errors are the Trainer's to report.
  PP_ASSIGN_OR_RETURN(const std::string starting, StartingSchedule(par.schedule(), par.chunks()));
  if (absl::StatusOr<Schedule> schedule = MakeSchedule(
          starting, {static_cast<int>(par.pp()), static_cast<int>(par.num_microbatches()),
                     static_cast<int>(par.chunks()), 0});
      schedule.ok()) {
    mo.stage_to_rank = schedule->stage_to_rank;
  }
  return PipelineModel::Create(specs, mo, stage);
}

// PP_PLANTED_FAULT's value, checked (CheckPlantedFault).
absl::StatusOr<std::string> PlantedFault() {
  const char* value = std::getenv(kPlantedFaultVariable);
  const std::string fault = value == nullptr ? "" : value;
  if (fault.empty() || fault == "grad_norm_order" || fault == "dropped_microbatch") return fault;
  return absl::InvalidArgumentError(
      absl::StrCat(kPlantedFaultVariable, "='", fault,
                   "' is not a planted fault (testing only: grad_norm_order or "
                   "dropped_microbatch, or unset)"));
}

// The Trainer's options from the config's parallelism, optimizer, LR schedule
// and activation checkpointing, and a planted fault (testing only).
absl::StatusOr<TrainerOptions> MakeTrainerOptions(const ExperimentConfig& config,
                                                  std::chrono::milliseconds timeout) {
  const auto& par = config.parallelism();
  TrainerOptions to;
  PP_ASSIGN_OR_RETURN(to.schedule, StartingSchedule(par.schedule(), par.chunks()));
  to.num_microbatches = par.num_microbatches();
  to.skip_nonfinite_updates = config.nonfinite().policy() == "skip";
  to.optimizer = ToOptimizerConfig(config);
  to.lr_schedule = ToLrScheduleConfig(config);
  to.max_grad_norm = config.optimizer().max_grad_norm();
  PP_ASSIGN_OR_RETURN(to.precision, ParsePrecision(config.precision()));
  to.executor.p2p.timeout = timeout;
  to.executor.p2p.static_shapes = par.p2p_static_shapes();
  to.executor.post_receives_ahead = par.p2p_post_receives_ahead();
  to.distributed_optimizer = par.distributed_optimizer();
  to.vocabulary_barriers = par.vocab_barriers();  // 0: pipe's choice, as the Trainer's
  to.vocabulary_async_collectives = par.vocab_async_collectives();
  to.bucket_numel = par.ddp_bucket_size();
  if (par.activation_checkpointing().interval() > 0) {
    ActivationCheckpointPolicy policy;
    policy.interval = par.activation_checkpointing().interval();
    policy.checkpointable_types = par.activation_checkpointing().checkpointable_types();
    PP_ASSIGN_OR_RETURN(to.layer_runner, MakeCheckpointingRunner(policy));
  }
  PP_ASSIGN_OR_RETURN(const std::string fault, PlantedFault());
  if (!fault.empty()) {
    LOG(WARNING) << "testing only: planted fault " << fault << " (" << kPlantedFaultVariable
                 << "); this run does not train correctly";
  }
  to.reverse_grad_norm_order = fault == "grad_norm_order";
  if (fault == "dropped_microbatch") {
    to.executor.loss_normalization_fault = LossNormalizationFault::kDroppedMicroBatch;
  }
  return to;
}

// Model checkpoints (checkpoint/model/trainer_checkpoint.h): where they go,
// how often, how many are kept, what to resume from.
CheckpointPolicy MakeCheckpointPolicy(const ExperimentConfig& config) {
  CheckpointPolicy policy;
  policy.dir = CheckpointDirOf(config);  // checked writable by Preflight
  policy.save_interval = config.checkpoint().save_interval();
  policy.keep_last = config.checkpoint().keep_last();
  policy.resume = config.checkpoint().resume();
  policy.config = ConfigToText(config);
  policy.seed = static_cast<int64_t>(config.seed());
  // The run across its restarts is its name (the run directory changes with
  // every launch): it owns the checkpoints it writes and names itself in the
  // checkpoint dir's lock; another name's checkpoints are refused unless
  // checkpoint.resume_other_runs.
  policy.owner = config.name();
  policy.resume_other_runs = config.checkpoint().resume_other_runs();
  // Resuming under another model, seed or optimizer is refused, field by field.
  policy.check_manifest = [config](const checkpoint::Manifest& manifest) {
    std::vector<std::string> warnings;
    absl::Status status = CheckResumeConfig(manifest.config(), config, &warnings);
    for (const std::string& w : warnings) LOG(WARNING) << w;
    return status;
  };
  return policy;
}

// Mean loss over the config's eval batches (a forward-only schedule).
absl::StatusOr<double> Evaluate(const ExperimentConfig& config, Trainer& trainer,
                                MicroBatchSource* eval) {
  double sum = 0;
  for (int64_t i = 0; i < config.eval_batches(); ++i) {
    PP_ASSIGN_OR_RETURN(double loss, trainer.Evaluate(eval, i));
    sum += loss;
  }
  return sum / static_cast<double>(config.eval_batches());
}

// Steps from the trainer's current step to config.steps(): save checkpoints,
// evaluate, trace one step, report. Returns the training wall time.
absl::StatusOr<double> TrainLoop(const ExperimentConfig& config, const ParallelGrid& grid,
                                 PipelineModel& model, Trainer& trainer,
                                 TrainingCheckpointer& checkpointer, const ModelData& data,
                                 RunReport& report, RunObservability& obs,
                                 AutoScheduleRun& auto_schedule) {
  Progress progress(config.steps(), config.log_interval());
  const int64_t trace_step = std::min(config.trace_step(), config.steps() - 1);
  NonFiniteGuard nonfinite({.skip = config.nonfinite().policy() == "skip",
                            .max_skipped_steps = config.nonfinite().max_skipped_steps()});
  for (int64_t step = trainer.step(); step < config.steps(); ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool last = step + 1 == config.steps();
    const bool evaluates =
        data.eval != nullptr &&
        (last || (config.eval_interval() > 0 && (step + 1) % config.eval_interval() == 0));
    const bool traced = step >= trace_step && step < trace_step + config.trace_steps();
    // Busy/idle and memory figures (two world all-gathers, and on a device
    // waits for it) only on the steps that show them; a profiled step also
    // keeps its actions' times.
    const bool observed = progress.Logs(step) || evaluates || traced;
    const bool profiled = obs.Profiles(step + 1);
    PP_RETURN_IF_ERROR(obs.BeforeStep(step + 1, trainer));
    const bool measured = auto_schedule.Measures(step);  // schedule "auto"
    PP_ASSIGN_OR_RETURN(StepResult r, trainer.Step({.trace = traced || profiled || measured,
                                                    .busy_idle = observed}));
    PP_ASSIGN_OR_RETURN(StepMemory memory, obs.AfterStep(step + 1, trainer, observed));
    // Before the save: a non-finite state is never checkpointed.
    PP_RETURN_IF_ERROR(nonfinite.AfterStep(r, grid, model, trainer.options().executor.p2p.timeout));
    PP_RETURN_IF_ERROR(auto_schedule.AfterStep(step, grid, trainer));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::optional<double> eval_loss;
    if (evaluates) {
      PP_ASSIGN_OR_RETURN(eval_loss, Evaluate(config, trainer, data.eval.get()));
    }
    if (traced) {
      PP_ASSIGN_OR_RETURN(std::string trace, trainer.LastStepTrace());
      PP_RETURN_IF_ERROR(report.Trace(step, step == trace_step, trace));
    }
    // Packed data (per-token loss): the tokens the step trained on, which
    // vary; else the fixed windows' tokens.
    const double tokens_per_s =
        static_cast<double>(r.trained_tokens > 0 ? r.trained_tokens : data.tokens_per_step) /
        seconds;
    PP_RETURN_IF_ERROR(report.Step(step, r, tokens_per_s, seconds, eval_loss, memory, progress));
    // Saves after the step is reported, so the metrics hold every step
    // trained: a failure during a save that still commits (another rank
    // killed after its files were in) resumes after a step whose loss is
    // already written.
    PP_ASSIGN_OR_RETURN(std::string saved,
                        checkpointer.AfterStep(grid, model, trainer, config.steps()));
    if (!saved.empty() && report.active()) LOG(INFO) << "checkpoint " << saved;
    if (config.checkpoint().save_on_signal() && !last) {
      const auto& p2p = trainer.options().executor.p2p;
      PP_ASSIGN_OR_RETURN(const bool signalled, AnyRankSignalled(grid, p2p.device, p2p.timeout));
      if (signalled) {
        if (saved.empty()) {
          PP_ASSIGN_OR_RETURN(saved, checkpointer.Save(grid, model, trainer));
        }
        return StoppedBySignal(trainer.step(), saved);
      }
    }
  }
  progress.Finish();
  return progress.Elapsed();
}

// The model's sampler: sample_tokens from the prompt through the pipeline.
absl::Status SampleText(const ExperimentConfig& config, ParallelGrid& grid, ModelSampler& sampler,
                        Trainer& trainer, std::chrono::milliseconds timeout,
                        const RunReport& report) {
  const SampleRequest request{.num_tokens = config.sample_tokens(),
                              .top_k = config.sample_top_k(),
                              .temperature = config.sample_temperature(),
                              .seed = config.seed(),
                              .prompt = config.sample_prompt(),
                              .sequence_multiple = config.parallelism().sequence_parallel()
                                                       ? config.parallelism().tp()
                                                       : 1};
  PP_ASSIGN_OR_RETURN(std::string text, sampler.Sample(request, trainer, grid, timeout));
  return report.Sample(text);
}

}  // namespace

absl::Status CheckPlantedFault() { return PlantedFault().status(); }

absl::Status CheckCheckpointBeforeLaunch(const ExperimentConfig& config) {
  const CheckpointPolicy policy = MakeCheckpointPolicy(config);
  const bool saves = policy.save_interval > 0 || policy.save_final;
  if (saves) PP_RETURN_IF_ERROR(CheckCheckpointDirFree(policy.dir));
  if (policy.resume.empty()) {
    return saves ? CheckRootHoldsNoCheckpoints(policy.dir) : absl::OkStatus();
  }
  std::string path;
  if (policy.resume == "auto") {
    PP_ASSIGN_OR_RETURN(const ResumeChoice choice, ChooseResumeCheckpoint(policy.dir));
    if (choice.dir.empty()) return absl::OkStatus();
    path = choice.dir;
  } else {
    PP_ASSIGN_OR_RETURN(path, ResolveCheckpointDir(policy.resume));
    PP_RETURN_IF_ERROR(VerifyCheckpointFiles(path));
  }
  PP_ASSIGN_OR_RETURN(const checkpoint::Manifest manifest, ReadManifest(path));
  PP_RETURN_IF_ERROR(CheckCheckpointOwner(path, manifest, policy.owner, policy.resume_other_runs));
  std::vector<std::string> warnings;  // the workers log them when they resume
  absl::Status config_ok = CheckResumeConfig(manifest.config(), config, &warnings);
  if (!config_ok.ok()) {
    // Refused before any worker starts: the differences that alone would
    // only be warned about are shown beside the refusal.
    for (const std::string& w : warnings) LOG(WARNING) << w;
    return absl::Status(config_ok.code(),
                        absl::StrCat("checkpoint ", path, ": ", config_ok.message()));
  }
  return absl::OkStatus();
}

absl::Status RunExperiment(const ExperimentConfig& config) {
  PP_ASSIGN_OR_RETURN(const SelectedModel selected, SelectModel(config.model()));
  const ModelInfo& info = *selected.info;
  const std::chrono::milliseconds timeout(int64_t{1000} * config.parallelism().timeout_seconds());
  PP_ASSIGN_OR_RETURN(Cluster cluster, JoinCluster(config.parallelism(), timeout));
  ParallelGrid& grid = *cluster.grid;
  PP_ASSIGN_OR_RETURN(ModelData data, info.data(*selected.config, ModelRunOf(config)));
  if (data.train == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", info.name, "' made no training MicroBatchSource"));
  }
  // Vocabulary parallelism: the stages hold the split's body; every rank
  // holds its rows of the tables (drawn as the dense model draws them),
  // split over the replica's pipe x tensor ranks.
  std::unique_ptr<VocabularyLayers> vocabulary;
  PP_ASSIGN_OR_RETURN(std::vector<LayerSpec> specs, MakeExperimentSpecs(config));
  if (config.parallelism().vocab_parallel()) {
    PP_ASSIGN_OR_RETURN(const VocabularySplit split, info.vocabulary_split(*selected.config));
    PP_ASSIGN_OR_RETURN(
        vocabulary, MakeVocabularyLayers(
                        split, config.seed(),
                        VocabularyGroupOf(grid, timeout, config.parallelism().sequence_parallel()),
                        /*ignore_index=*/-100,
                        /*tensor_size=*/grid.model_parallel_size()));
  }
  PP_ASSIGN_OR_RETURN(
      const std::string partition_method,
      ResolvePartitionMethod(config, specs, *data.train, grid, timeout, vocabulary.get()));
  const ModelParallelGroup model_parallel =
      ModelParallelGroupOf(grid, timeout, config.parallelism().sequence_parallel());
  PP_ASSIGN_OR_RETURN(std::unique_ptr<PipelineModel> model,
                      BuildStage(config, specs, partition_method, grid.stage_id(),
                                 cluster.world.device, model_parallel));
  // Under tensor parallelism the last layer's outputs are this rank's share
  // (validation refused tp > 1 for a model without tensor_parallel_loss).
  const LossFn loss = model_parallel.is_parallel()
                          ? info.tensor_parallel_loss(*selected.config, model_parallel)
                          : info.loss;
  // A model's sampler may keep the last stage's outputs through the loss.
  const std::unique_ptr<ModelSampler> sampler =
      info.sampler ? info.sampler(*selected.config) : nullptr;
  const LossFn loss_fn = sampler != nullptr ? sampler->WrapLoss(loss) : loss;
  PP_ASSIGN_OR_RETURN(TrainerOptions to, MakeTrainerOptions(config, timeout));
  to.vocabulary = vocabulary.get();
  // --device=cuda: weights on cuda:<LOCAL_RANK>; the Trainer moves the
  // micro-batches and keeps p2p and its collectives there (NCCL).
  to.executor.p2p.device = cluster.world.device;
  if (config.threads().borrow_idle_cores()) {
    PP_ASSIGN_OR_RETURN(to.idle_cores, IdleCoresOf(cluster.world, grid));
    to.set_blas_threads = [](int threads) { return SetBlasThreads(threads); };
  }
  PP_RETURN_IF_ERROR(
      TorchCall("moving the model to its device", [&] { model->to(to.executor.p2p.device); }));
  if (vocabulary != nullptr) {
    PP_RETURN_IF_ERROR(TorchCall("moving the vocabulary shards to their device",
                                 [&] { vocabulary->to(to.executor.p2p.device); }));
  }
  PP_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                      Trainer::Create(&grid, model.get(), loss_fn, data.train.get(), to));
  if (const IdleCoreLender* lender = trainer->idle_core_lender(); lender != nullptr) {
    std::vector<std::string> lent;
    for (const auto& [action, threads] : lender->plan()) {
      lent.push_back(absl::StrCat(ActionToString(action), ":", threads));
    }
    std::sort(lent.begin(), lent.end());
    LOG(INFO) << "rank " << grid.global_rank() << ": idle cores lend BLAS threads to "
              << lent.size() << " action(s) per step"
              << (lent.empty() ? "" : absl::StrCat(" (", absl::StrJoin(lent, " "), ")"));
  }
  // The actions' observers: the launcher's status page, --v=1's action lines.
  WorkerStatusObserver worker_status;
  ActionLog action_log;
  ActionObservers action_observers(
      {WorkerStatusEnabled() ? &worker_status : nullptr, VLOG_IS_ON(1) ? &action_log : nullptr});
  if (!action_observers.empty()) trainer->set_action_observer(&action_observers);
  // Each rank's dropout stream starts from the config's seed, so a run is
  // repeatable and a resumed one (which restores the saved RNG state) exact.
  // The ranks of a model group share it (the seed depends on the stage and
  // data index, not the tp index): their dropouts then draw the dense
  // model's masks (tensor_parallel/dropout.h), the same as at tp = 1.
  const uint64_t pipe_data_rank =
      static_cast<uint64_t>(grid.global_rank() / grid.model_parallel_size());
  torch::manual_seed(config.seed() * 1000003ULL + pipe_data_rank);

  const bool rank0 = grid.global_rank() == 0;
  // A launcher restart (--max_restarts) continues from the failed attempt's
  // newest checkpoint that verifies.
  const WorkerRestart restart = WorkerRestartFromEnv();
  CheckpointPolicy ckpt_policy = MakeCheckpointPolicy(config);
  ckpt_policy.restarted = restart.count > 0;
  ckpt_policy.save_on_signal = config.checkpoint().save_on_signal();
  if (ckpt_policy.save_on_signal) InstallSaveOnSignal();
  ckpt_policy.before_save = [&grid, &model, &trainer, timeout] {
    return CheckWeightsFinite(grid, *model, trainer->step(), timeout);
  };
  PP_ASSIGN_OR_RETURN(TrainingCheckpointer checkpointer, TrainingCheckpointer::Create(ckpt_policy));
  PP_ASSIGN_OR_RETURN(bool resumed, checkpointer.MaybeResume(grid, *model, *trainer));
  if (resumed && rank0) {
    std::cout << "resumed at step " << trainer->step() << " from "
              << (ckpt_policy.restarted ? ckpt_policy.dir : ckpt_policy.resume) << std::endl;
  }
  PP_ASSIGN_OR_RETURN(RunReport report, RunReport::Open(config, info.name, rank0));
  PP_ASSIGN_OR_RETURN(std::unique_ptr<RunObservability> obs,
                      RunObservability::Create(config, grid, report.dir().string(), timeout));
  report.set_observability(obs.get());
  report.Header(data.description, data.tokens_per_step, *model);
  if (restart.count > 0) {
    LOG(INFO) << "restart " << restart.count << "/" << restart.max_restarts << " after "
              << restart.cause << "; continuing at step " << trainer->step();
    report.Restarted(restart.count, restart.max_restarts, restart.cause, trainer->step());
  }
  const auto& par = config.parallelism();
  std::optional<double> synthesis_cap;
  if (par.schedule() == kAutoSchedule) {
    PP_ASSIGN_OR_RETURN(synthesis_cap, SynthesisMemoryCap(config));
  }
  // Auto chooses within the byte plan the launcher checks the cap against.
  ScheduleFits fits_bytes = [&config](const Schedule& schedule) {
    absl::StatusOr<bool> fits = FitsMemoryCap(config, schedule);
    return !fits.ok() || *fits;
  };
  AutoScheduleRun auto_schedule(par.schedule() == kAutoSchedule, par.pp(), par.num_microbatches(),
                                par.chunks(), rank0 ? report.dir().string() : "", ckpt_policy.dir,
                                synthesis_cap, std::move(fits_bytes));
  if (!par.auto_costs().empty()) {
    PP_ASSIGN_OR_RETURN(SimulationCosts fixed,
                        AutoFixedCosts(par.auto_costs(), par.pp(), par.chunks()));
    auto_schedule.set_fixed_costs(std::move(fixed));
  }
  if (data.microbatch_costs && par.auto_costs().empty()) {
    // The profile every rank synthesises for: the indices' costs averaged
    // over the data-parallel replicas.
    auto_schedule.set_microbatch_costs([&data, dp = par.dp()](int64_t step) {
      std::vector<double> mean;
      for (int64_t r = 0; r < dp; ++r) {
        const std::vector<double> c = data.microbatch_costs(step, r);
        mean.resize(c.size(), 0.0);
        for (size_t j = 0; j < c.size(); ++j) mean[j] += c[j] / static_cast<double>(dp);
      }
      return mean;
    });
  }
  PP_RETURN_IF_ERROR(auto_schedule.Start(*trainer, trainer->step()));
  PP_ASSIGN_OR_RETURN(double train_seconds, TrainLoop(config, grid, *model, *trainer, checkpointer,
                                                      data, report, *obs, auto_schedule));
  if (const IdleCoreLender* lender = trainer->idle_core_lender(); lender != nullptr) {
    LOG(INFO) << "rank " << grid.global_rank() << ": idle cores lent BLAS threads to "
              << lender->lent_actions() << " action(s) in this run";
  }
  if (rank0) {
    const P2PStats p2p = trainer->p2p_stats();
    std::cout << "p2p (rank 0): " << p2p.tensor_messages << " messages sent ("
              << p2p.payload_bytes_sent << " payload bytes, " << config.precision() << "), "
              << p2p.control_messages << " activation control words, " << p2p.static_payloads
              << " activations as payload only (static shapes "
              << (config.parallelism().p2p_static_shapes() ? "on" : "off") << "), "
              << p2p.payloads_posted_ahead << " payloads and " << p2p.controls_posted_ahead
              << " control words received into receives posted ahead (post receives ahead "
              << (config.parallelism().p2p_post_receives_ahead() ? "on" : "off") << ")"
              << std::endl;
  }
  if (sampler != nullptr && config.sample_tokens() > 0) {
    PP_RETURN_IF_ERROR(SampleText(config, grid, *sampler, *trainer, timeout, report));
  }
  PP_ASSIGN_OR_RETURN(std::string memory_summary, obs->Finish(*trainer));
  return report.Finish(train_seconds, memory_summary);
}

}  // namespace pp
