// Test support for the runtime's equivalence proof: a toy model with a tied
// first/last layer (embedding -> MLP blocks -> projection through the
// embedding), a deterministic data source, a sequential reference trainer on
// ToSequential()/BuildSequential, and a driver that trains the same model as a
// pipeline on ranks-as-threads (real ProcessGroupGloo over a FileStore).
#ifndef PIPELINE_RUNTIME_EQUIVALENCE_TESTING_H_
#define PIPELINE_RUNTIME_EQUIVALENCE_TESTING_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/layers/vocab_split.h"
#include "pipeline/runtime/mixed_precision.h"
#include "pipeline/runtime/stage_executor.h"
#include "pipeline/runtime/trainer.h"
#include "topology/device.h"
#include "topology/parallel_grid.h"

namespace pp {
namespace testing_runtime {

constexpr int64_t kVocab = 13;
constexpr int64_t kHidden = 8;
constexpr int64_t kTokens = 5;  // per micro-batch
constexpr uint64_t kSeed = 4242;

// Tied embedding, `blocks` Linear+tanh blocks, tied output projection:
// blocks + 2 layers.
std::vector<LayerSpec> ToySpecs(int blocks);

// Cross entropy of the logits against batch "labels".
torch::Tensor ToyLoss(const Activations& outputs, const MicroBatch& batch);

// The toy model split for tensor parallelism (pipeline/tensor_parallel/): a
// vocabulary-parallel embedding (kVocab = 13 rows padded to a multiple of
// tp), `blocks` blocks of column-parallel Linear(kHidden, 2 kHidden), tanh,
// row-parallel Linear(2 kHidden, kHidden) (its bias whole on every rank) and
// a residual, and the head through the tied embedding's rows
// (VocabParallelLogits). Built dense (tp = 1) it is the same model, so
// ToSequential() is the reference.
std::vector<LayerSpec> ToyParallelSpecs(int blocks);

// VocabParallelCrossEntropy of ToyParallelSpecs' logits on `group`.
LossFn ToyParallelLoss(const ModelParallelGroup& group);

// Token ids and labels drawn from a generator seeded by (step, index).
class ToySource : public MicroBatchSource {
 public:
  absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) override;
};

// Variable shapes with per-token loss (micro_batch_source.h): micro-batch
// (step, index) is [rows, length] with rows in [1, 3] and length in [1, 9],
// tokens, labels and a loss mask (about a quarter untrained) drawn from
// (seed, step, index); global_loss_tokens sums the masks of the step's
// `global_microbatches` (dp * m) micro-batches.
class VarlenToySource : public MicroBatchSource {
 public:
  VarlenToySource(uint64_t seed, int64_t global_microbatches);
  absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) override;

 private:
  MicroBatchData Draw(int64_t step, int64_t index) const;
  uint64_t seed_;
  int64_t global_microbatches_;
};

// Activation checkpointing of every "Block" layer (the toy models' blocks;
// pipeline/autograd), for RunConfig::layer_runner.
absl::StatusOr<LayerRunner> CheckpointEveryBlock();

// bf16 pipeline against the bf16 reference where the two do not run the same
// operations in the same order (pp > 1, dp > 1 or two chunks): relative
// tolerance on losses and grad norms (and on weights), absolute on the fp32
// master weights. equivalence_suite.h says where they come from.
constexpr double kBf16Rtol = 1e-4;
constexpr double kBf16Atol = 1e-3;

struct RunConfig {
  std::string schedule = "1f1b";
  int pp = 1;
  int dp = 1;
  // Tensor-parallel ranks per stage (the grid's model axis,
  // PipeModelDataParallelTopology: tp peers are neighbouring ranks). The
  // specs' factories get each rank's ModelParallelGroup; > 1 needs a model
  // that shards (ToyParallelSpecs, GPT) and a parallel_loss.
  int tp = 1;
  // Megatron's sequence parallelism on the model group (tp > 1; the model's
  // layers must support it, as GPT's do).
  bool sequence_parallel = false;
  // Testing: the model group without SequenceParallelGrads, so the replicated
  // parameters' gradients are summed in every backward (as before the Trainer
  // summed them once per step; sequence_parallel_grads.h).
  bool sequence_parallel_sum_per_backward = false;
  // TrainerOptions::p2p_scatter_gather (tp > 1 without sequence parallelism).
  bool p2p_scatter_gather = true;
  int chunks = 1;
  int microbatches = 4;  // per replica
  int blocks = 6;
  int steps = 3;
  OptimizerConfig optimizer;
  LrScheduleConfig lr_schedule;
  double max_grad_norm = 0.0;
  bool reduce_tied_grads = true;
  bool defer_receives = true;
  // TrainerOptions::executor.p2p.static_shapes and .post_receives_ahead.
  bool p2p_static_shapes = false;
  bool post_receives_ahead = false;
  // Runs each stage's layers (TrainerOptions::layer_runner); unset = plain
  // forward. The suite (equivalence_suite.h) passes activation
  // checkpointing's (pipeline/autograd: MakeCheckpointingRunner) here.
  LayerRunner layer_runner;
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  // The model under test (models/ adds GPT and BERT); each unset part falls
  // back to the toy model: ToySpecs(blocks), ToyLoss, ToySource.
  std::function<std::vector<LayerSpec>()> specs;
  LossFn loss;
  // The loss of a model whose logits are vocabulary-parallel, made per rank
  // with its group (dense for the reference); replaces `loss` when set.
  std::function<LossFn(const ModelParallelGroup&)> parallel_loss;
  std::function<std::unique_ptr<MicroBatchSource>()> source;  // one per rank
  // Without `source`: non-zero trains on VarlenToySource(varlen_seed, dp * m)
  // (variable shapes, per-token loss) instead of ToySource.
  uint64_t varlen_seed = 0;
  // Testing only: a planted bug of the per-token loss (stage_executor.h).
  LossNormalizationFault loss_normalization_fault = LossNormalizationFault::kNone;
  std::string partition_method = "uniform";
  // kBf16: the pipeline with TrainerOptions::precision bf16, the sequential
  // reference with the same recipe (mixed_precision.h: bf16 module, fp32
  // masters, each micro-batch's gradients added into fp32 after its
  // backward, fp32 loss). Parameters are compared as the fp32 masters.
  Precision precision = Precision::kFp32;
  // TrainerOptions::distributed_optimizer (ZeRO-1 over the data group), its
  // bucket size and a planted bug (testing).
  bool distributed_optimizer = false;
  int64_t bucket_numel = kDefaultBucketNumel;
  DistributedOptimizerOptions::PlantedFault distributed_optimizer_fault =
      DistributedOptimizerOptions::PlantedFault::kNone;
  // Vocabulary parallelism (TrainerOptions::vocabulary): the pipeline trains
  // the split's body with its tables split over the pipe group (pipe x
  // model when tp > 1: VocabularyGroupOf), the reference trains `specs`
  // (which must be the split's dense model). Parameters are compared under
  // the dense names, the tables merged from every vocabulary rank (their
  // padding rows must still be zero).
  std::function<VocabularySplit()> vocabulary;
  // TrainerOptions::vocabulary_barriers: the form of the passes the Trainer
  // places into `schedule` when it has none (0: two barriers).
  int vocabulary_barriers = 0;
  // TrainerOptions::vocabulary_async_collectives.
  bool vocabulary_async_collectives = false;
  // Where the pipeline's ranks compute: kCuda puts rank r on cuda:r (pp * dp
  // GPUs, NCCL); the sequential reference always runs on the CPU.
  DeviceKind device = DeviceKind::kCpu;
  // kCuda with ranks_per_device > 1: ranks share GPUs (rank r on
  // cuda:<r / ranks_per_device>, groups staged through host buffers and Gloo:
  // topology/host_staged_backend.h).
  int ranks_per_device = 1;
};

struct RunResult {
  std::vector<double> losses;  // per step
  std::vector<double> grad_norms;
  std::map<std::string, torch::Tensor> params;  // global name -> final value
  // Over all ranks: bytes of activation and gradient payloads sent.
  int64_t payload_bytes_sent = 0;
  // Over all ranks: payload tensors and control words received into
  // receives posted ahead (P2PStats).
  int64_t received_posted_ahead = 0;
  // Over all ranks: p2p receive buffers allocated and reused from the pool,
  // and the most one rank allocated.
  int64_t buffers_allocated = 0;
  int64_t buffers_reused = 0;
  int64_t max_buffers_allocated_per_rank = 0;
  // Per global rank (sequence parallelism): the flat all-reduces that summed
  // the replicated parameters' gradients over the model group
  // (SequenceParallelGrads::reductions: one per step); empty without it.
  std::vector<int64_t> sequence_parallel_reductions;
};

// ToSequential() trained on the same global batches (dp * microbatches
// micro-batches per step, loss mean over them, same clipping and optimizer).
// Gradients are summed in the pipeline's order: per data-parallel replica
// (loss / microbatches each), then the replicas' sums in rank order, divided
// by dp, so that with dp <= 2 the data-parallel sum rounds as the pipeline's.
absl::StatusOr<RunResult> TrainSequential(const RunConfig& config);

// The pipeline on pp * tp * dp thread ranks; parameters gathered from all
// ranks of data-parallel replica 0 (every replica is checked to hold equal
// values), each sharded one merged from its tp shards and cut to the dense
// shape (the vocabulary's padding rows must still be zero), each replicated
// one checked equal on every tp rank.
absl::StatusOr<RunResult> TrainPipeline(const RunConfig& config);

// "" when equal within rtol (plus atol for values near zero), else a
// description of the first differences.
std::string CompareResults(const RunResult& want, const RunResult& got, double rtol,
                           double atol = 1e-6);

}  // namespace testing_runtime
}  // namespace pp

#endif  // PIPELINE_RUNTIME_EQUIVALENCE_TESTING_H_
