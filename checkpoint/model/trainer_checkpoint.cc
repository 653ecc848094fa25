#include "checkpoint/model/trainer_checkpoint.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "checkpoint/model/checkpoint_dir.h"
#include "common/status_macros.h"
#include "common/torch_compat.h"
#include "common/torch_status.h"
#include "pipeline/runtime/grad_sync.h"
#include "pipeline/runtime/model_parallel_group.h"
#include "pipeline/runtime/optimizer.h"
#include "pipeline/runtime/vocab_layers.h"
#include "pipeline/tensor_parallel/mappings.h"
#include "pipeline/tensor_parallel/vocab_passes.h"
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
// slices: `whole` stands in for them unsharded (the masters gathered to save,
// whose state each data rank writes in parts of its own; after a load the
// whole state scattered), so the files load into any layout, with or
// without it.
ModelState MasterStateOf(const PipelineModel& model, const Trainer& trainer,
                         const DistributedOptimizer::WholeState* whole = nullptr) {
  ModelState state = ModelStateOf(model);
  for (auto& [name, t] : state.tensors) {
    torch::Tensor value = whole != nullptr ? whole->ValueOf(t) : torch::Tensor();
    t = value.defined() ? value : trainer.MasterOf(t);
  }
  return state;
}

// --- Vocabulary parallelism (TrainerOptions::vocabulary) ---------------------
// A vocabulary-parallel run's checkpoint is the dense model's
// (VocabularyDenseLayout): the body's tensors under their dense names, each
// table whole, gathered from the vocabulary ranks' rows (pipe, or pipe x
// tensor), with its optimizer state gathered the same way. Pipe rank 0
// writes the tables (under tensor parallelism each of its tensor ranks its
// row shard: TensorParallelRows). So it loads into a run without vocabulary
// parallelism or with another pp or tp (each rank cuts its rows), and a
// dense run's checkpoint loads into a vocabulary-parallel run.
// With the distributed optimizer `whole` stands for the masters and the
// optimizer state (its slices gathered over the data group, as above).

struct VocabularyTable {
  std::string name;     // dense name
  torch::Tensor shard;  // this rank's rows: the Trainer's master, or `whole` state's value
  torch::Tensor whole;  // [vocab, D]
  // What the files hold: `whole`, or under tensor parallelism this tensor
  // rank's row shard of it, as a run without vocabulary parallelism holds
  // its VocabParallelEmbedding's (TensorParallelRows).
  torch::Tensor stored;
};

// Under tensor parallelism a table is written as the tensor-parallel layout
// writes its vocabulary-parallel embedding: each tensor rank its rows
// (padded to a multiple of tp) under ShardSpec{0, 1}, so the checkpoint loads
// at the same tp with or without vocabulary parallelism, and at another tp
// by the loader's merge and cut. The functions below take the grid's model
// group as `model` (size 1 at tp 1, where the files hold the tables whole).
constexpr tensor_parallel::ShardSpec kTableShardSpec{0, 1};

// The tensor-parallel rows of a table-shaped `whole` [vocab, ..]; `whole`
// itself at tp 1.
torch::Tensor TensorParallelRows(const torch::Tensor& whole, const ModelParallelGroup& model) {
  if (!model.is_parallel()) return whole;
  torch::NoGradGuard no_grad;
  return tensor_parallel::LocalVocabRows(whole, model);
}

// The whole table [vocab_size, ..] from every tensor rank's `stored` rows
// (TensorParallelRows); `stored` itself at tp 1. Collective over the model
// group.
absl::StatusOr<torch::Tensor> TensorParallelWhole(const torch::Tensor& stored,
                                                  const ModelParallelGroup& model,
                                                  int64_t vocab_size, const std::string& what) {
  if (!model.is_parallel()) return stored;
  torch::Tensor gathered;
  PP_RETURN_IF_ERROR(TorchCall(absl::StrCat("gathering ", what, " over the model group"), [&] {
    torch::NoGradGuard no_grad;
    gathered = tensor_parallel::AllGather(stored.detach().contiguous(), model, 0, what);
  }));
  return MergeVocabularyShards({gathered}, vocab_size);
}

// What a vocabulary-parallel rank saves or loads: the dense-named state, an
// optimizer holding its optimizer state, the tables.
struct VocabularyView {
  ModelState state;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::vector<VocabularyTable> tables;
  bool writes_tables = false;
};

// The layout's tables (the same order on every rank) and the body's masters
// under their dense names; the tables' files are pipe rank 0's.
absl::StatusOr<VocabularyView> VocabularyViewOf(const ParallelGrid& grid,
                                                const PipelineModel& model, const Trainer& trainer,
                                                const DistributedOptimizer::WholeState* whole) {
  const auto master = [&](const torch::Tensor& param) {
    return whole != nullptr ? whole->ValueOf(param) : trainer.MasterOf(param);
  };
  const VocabularyLayers& vocabulary = *trainer.vocabulary();
  const VocabularyDenseLayout& layout = vocabulary.dense_layout();
  if (!layout.known()) {
    return absl::FailedPreconditionError(
        "the run's vocabulary layers have no dense layout (build them with "
        "MakeVocabularyLayers): a checkpoint has no names to write their tables under");
  }
  VocabularyView view;
  view.writes_tables = grid.stage_id() == 0;
  view.tables.push_back({layout.embedding_name, master(vocabulary.embedding()), {}});
  if (!layout.head_name.empty()) {
    view.tables.push_back({layout.head_name, master(vocabulary.head()), {}});
  }
  ModelState body = MasterStateOf(model, trainer, whole);
  view.state.num_layers = layout.num_layers;
  view.state.tie_writer_stage = body.tie_writer_stage;
  for (const auto& [name, spec] : body.shard_dims) {
    view.state.shard_dims[layout.DenseName(name)] = spec;
  }
  // A table's file is written by one rank: no body tensor of another rank
  // may live in it.
  std::set<std::pair<int64_t, std::string>> table_files;
  for (const VocabularyTable& table : view.tables) {
    PP_ASSIGN_OR_RETURN(TensorLocation loc, LocateTensor(table.name));
    table_files.insert({loc.tie_key.empty() ? loc.layer : -1, loc.tie_key});
    if (!loc.tie_key.empty()) view.state.tie_writer_stage[loc.tie_key] = 0;
    if (grid.model_parallel_size() > 1) view.state.shard_dims[table.name] = kTableShardSpec;
  }
  for (const auto& [name, t] : body.tensors) {
    const std::string dense = layout.DenseName(name);
    PP_ASSIGN_OR_RETURN(TensorLocation loc, LocateTensor(dense));
    if (!view.writes_tables &&
        table_files.count({loc.tie_key.empty() ? loc.layer : -1, loc.tie_key}) > 0) {
      return absl::InternalError(absl::StrCat(
          "the body's ", dense, " (", name, ") shares a vocabulary table's file but lives on pipe ",
          "rank ", grid.stage_id(), "; the tables' files are pipe rank 0's"));
    }
    view.state.tensors.emplace_back(dense, t);
  }
  return view;
}

// Gathers the tables and their optimizer state; pipe rank 0 adds them to
// the state it saves. Collective over the vocabulary group.
absl::StatusOr<VocabularyView> GatherVocabularyView(const ParallelGrid& grid,
                                                    const PipelineModel& model, Trainer& trainer,
                                                    const DistributedOptimizer::WholeState* whole) {
  PP_ASSIGN_OR_RETURN(VocabularyView view, VocabularyViewOf(grid, model, trainer, whole));
  const VocabularyLayers& vocabulary = *trainer.vocabulary();
  const torch::optim::Optimizer& optimizer =
      whole != nullptr ? *whole->optimizer : trainer.optimizer();
  // The body's optimizer state, shared (the states' copies hold the same tensors).
  view.optimizer = MakeOptimizer(trainer.options().optimizer, {});
  for (const auto& [name, t] : view.state.tensors) {
    auto it = optimizer.state().find(torch_compat::OptimizerStateKeyOf(t));
    if (it != optimizer.state().end()) {
      view.optimizer->state()[torch_compat::OptimizerStateKeyOf(t)] = it->second->clone();
    }
  }
  const ModelParallelGroup model_group = ModelParallelGroupOf(grid, vocabulary.group().timeout);
  for (VocabularyTable& table : view.tables) {
    PP_ASSIGN_OR_RETURN(table.whole, vocabulary.GatherRows(table.shard, table.name));
    table.stored = TensorParallelRows(table.whole, model_group);
    PP_ASSIGN_OR_RETURN(TensorDict entries,
                        OptimizerStateTensors(optimizer, table.shard, table.name));
    std::map<std::string, at::Tensor> stored_entries;
    for (const auto& [suffix, t] : entries) {
      if (t.dim() > 0 && t.sizes() == table.shard.sizes()) {
        PP_ASSIGN_OR_RETURN(torch::Tensor whole_entry,
                            vocabulary.GatherRows(t, absl::StrCat(table.name, ".", suffix)));
        stored_entries[suffix] = TensorParallelRows(whole_entry, model_group);
      } else {
        stored_entries[suffix] = t;
      }
    }
    if (!stored_entries.empty()) {
      PP_RETURN_IF_ERROR(SetOptimizerStateTensors(*view.optimizer, table.stored, table.name,
                                                  stored_entries, "the gathered vocabulary rows"));
    }
    if (view.writes_tables) view.state.tensors.emplace_back(table.name, table.stored);
  }
  return view;
}

// Loads `path` into the vocabulary-parallel trainer: the body as any run
// loads, the tables whole (pipe rank 0 with its files; the other ranks read
// the tables alone), then each rank's rows of them and of their state.
absl::StatusOr<LoadReport> LoadVocabularyCheckpoint(const std::string& path,
                                                    const ParallelGrid& grid,
                                                    const PipelineModel& model, Trainer& trainer,
                                                    const LoadOptions& options,
                                                    DistributedOptimizer::WholeState* whole) {
  PP_ASSIGN_OR_RETURN(VocabularyView view, VocabularyViewOf(grid, model, trainer, whole));
  const VocabularyLayers& vocabulary = *trainer.vocabulary();
  torch::optim::Optimizer& optimizer = whole != nullptr ? *whole->optimizer : trainer.optimizer();
  const CheckpointRank rank = CheckpointRankOf(grid);
  std::set<torch_compat::OptimizerStateKey> trained;
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params())
      trained.insert(torch_compat::OptimizerStateKeyOf(p));
  }
  std::vector<torch::Tensor> body_params;
  for (const auto& [name, t] : view.state.tensors) {
    if (trained.count(torch_compat::OptimizerStateKeyOf(t)) > 0) body_params.push_back(t);
  }
  ModelState tables_alone;
  tables_alone.num_layers = view.state.num_layers;
  const ModelParallelGroup model_group = ModelParallelGroupOf(grid, vocabulary.group().timeout);
  std::vector<torch::Tensor> wholes;  // what the files hold: TensorParallelRows
  for (VocabularyTable& table : view.tables) {
    table.whole = torch::zeros({vocabulary.vocab_size(), table.shard.size(1)},
                               table.shard.options().requires_grad(false));
    table.stored = TensorParallelRows(table.whole, model_group).clone();
    (view.writes_tables ? view.state : tables_alone).tensors.emplace_back(table.name, table.stored);
    if (model_group.is_parallel()) tables_alone.shard_dims[table.name] = kTableShardSpec;
    wholes.push_back(table.stored);
  }
  std::vector<torch::Tensor> params = body_params;
  if (view.writes_tables) params.insert(params.end(), wholes.begin(), wholes.end());
  view.optimizer = MakeOptimizer(trainer.options().optimizer, params);
  PP_ASSIGN_OR_RETURN(LoadReport report,
                      LoadCheckpoint(path, view.state, view.optimizer.get(), rank, options));
  // Whether a load report names a table as missing or of another shape
  // (possible when loading is not strict): such a table keeps its values.
  const auto absent = [](const LoadReport& r, const std::string& name) {
    for (const std::vector<std::string>* list : {&r.missing, &r.shape_mismatches}) {
      for (const std::string& line : *list) {
        if (line == name || line.rfind(name + ":", 0) == 0) return true;
      }
    }
    return false;
  };
  std::set<std::string> not_loaded;
  if (view.writes_tables) {
    for (const VocabularyTable& table : view.tables) {
      if (absent(report, table.name)) not_loaded.insert(table.name);
    }
  }
  std::unique_ptr<torch::optim::Optimizer> tables_optimizer;
  if (!view.writes_tables) {
    // The tables' files hold tensors of pipe rank 0 (GPT's positions beside
    // its token table): read them loosely, then check the tables came.
    tables_optimizer = MakeOptimizer(trainer.options().optimizer, wholes);
    LoadOptions loose = options;
    loose.strict = false;
    PP_ASSIGN_OR_RETURN(LoadReport t,
                        LoadCheckpoint(path, tables_alone, tables_optimizer.get(), rank, loose));
    const bool expect_state = options.load_optimizer && report.optimizer_states_loaded > 0;
    for (const VocabularyTable& table : view.tables) {
      if (absent(t, table.name)) {
        if (options.strict) {
          return absl::NotFoundError(absl::StrCat("checkpoint ", t.dir, " has no ", table.name,
                                                  " of shape ", c10::str(table.whole.sizes()),
                                                  " (the vocabulary table): ", t.Summary()));
        }
        not_loaded.insert(table.name);
      }
      const bool no_state = std::find(t.optimizer_missing.begin(), t.optimizer_missing.end(),
                                      table.name) != t.optimizer_missing.end();
      if (options.strict && expect_state && no_state) {
        return absl::NotFoundError(
            absl::StrCat("checkpoint ", t.dir, " has no optimizer state for ", table.name));
      }
    }
    report.missing.insert(report.missing.end(), t.missing.begin(), t.missing.end());
    report.shape_mismatches.insert(report.shape_mismatches.end(), t.shape_mismatches.begin(),
                                   t.shape_mismatches.end());
    report.tensors_loaded += t.tensors_loaded;
    report.optimizer_states_loaded += t.optimizer_states_loaded;
    report.bytes_read += t.bytes_read;
  }
  torch::optim::Optimizer& loaded = tables_optimizer ? *tables_optimizer : *view.optimizer;
  // The body's state moves into the Trainer's optimizer (the same tensors).
  for (const torch::Tensor& p : body_params) {
    auto it = view.optimizer->state().find(torch_compat::OptimizerStateKeyOf(p));
    if (it != view.optimizer->state().end()) {
      optimizer.state()[torch_compat::OptimizerStateKeyOf(p)] = std::move(it->second);
      view.optimizer->state().erase(it);
    }
  }
  // Each rank's rows of the tables and of their state (under tensor
  // parallelism from the whole, gathered from the tensor ranks' rows).
  for (VocabularyTable& table : view.tables) {
    if (not_loaded.count(table.name) > 0) continue;
    PP_ASSIGN_OR_RETURN(table.whole, TensorParallelWhole(table.stored, model_group,
                                                         vocabulary.vocab_size(), table.name));
    PP_RETURN_IF_ERROR(TorchCall(absl::StrCat("cutting this rank's rows of ", table.name), [&] {
      torch::NoGradGuard no_grad;
      table.shard.copy_(vocabulary.LocalRows(table.whole));
    }));
    PP_ASSIGN_OR_RETURN(TensorDict entries,
                        OptimizerStateTensors(loaded, table.stored, table.name));
    if (entries.empty()) continue;
    std::map<std::string, at::Tensor> rows;
    for (const auto& [suffix, t] : entries) {
      if (t.dim() > 0 && t.sizes() == table.stored.sizes()) {
        PP_ASSIGN_OR_RETURN(torch::Tensor whole_entry,
                            TensorParallelWhole(t, model_group, vocabulary.vocab_size(),
                                                absl::StrCat(table.name, ".", suffix)));
        rows[suffix] = vocabulary.LocalRows(whole_entry);
      } else {
        rows[suffix] = t;
      }
    }
    PP_RETURN_IF_ERROR(
        SetOptimizerStateTensors(optimizer, table.shard, table.name, rows, report.dir));
  }
  return report;
}

}  // namespace

absl::StatusOr<std::string> SaveTrainingCheckpoint(const TrainingCheckpointOptions& options,
                                                   const ParallelGrid& grid,
                                                   const PipelineModel& model, Trainer& trainer) {
  std::optional<DistributedOptimizer::WholeState> whole;
  // The distributed optimizer's state: each data-parallel rank writes its own
  // part (the masters are gathered for the model's files). A
  // vocabulary-parallel run gathers it whole (its tables' rows are cut by
  // pipe rank, their state with them).
  std::optional<DistributedOptimizer::OwnedState> owned;
  if (DistributedOptimizer* dist = trainer.distributed_optimizer(); dist != nullptr) {
    if (trainer.vocabulary() != nullptr) {
      PP_ASSIGN_OR_RETURN(whole, dist->GatherWholeState());
    } else {
      PP_ASSIGN_OR_RETURN(whole, dist->GatherWholeValues());
      PP_ASSIGN_OR_RETURN(owned, dist->LocalOwnedState());
    }
  }
  std::optional<VocabularyView> vocabulary;
  if (trainer.vocabulary() != nullptr) {
    PP_ASSIGN_OR_RETURN(vocabulary,
                        GatherVocabularyView(grid, model, trainer, whole ? &*whole : nullptr));
  }
  ModelState state = vocabulary ? std::move(vocabulary->state)
                                : MasterStateOf(model, trainer, whole ? &*whole : nullptr);
  SaveRequest request;
  request.root = options.root;
  request.step = trainer.step();
  request.keep_last = options.keep_last;
  request.model = &state;
  request.optimizer = vocabulary ? vocabulary->optimizer.get()
                      : owned    ? nullptr
                      : whole    ? whole->optimizer.get()
                                 : &trainer.optimizer();
  if (owned) {
    request.slices_optimizer = owned->optimizer.get();
    for (const auto& [name, param] : ModelStateOf(model).tensors) {
      auto index = whole->index.find(param.unsafeGetTensorImpl());
      if (index == whole->index.end()) continue;
      const DistributedOptimizer::OwnedPart& part = owned->parts[index->second];
      if (part.value.defined()) request.optimizer_slices[name] = {part.offset, part.value};
    }
  }
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
  std::optional<DistributedOptimizer::WholeState> whole;
  if (trainer.distributed_optimizer() != nullptr) {
    whole = trainer.distributed_optimizer()->NewWholeState();
  }
  LoadReport report;
  if (trainer.vocabulary() != nullptr) {
    PP_ASSIGN_OR_RETURN(report, LoadVocabularyCheckpoint(path, grid, model, trainer, options,
                                                         whole ? &*whole : nullptr));
  } else {
    ModelState state = MasterStateOf(model, trainer, whole ? &*whole : nullptr);
    PP_ASSIGN_OR_RETURN(
        report, LoadCheckpoint(path, state, whole ? whole->optimizer.get() : &trainer.optimizer(),
                               CheckpointRankOf(grid), options));
  }
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
