// This rank's shards of the vocabulary layers of a vocabulary-parallel run
// (issue #40; pipeline/schedule/ir/vocab_passes.h places their passes): rows
// [range) of the input embedding and of the output projection, one tensor
// when they are tied. The StageExecutor calls one method per vocabulary pass
// and runs the collectives between them over the vocabulary group; the math
// is pipeline/tensor_parallel/vocab_passes.h.
//
// The vocabulary group is one data-parallel replica's ranks: the pipe group
// at tp = 1; under tensor parallelism pipe x model (VocabularyGroupOf), whose
// rank is stage * tensor_size + tensor rank, so each of the p * t ranks holds
// 1/(p t) of the rows, pipe-major. The statistics and sums then run over all
// p * t ranks in one collective each: the same formulas, exact, with no
// second stage over the tensor group. Under sequence parallelism the body's
// hidden states are split along the sequence over a stage's tensor ranks;
// the passes read and feed them whole, so the executor cuts this rank's
// slice (SequenceSlice) of the summed embedding and of the head input's
// gradient, and sums the slices, placed in zeros, of the last stage's output
// and of stage 0's input gradient (exact: one term per element is nonzero).
//
//   IN_F   Embed(ids)                  -> share (summed onto stage 0: its input)
//   OUT_S  OutputS(mb, hidden, labels) -> stats (all-gathered)
//          Combine(mb, gathered)       -> per-token loss, same on every rank
//   OUT_T  OutputT(mb, grad_scale)     -> share of d loss / d hidden (summed
//                                         onto the last stage: its output
//                                         gradient); the head rows' gradient
//   IN_B   EmbedBackward(ids, grad)    -> the embedding rows' gradient
//
// The one-barrier algorithm (Schedule::vocab_barriers 1): OUT_S also keeps
// the partial hidden-state gradient (OutputS with `partial`), OUT_REDUCE sums
// RescaledPartial's terms, and OUT_T is OutputWeightGrad (the head rows'
// gradient only), which may run after the last stage's backward.
//
// Gradients accumulate into the shards' .grad (as autograd would), so the
// optimizer, clipping and the data-parallel reduce treat the shards like any
// parameter. Not thread-safe; one per rank.
//
// Checkpoints (checkpoint/model/trainer_checkpoint.h) hold the tables whole,
// under the dense model's names (dense_layout()): GatherRows and LocalRows move
// a table-shaped tensor (the table, its master, an optimizer moment) between
// this rank's rows and the dense rows.
#ifndef PIPELINE_RUNTIME_VOCAB_LAYERS_H_
#define PIPELINE_RUNTIME_VOCAB_LAYERS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "pipeline/layers/layer_context.h"
#include "pipeline/layers/vocab_split.h"
#include "pipeline/tensor_parallel/vocab_passes.h"

namespace pp {

// Where the split's tensors live in the dense model (VocabularySplit's names):
// what a checkpoint of a vocabulary-parallel run is written as.
struct VocabularyDenseLayout {
  std::string embedding_name;  // e.g. "tied.embed.tok_embed.weight"
  std::string head_name;       // an untied head's; empty when tied
  // A body parameter's dense name (null: the same name).
  std::function<std::string(const std::string&)> dense_name;
  int64_t num_layers = -1;  // of the dense model

  bool known() const { return !embedding_name.empty() && num_layers > 0; }
  std::string DenseName(const std::string& body_name) const {
    return dense_name ? dense_name(body_name) : body_name;
  }
};

class VocabularyLayers {
 public:
  // `embedding` and `head`: the dense tables [vocab_size, D]; this rank keeps
  // its rows of each (LocalVocabRows over `group`, padded). `tied`: the head
  // is the embedding (one shard serves both; `head` is ignored).
  // `tensor_size`: the tensor-parallel ranks per stage in `group` (group
  // rank = stage * tensor_size + tensor rank).
  // REQUIRES: group.size is a multiple of tensor_size.
  VocabularyLayers(const torch::Tensor& embedding, const torch::Tensor& head, bool tied,
                   ModelParallelGroup group, int64_t ignore_index = -100, int64_t tensor_size = 1);

  torch::Tensor Embed(const torch::Tensor& ids) const;
  void EmbedBackward(const torch::Tensor& ids, const torch::Tensor& grad_output);
  // `partial`: the one-barrier algorithm's, also computes and keeps this
  // rank's partial hidden-state gradient (float32 [N, D]) for
  // RescaledPartial.
  torch::Tensor OutputS(int mb, const torch::Tensor& hidden, const torch::Tensor& labels,
                        bool partial = false);
  // `gathered`: every rank's stats [p, N, 3]. The per-token loss [N..].
  torch::Tensor Combine(int mb, const torch::Tensor& gathered);
  // `grad_scale` [N..]: d step loss / d token loss. Ends micro-batch mb.
  torch::Tensor OutputT(int mb, const torch::Tensor& grad_scale);
  // One barrier, after Combine: this rank's term of d step loss / d hidden
  // [N.., D] float32 (summed onto the last stage); frees the partial.
  // REQUIRES: OutputS(mb, .., partial = true).
  torch::Tensor RescaledPartial(int mb, const torch::Tensor& grad_scale);
  // One barrier's OUT_T, after Combine: the head rows' gradient only (into
  // its .grad). Ends micro-batch mb.
  void OutputWeightGrad(int mb, const torch::Tensor& grad_scale);
  // Ends micro-batch mb without OUT_T (evaluation: the loss is all it needs).
  void Drop(int mb) { pending_.erase(mb); }
  // Drops every micro-batch's state (a failed step).
  void Clear() { pending_.clear(); }
  // Micro-batches between OUT_S and their end (OUT_T or Drop).
  int pending() const { return static_cast<int>(pending_.size()); }

  // Moves the shards to `device` (a GPU run's, as PipelineModel::to moves a
  // stage), before a Trainer takes them. REQUIRES: no pending micro-batch
  // and no gradient yet.
  void to(const torch::Device& device);

  // The parameters: {embedding} when tied, else {embedding, head}.
  std::vector<torch::Tensor> parameters() const;
  const torch::Tensor& embedding() const { return embedding_; }
  const torch::Tensor& head() const { return tied_ ? embedding_ : head_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t ignore_index() const { return ignore_index_; }
  int64_t dim() const { return embedding_.size(1); }
  // The ranks the rows are split over (pipe, or pipe x model).
  const ModelParallelGroup& group() const { return group_; }
  int64_t tensor_size() const { return tensor_size_; }
  int64_t num_stages() const { return group_.size / tensor_size_; }
  // The group rank that holds stage `stage`'s tensor rank 0: where a
  // broadcast of a stage's tensor (the same on its tensor ranks) starts.
  int64_t RootOf(int64_t stage) const { return stage * tensor_size_; }
  int64_t tensor_rank() const { return group_.rank % tensor_size_; }
  // Megatron's sequence parallelism in the body (group().sequence_parallel
  // with tensor_size > 1): its hidden states are split along the sequence
  // (dimension kSequenceDim of [batch, time, D]) over a stage's tensor ranks.
  bool sequence_parallel() const { return group_.sequence_parallel && tensor_size_ > 1; }
  static constexpr int64_t kSequenceDim = 1;
  // This tensor rank's slice along kSequenceDim of `full` [batch, time, ..]
  // (a view). REQUIRES: time is a multiple of tensor_size (checked).
  torch::Tensor SequenceSlice(const torch::Tensor& full) const;
  tensor_parallel::VocabRange range() const { return range_; }

  // Set by MakeVocabularyLayers; unknown for layers built from tables alone.
  const VocabularyDenseLayout& dense_layout() const { return dense_layout_; }
  void set_dense_layout(VocabularyDenseLayout layout) { dense_layout_ = std::move(layout); }

  // The dense rows [vocab_size, ..] from every group rank's `rows` (this
  // rank's rows of a table-shaped tensor, padding included); the padding
  // must be zero. Collective over the group, in the same order on every
  // rank.
  absl::StatusOr<torch::Tensor> GatherRows(const torch::Tensor& rows,
                                           const std::string& what) const;
  // This rank's rows of dense `full` [vocab_size, ..], padded with zeros.
  torch::Tensor LocalRows(const torch::Tensor& full) const;

  // The head's input of the latest OUT_S (undefined before one): a sampler
  // reads the next token's logits from it after an evaluation pass.
  const torch::Tensor& last_hidden() const { return last_hidden_; }
  // The full logits [vocab_size] (fp32) of one token's head input [D] on
  // every group rank: each rank's rows, gathered. Collective over the group.
  absl::StatusOr<torch::Tensor> GatherLogits(const torch::Tensor& hidden) const;

 private:
  struct Pending {
    tensor_parallel::OutputSResult s;
    torch::Tensor hidden, labels;
    tensor_parallel::CombinedOutputStats combined;
    bool combined_set = false;
    torch::Tensor partial;  // one barrier: from OUT_S until RescaledPartial
  };
  // Micro-batch mb's state once combined; throws naming `pass` otherwise.
  Pending& Combined(int mb, const char* pass);
  static void Accumulate(torch::Tensor param, const torch::Tensor& grad);

  int64_t vocab_size_;
  bool tied_;
  ModelParallelGroup group_;
  int64_t ignore_index_;
  int64_t tensor_size_;
  tensor_parallel::VocabRange range_;
  torch::Tensor embedding_, head_;
  VocabularyDenseLayout dense_layout_;
  torch::Tensor last_hidden_;
  std::map<int, Pending> pending_;  // by micro-batch, from OUT_S to OUT_T
};

// This rank's shards of `split`'s tables as the dense model starts them: the
// dense layers holding them built as PipelineModel builds layer i (seed
// base_seed + i, dense), their rows over `group` kept (`tensor_size`: as
// VocabularyLayers takes it). InvalidArgument for a
// split without an embedding table, a layer index outside the dense model or
// tables of the wrong shape (named). The layers know the split's dense names
// (dense_layout()).
absl::StatusOr<std::unique_ptr<VocabularyLayers>> MakeVocabularyLayers(const VocabularySplit& split,
                                                                       uint64_t base_seed,
                                                                       ModelParallelGroup group,
                                                                       int64_t ignore_index = -100,
                                                                       int64_t tensor_size = 1);

// The dense tables from every group rank's shard, in rank order, cut to
// `vocab_size` rows (the padding must still be zero: InternalError
// otherwise). `shards[r]`: group rank r's rows.
absl::StatusOr<torch::Tensor> MergeVocabularyShards(const std::vector<torch::Tensor>& shards,
                                                    int64_t vocab_size);

}  // namespace pp

#endif  // PIPELINE_RUNTIME_VOCAB_LAYERS_H_
