#include "pipeline/runtime/equivalence_testing.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "pipeline/autograd/activation_checkpointing.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/runtime/grad_sync.h"
#include "pipeline/runtime/mixed_precision.h"
#include "pipeline/runtime/model_parallel_group.h"
#include "pipeline/schedule/schedules/registry.h"
#include "pipeline/tensor_parallel/linear.h"
#include "pipeline/tensor_parallel/sharded_module.h"
#include "pipeline/tensor_parallel/vocab_parallel.h"
#include "topology/parallel_grid.h"
#include "topology/process_topology.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace testing_runtime {
namespace {

class BlockImpl : public LayerImpl {
 public:
  BlockImpl() : LayerImpl("Block") {
    linear_ = register_module("linear", torch::nn::Linear(kHidden, kHidden));
  }
  Activations Forward(const Activations& in, const MicroBatch&) override {
    return {torch::tanh(linear_(in[0])) + in[0]};
  }

 private:
  torch::nn::Linear linear_{nullptr};
};

Layer MakeEmbedding(const LayerContext&) {
  return MakeModuleLayer(torch::nn::Embedding(kVocab, kHidden));
}

}  // namespace

std::vector<LayerSpec> ToySpecs(int blocks) {
  std::vector<LayerSpec> specs;
  specs.push_back(TiedLayerSpec("embed", MakeEmbedding));
  for (int i = 0; i < blocks; ++i)
    specs.push_back(
        LayerSpec("Block", [](const LayerContext&) { return std::make_shared<BlockImpl>(); }));
  specs.push_back(
      TiedLayerSpec("embed", MakeEmbedding, TiedProjection("weight")).WithName("LmHead"));
  return specs;
}

torch::Tensor ToyLoss(const Activations& outputs, const MicroBatch& batch) {
  const torch::Tensor& labels = batch.Get("labels");
  if (!batch.Has(kLossMaskKey)) return torch::nn::functional::cross_entropy(outputs[0], labels);
  const torch::Tensor token_losses = torch::nn::functional::cross_entropy(
      outputs[0].reshape({-1, outputs[0].size(-1)}), labels.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  return ReduceTokenLosses(token_losses.view(labels.sizes()), batch);
}

namespace {

// The vocabulary-parallel embedding, whose rows also make the head's logits.
class ParallelEmbeddingImpl : public LayerImpl {
 public:
  explicit ParallelEmbeddingImpl(const LayerContext& context) : LayerImpl("Embedding") {
    // Drawn whole, as torch::nn::Embedding draws its table (N(0, 1)); each
    // rank keeps its rows.
    embedding_ =
        register_module("embedding", tensor_parallel::VocabParallelEmbedding(
                                         torch::randn({kVocab, kHidden}), context.model_parallel,
                                         /*sequence_dim=*/0));
  }
  Activations Forward(const Activations& in, const MicroBatch&) override {
    return {embedding_(in[0])};
  }
  torch::Tensor Logits(const torch::Tensor& x) {
    return tensor_parallel::VocabParallelLogits(x, embedding_->weight, embedding_->group(),
                                                /*sequence_dim=*/0);
  }

 private:
  tensor_parallel::VocabParallelEmbedding embedding_{nullptr};
};

class ParallelBlockImpl : public LayerImpl {
 public:
  explicit ParallelBlockImpl(const LayerContext& context) : LayerImpl("Block") {
    up_ = register_module("up", tensor_parallel::ColumnParallelLinear(
                                    tensor_parallel::ParallelLinearOptions(kHidden, 2 * kHidden),
                                    context.model_parallel));
    down_ = register_module(
        "down",
        tensor_parallel::RowParallelLinear(
            tensor_parallel::ParallelLinearOptions(2 * kHidden, kHidden).InputIsParallel(true),
            context.model_parallel));
  }
  Activations Forward(const Activations& in, const MicroBatch&) override {
    return {down_(torch::tanh(up_(in[0]))) + in[0]};
  }

 private:
  tensor_parallel::ColumnParallelLinear up_{nullptr};
  tensor_parallel::RowParallelLinear down_{nullptr};
};

Layer MakeParallelEmbedding(const LayerContext& context) {
  return std::make_shared<ParallelEmbeddingImpl>(context);
}

}  // namespace

std::vector<LayerSpec> ToyParallelSpecs(int blocks) {
  std::vector<LayerSpec> specs;
  specs.push_back(TiedLayerSpec("embed", MakeParallelEmbedding));
  for (int i = 0; i < blocks; ++i) {
    specs.push_back(LayerSpec("Block", [](const LayerContext& context) {
      return std::make_shared<ParallelBlockImpl>(context);
    }));
  }
  specs.push_back(TiedLayerSpec("embed", MakeParallelEmbedding,
                                [](LayerImpl& shared, const Activations& in, const MicroBatch&) {
                                  return Activations{
                                      dynamic_cast<ParallelEmbeddingImpl&>(shared).Logits(in[0])};
                                })
                      .WithName("LmHead"));
  return specs;
}

LossFn ToyParallelLoss(const ModelParallelGroup& group) {
  return [group](const Activations& outputs, const MicroBatch& batch) {
    return ReduceTokenLosses(
        tensor_parallel::VocabParallelCrossEntropy(outputs[0], batch.Get("labels"), kVocab, group),
        batch);
  };
}

absl::StatusOr<MicroBatchData> ToySource::Get(int64_t step, int64_t index) {
  torch::Generator gen =
      at::detail::createCPUGenerator(static_cast<uint64_t>(1000003 * step + 7919 * index + 17));
  MicroBatchData d;
  d.inputs = {torch::randint(kVocab, {kTokens}, gen, torch::kLong)};
  d.batch.id = step * 1000 + index;
  d.batch.tensors["labels"] = torch::randint(kVocab, {kTokens}, gen, torch::kLong);
  return d;
}

VarlenToySource::VarlenToySource(uint64_t seed, int64_t global_microbatches)
    : seed_(seed), global_microbatches_(global_microbatches) {}

MicroBatchData VarlenToySource::Draw(int64_t step, int64_t index) const {
  torch::Generator gen = at::detail::createCPUGenerator(
      seed_ * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(1000003 * step + 7919 * index + 17));
  const int64_t rows = 1 + torch::randint(3, {1}, gen, torch::kLong).item<int64_t>();
  const int64_t length = 1 + torch::randint(9, {1}, gen, torch::kLong).item<int64_t>();
  MicroBatchData d;
  d.inputs = {torch::randint(kVocab, {rows, length}, gen, torch::kLong)};
  d.batch.id = step * 1000 + index;
  d.batch.tensors["labels"] = torch::randint(kVocab, {rows, length}, gen, torch::kLong);
  // About a quarter of the labels untrained; the first always trained, so
  // every micro-batch has a token (its own mean stays defined).
  torch::Tensor mask = (torch::rand({rows, length}, gen) >= 0.25).to(torch::kFloat);
  mask.view({-1})[0] = 1.0;
  d.batch.tensors[kLossMaskKey] = mask;
  return d;
}

absl::StatusOr<MicroBatchData> VarlenToySource::Get(int64_t step, int64_t index) {
  if (index < 0 || index >= global_microbatches_) {
    return absl::OutOfRangeError(
        absl::StrCat("micro-batch index ", index, " outside [0, ", global_microbatches_, ")"));
  }
  MicroBatchData d = Draw(step, index);
  for (int64_t i = 0; i < global_microbatches_; ++i) {
    d.global_loss_tokens +=
        static_cast<int64_t>(Draw(step, i).batch.Get(kLossMaskKey).sum().item<double>());
  }
  return d;
}

absl::StatusOr<LayerRunner> CheckpointEveryBlock() {
  ActivationCheckpointPolicy policy;
  policy.interval = 1;
  policy.checkpointable_types = "Block";
  return MakeCheckpointingRunner(policy);
}

namespace {

// The order in which the pipeline sums a step's gradients, so that the
// reference rounds as it does (issue #42). Each data-parallel replica sums its
// own micro-batches (loss / m each, in micro-batch order), the all-reduce adds
// the replicas' sums and AverageGrads divides by dp (grad_sync.h). Summing all
// dp * m micro-batches into one buffer instead groups the additions
// differently, and AdamW, which scales every element's update to about lr
// whatever the gradient's size, turns a gradient element's relative round-off
// (large where the micro-batches' contributions cancel) into a weight
// difference of up to lr times it: 2.4e-6 on a LLaMA weight under OpenBLAS's
// Prescott kernel, past the suite's atol. With dp = 2 the all-reduce is one
// addition per element, a + b, the same bits whichever rank adds, so the
// reference's r0 + r1 equals it exactly.

// Moves the gradients of `params` (one replica's sum) into `sums`, adding
// them to what is there (the earlier replicas, in rank order), and zeroes
// them for the next replica. An undefined gradient counts as zeros, as the
// all-reduce's flat buffer holds it.
void TakeReplicaGrads(const std::vector<torch::Tensor>& params, std::vector<torch::Tensor>& sums) {
  torch::NoGradGuard no_grad;
  const bool first = sums.empty();
  for (size_t k = 0; k < params.size(); ++k) {
    torch::Tensor& grad = const_cast<torch::Tensor&>(params[k]).mutable_grad();
    torch::Tensor g = grad.defined() ? grad.detach().clone() : torch::zeros_like(params[k]);
    if (first) {
      sums.push_back(g);
    } else {
      sums[k].add_(g);
    }
    if (grad.defined()) grad.zero_();
  }
}

void SetAveragedGrads(const std::vector<torch::Tensor>& params, std::vector<torch::Tensor>& sums,
                      int dp) {
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < params.size(); ++k) {
    const_cast<torch::Tensor&>(params[k]).mutable_grad() = sums[k].div_(static_cast<double>(dp));
  }
}

std::vector<LayerSpec> SpecsOf(const RunConfig& config) {
  return config.specs ? config.specs() : ToySpecs(config.blocks);
}
// The loss on `group` (dense: the reference's).
LossFn LossOf(const RunConfig& config, const ModelParallelGroup& group = {}) {
  if (config.parallel_loss) return config.parallel_loss(group);
  return config.loss ? config.loss : LossFn(ToyLoss);
}
std::unique_ptr<MicroBatchSource> SourceOf(const RunConfig& config) {
  if (config.source) return config.source();
  if (config.varlen_seed != 0) {
    return std::make_unique<VarlenToySource>(config.varlen_seed, config.dp * config.microbatches);
  }
  return std::make_unique<ToySource>();
}

}  // namespace

absl::StatusOr<RunResult> TrainSequential(const RunConfig& config) {
  RunResult result;
  absl::Status s = TorchCall("sequential reference", [&] {
    absl::StatusOr<StageModule> built = BuildSequential(SpecsOf(config), kSeed);
    if (!built.ok()) throw std::runtime_error(built.status().ToString());
    StageModule model = *built;
    std::vector<torch::Tensor> model_params = model->parameters();
    std::optional<MasterWeights> master;
    if (config.precision == Precision::kBf16) master.emplace(model_params);
    // The optimizer, the norm and clipping work on the fp32 masters in bf16.
    const std::vector<torch::Tensor> params = master ? master->masters() : model_params;
    const torch::ScalarType dtype = ComputeDtype(config.precision);
    auto optimizer = MakeOptimizer(config.optimizer, params);
    std::unique_ptr<MicroBatchSource> source = SourceOf(config);
    const LossFn loss_fn = LossOf(config);
    const int total = config.dp * config.microbatches;
    for (int step = 0; step < config.steps; ++step) {
      SetLearningRate(*optimizer, LearningRateAt(config.lr_schedule, config.optimizer.lr, step));
      optimizer->zero_grad();
      double loss_sum = 0;
      int64_t global_tokens = 0;
      std::vector<torch::Tensor> replica_sums;
      for (int replica = 0; replica < config.dp; ++replica) {
        for (int j = 0; j < config.microbatches; ++j) {
          MicroBatchData d = *source->Get(step, replica * config.microbatches + j);
          torch::Tensor loss = loss_fn(
              CastFloating(model->Forward(CastFloating(d.inputs, dtype), d.batch), torch::kFloat),
              d.batch);
          loss_sum += loss.item<double>();
          // Per-token loss (micro_batch_source.h): the sum over the global
          // batch's trained tokens over their count, scaled by dp for the
          // replica average below, as the pipeline scales it.
          global_tokens = d.global_loss_tokens;
          (d.global_loss_tokens > 0
               ? loss * (static_cast<double>(config.dp) / static_cast<double>(global_tokens))
               : loss / static_cast<double>(config.microbatches))
              .backward();
          if (master) master->AccumulateGrads();
        }
        if (config.dp > 1) TakeReplicaGrads(params, replica_sums);
      }
      if (config.dp > 1) SetAveragedGrads(params, replica_sums, config.dp);
      double sumsq = 0;
      for (const torch::Tensor& p : params) {
        if (p.grad().defined()) sumsq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
      }
      const double norm = std::sqrt(sumsq);
      if (config.max_grad_norm > 0) ClipGradsToNorm(params, norm, config.max_grad_norm);
      optimizer->step();
      if (master) master->CopyToModel();
      result.losses.push_back(loss_sum /
                              static_cast<double>(global_tokens > 0 ? global_tokens : total));
      result.grad_norms.push_back(norm);
    }
    for (const auto& item : model->named_parameters()) {
      result.params[item.key()] =
          (master ? master->MasterOf(item.value()) : item.value()).detach().clone();
    }
  });
  PP_RETURN_IF_ERROR(s);
  return result;
}

namespace {

// TrainPipeline's steps: the model's and the trainer's options from the
// config, the run on thread ranks, then the checks that every rank and
// replica agrees.

PipelineModelOptions ModelOptionsOf(const RunConfig& config, const ModelParallelGroup& group) {
  PipelineModelOptions mo;
  mo.layer_environment.model_parallel = group;
  mo.num_stages = config.pp;
  mo.chunks = config.chunks;
  mo.partition_method = config.partition_method;
  mo.base_seed = kSeed;
  // The schedule's placement (V for zbv); its errors are the Trainer's to report.
  if (absl::StatusOr<Schedule> schedule =
          MakeSchedule(config.schedule, {config.pp, config.microbatches, config.chunks, 0});
      schedule.ok()) {
    mo.stage_to_rank = schedule->stage_to_rank;
  }
  return mo;
}

TrainerOptions TrainerOptionsOf(const RunConfig& config, const torch::Device& device) {
  TrainerOptions to;
  to.executor.p2p.device = device;
  to.schedule = config.schedule;
  to.num_microbatches = config.microbatches;
  to.optimizer = config.optimizer;
  to.lr_schedule = config.lr_schedule;
  to.max_grad_norm = config.max_grad_norm;
  to.executor.p2p.timeout = config.timeout;
  to.reduce_tied_grads = config.reduce_tied_grads;
  to.executor.defer_receives = config.defer_receives;
  to.executor.p2p.static_shapes = config.p2p_static_shapes;
  to.p2p_scatter_gather = config.p2p_scatter_gather;
  to.executor.post_receives_ahead = config.post_receives_ahead;
  to.layer_runner = config.layer_runner;
  to.precision = config.precision;
  to.distributed_optimizer = config.distributed_optimizer;
  to.bucket_numel = config.bucket_numel;
  to.distributed_optimizer_fault = config.distributed_optimizer_fault;
  to.executor.loss_normalization_fault = config.loss_normalization_fault;
  to.vocabulary_barriers = config.vocabulary_barriers;
  to.vocabulary_async_collectives = config.vocabulary_async_collectives;
  return to;
}

// Every rank saw the same losses and gradient norms; every data-parallel
// replica ends with the same parameters.
absl::Status CheckRanksAgree(
    const std::vector<std::vector<double>>& rank_losses,
    const std::vector<std::vector<double>>& rank_norms,
    const std::vector<std::map<std::string, torch::Tensor>>& replica_params) {
  for (size_t r = 1; r < rank_losses.size(); ++r) {
    if (rank_losses[r] != rank_losses[0] || rank_norms[r] != rank_norms[0]) {
      return absl::InternalError(
          absl::StrCat("rank ", r, " reports a different loss or grad norm than rank 0"));
    }
  }
  for (size_t d = 1; d < replica_params.size(); ++d) {
    for (const auto& [name, value] : replica_params[0]) {
      auto it = replica_params[d].find(name);
      const torch::Tensor other = it == replica_params[d].end() ? torch::Tensor() : it->second;
      if (!torch::equal(value, other)) {
        return absl::InternalError(
            absl::StrCat("data-parallel replica ", d, " differs in ", name, " (max abs diff ",
                         other.defined() ? (other - value).abs().max().item<double>() : -1.0, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// A parameter's value on each tensor-parallel rank of replica 0 -> the dense
// parameter: shards merged and cut to the dense shape (the padding rows must
// be zero, as they start), whole ones checked equal on every rank.
absl::StatusOr<torch::Tensor> MergeTensorParallel(
    const std::string& name, const std::vector<torch::Tensor>& values,
    const std::map<std::string, tensor_parallel::ShardSpec>& shard_dims,
    const torch::IntArrayRef dense_shape) {
  auto it = shard_dims.find(name);
  if (it == shard_dims.end()) {
    for (size_t m = 1; m < values.size(); ++m) {
      if (!torch::equal(values[m], values[0])) {
        return absl::InternalError(absl::StrCat(
            name, " is whole on every tensor-parallel rank but differs on tp rank ", m,
            " (max abs diff ", (values[m] - values[0]).abs().max().item<double>(), ")"));
      }
    }
    return values[0];
  }
  torch::Tensor merged = tensor_parallel::MergeShards(values, it->second);
  const int64_t dim = it->second.dim < 0 ? it->second.dim + merged.dim() : it->second.dim;
  const int64_t dense = dense_shape[dim];
  if (merged.size(dim) > dense) {
    torch::Tensor padding = merged.narrow(dim, dense, merged.size(dim) - dense);
    if (!torch::equal(padding, torch::zeros_like(padding))) {
      return absl::InternalError(absl::StrCat(name, "'s padding past the dense size ", dense,
                                              " along dimension ", dim, " trained"));
    }
    merged = merged.narrow(dim, 0, dense).contiguous();
  }
  return merged;
}

}  // namespace

absl::StatusOr<RunResult> TrainPipeline(const RunConfig& config) {
  const int world = config.pp * config.tp * config.dp;
  std::mutex mu;
  RunResult result;
  // [data-parallel id][tensor-parallel id]: global name -> value.
  std::vector<std::vector<std::map<std::string, torch::Tensor>>> rank_params(
      config.dp, std::vector<std::map<std::string, torch::Tensor>>(config.tp));
  std::map<std::string, tensor_parallel::ShardSpec> shard_dims;
  std::vector<std::vector<double>> rank_losses(world);
  std::vector<std::vector<double>> rank_norms(world);
  std::optional<VocabularySplit> split;
  if (config.vocabulary) split = config.vocabulary();
  // Vocabulary parallelism: [data-parallel id][vocabulary rank: stage * tp +
  // tensor rank]: the rows of each table.
  std::vector<std::vector<std::map<std::string, torch::Tensor>>> vocab_shards(
      config.dp, std::vector<std::map<std::string, torch::Tensor>>(config.pp * config.tp));
  std::map<std::string, torch::Tensor> vocab_tables;  // merged, dense names
  int64_t vocab_size = 0;
  absl::Status status = RunOnThreadRanks(
      world, config.device, config.ranks_per_device, config.timeout,
      [&](World& world_of_rank) -> absl::Status {
        PP_ASSIGN_OR_RETURN(ProcessTopology topology,
                            config.tp > 1
                                ? PipeModelDataParallelTopology(config.pp, config.tp, config.dp)
                                : PipeDataParallelTopology(config.pp, config.dp));
        PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world_of_rank, topology));
        ModelParallelGroup group =
            ModelParallelGroupOf(grid, config.timeout, config.sequence_parallel);
        if (config.sequence_parallel_sum_per_backward) group.sequence_parallel_grads = nullptr;
        PP_ASSIGN_OR_RETURN(auto model,
                            PipelineModel::Create(split ? split->body : SpecsOf(config),
                                                  ModelOptionsOf(config, group), grid.stage_id()));
        model->to(world_of_rank.device);
        std::unique_ptr<MicroBatchSource> source = SourceOf(config);
        TrainerOptions options = TrainerOptionsOf(config, world_of_rank.device);
        std::unique_ptr<VocabularyLayers> vocabulary;
        if (split) {
          PP_ASSIGN_OR_RETURN(
              vocabulary,
              MakeVocabularyLayers(
                  *split, kSeed, VocabularyGroupOf(grid, config.timeout, config.sequence_parallel),
                  /*ignore_index=*/-100, /*tensor_size=*/config.tp));
          vocabulary->to(world_of_rank.device);
          options.vocabulary = vocabulary.get();
        }
        PP_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(&grid, model.get(), LossOf(config, group),
                                                          source.get(), options));
        for (int step = 0; step < config.steps; ++step) {
          PP_ASSIGN_OR_RETURN(StepResult r, trainer->Step());
          rank_losses[grid.global_rank()].push_back(r.loss);
          rank_norms[grid.global_rank()].push_back(r.grad_norm);
        }
        // The distributed optimizer's masters are slices: gathered
        // whole (collective: before taking the lock).
        std::optional<DistributedOptimizer::WholeState> whole;
        if (trainer->distributed_optimizer() != nullptr) {
          PP_ASSIGN_OR_RETURN(whole, trainer->distributed_optimizer()->GatherWholeState());
        }
        std::lock_guard<std::mutex> lock(mu);
        const P2PStats p2p = trainer->p2p_stats();
        result.received_posted_ahead += p2p.payloads_posted_ahead + p2p.controls_posted_ahead;
        result.payload_bytes_sent += p2p.payload_bytes_sent;
        result.buffers_allocated += p2p.buffers_allocated;
        result.buffers_reused += p2p.buffers_reused;
        result.max_buffers_allocated_per_rank =
            std::max(result.max_buffers_allocated_per_rank, p2p.buffers_allocated);
        shard_dims.merge(ModelShardDims(*model));
        if (group.sequence_parallel_grads) {
          result.sequence_parallel_reductions.resize(world);
          result.sequence_parallel_reductions[grid.global_rank()] =
              group.sequence_parallel_grads->reductions();
        }
        if (vocabulary) {
          vocab_size = vocabulary->vocab_size();
          auto copy = [&](const torch::Tensor& t) {
            return trainer->MasterOf(t).detach().to(torch::kCPU, false, /*copy=*/true);
          };
          auto& mine = vocab_shards[grid.data_parallel_id()][vocabulary->group().rank];
          mine[split->embedding_name] = copy(vocabulary->embedding());
          if (!split->tied()) mine[split->head_name] = copy(vocabulary->head());
        }
        for (const auto& item : model->named_parameters()) {
          const std::string name = split ? split->DenseName(item.key()) : item.key();
          auto& slot = rank_params[grid.data_parallel_id()][grid.model_parallel_id()][name];
          // bf16: the fp32 master, what the optimizer updates.
          torch::Tensor value =
              (whole ? whole->ValueOf(item.value()) : trainer->MasterOf(item.value()))
                  .detach()
                  .to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
          if (slot.defined() && !torch::equal(slot, value)) {
            return absl::InternalError(
                absl::StrCat("tied copies of ", name, " differ between stages"));
          }
          slot = value;
        }
        return absl::OkStatus();
      });
  PP_RETURN_IF_ERROR(status);
  // Each data-parallel replica against replica 0, shard by shard.
  std::vector<std::map<std::string, torch::Tensor>> replica_params;
  for (int m = 0; m < config.tp; ++m) {
    replica_params.clear();
    for (int d = 0; d < config.dp; ++d) replica_params.push_back(rank_params[d][m]);
    PP_RETURN_IF_ERROR(CheckRanksAgree(rank_losses, rank_norms, replica_params));
  }
  result.losses = rank_losses[0];
  result.grad_norms = rank_norms[0];
  if (split) {
    // Every replica holds the same rows; replica 0's become the dense tables.
    const int ranks = config.pp * config.tp;
    for (int d = 1; d < config.dp; ++d) {
      for (int s = 0; s < ranks; ++s) {
        for (const auto& [name, value] : vocab_shards[0][s]) {
          if (!torch::equal(vocab_shards[d][s].at(name), value)) {
            return absl::InternalError(absl::StrCat("data-parallel replica ", d, " differs in ",
                                                    name, "'s rows on vocabulary rank ", s));
          }
        }
      }
    }
    for (const auto& [name, unused] : vocab_shards[0][0]) {
      std::vector<torch::Tensor> shards;
      for (int s = 0; s < ranks; ++s) shards.push_back(vocab_shards[0][s].at(name));
      PP_ASSIGN_OR_RETURN(vocab_tables[name], MergeVocabularyShards(shards, vocab_size));
    }
  }
  if (config.tp == 1) {
    result.params = rank_params[0][0];
    result.params.insert(vocab_tables.begin(), vocab_tables.end());
    return result;
  }
  std::map<std::string, std::vector<int64_t>> dense_shapes;
  PP_RETURN_IF_ERROR(TorchCall("dense shapes", [&] {
    absl::StatusOr<StageModule> dense = BuildSequential(SpecsOf(config), kSeed);
    if (!dense.ok()) throw std::runtime_error(dense.status().ToString());
    for (const auto& item : (*dense)->named_parameters()) {
      dense_shapes[item.key()] = item.value().sizes().vec();
    }
  }));
  for (const auto& [name, value] : rank_params[0][0]) {
    std::vector<torch::Tensor> values;
    for (int m = 0; m < config.tp; ++m) {
      auto it = rank_params[0][m].find(name);
      if (it == rank_params[0][m].end()) {
        return absl::InternalError(absl::StrCat(name, " is missing on tp rank ", m));
      }
      values.push_back(it->second);
    }
    auto shape = dense_shapes.find(name);
    if (shape == dense_shapes.end()) {
      return absl::InternalError(absl::StrCat(name, " is not a parameter of the dense model"));
    }
    PP_ASSIGN_OR_RETURN(result.params[name],
                        MergeTensorParallel(name, values, shard_dims, shape->second));
  }
  result.params.insert(vocab_tables.begin(), vocab_tables.end());
  return result;
}

std::string CompareResults(const RunResult& want, const RunResult& got, double rtol, double atol) {
  std::string out;
  auto close = [&](double a, double b) {
    return std::abs(a - b) <= rtol * std::max(std::abs(a), std::abs(b)) + 1e-7;
  };
  if (want.losses.size() != got.losses.size()) return "different number of steps";
  for (size_t i = 0; i < want.losses.size(); ++i) {
    if (!close(want.losses[i], got.losses[i])) {
      absl::StrAppend(&out, "step ", i, " loss ", got.losses[i], " != sequential ", want.losses[i],
                      "; ");
    }
    if (!close(want.grad_norms[i], got.grad_norms[i])) {
      absl::StrAppend(&out, "step ", i, " grad norm ", got.grad_norms[i], " != sequential ",
                      want.grad_norms[i], "; ");
    }
  }
  if (want.params.size() != got.params.size()) {
    absl::StrAppend(&out, got.params.size(), " parameters, sequential has ", want.params.size(),
                    "; ");
  }
  for (const auto& [name, value] : want.params) {
    auto it = got.params.find(name);
    if (it == got.params.end()) {
      absl::StrAppend(&out, "missing ", name, "; ");
      continue;
    }
    if (!torch::allclose(it->second, value, rtol, atol)) {
      const double diff = (it->second - value).abs().max().item<double>();
      absl::StrAppend(&out, name, " max abs diff ", diff, "; ");
    }
  }
  return out;
}

}  // namespace testing_runtime
}  // namespace pp
