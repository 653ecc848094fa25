#include "pipeline/runtime/vocab_layers.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "pipeline/tensor_parallel/mappings.h"
#include "pipeline/tensor_parallel/planted_fault.h"

namespace pp {

VocabularyLayers::VocabularyLayers(const torch::Tensor& embedding, const torch::Tensor& head,
                                   bool tied, ModelParallelGroup group, int64_t ignore_index,
                                   int64_t tensor_size)
    : vocab_size_(embedding.size(0)),
      tied_(tied),
      group_(std::move(group)),
      ignore_index_(ignore_index),
      tensor_size_(tensor_size),
      range_(tensor_parallel::LocalVocabRange(vocab_size_, group_)) {
  TORCH_CHECK(tensor_size_ >= 1 && group_.size % tensor_size_ == 0, "the vocabulary group of ",
              group_.size, " ranks is not stages x ", tensor_size_, " tensor-parallel ranks");
  TORCH_CHECK(tied || (head.dim() == 2 && head.sizes() == embedding.sizes()),
              "an untied head must be [vocab, dim] like the embedding ", embedding.sizes(),
              ", got ", head.sizes());
  embedding_ = tensor_parallel::LocalVocabRows(embedding, group_).requires_grad_(true);
  if (!tied) head_ = tensor_parallel::LocalVocabRows(head, group_).requires_grad_(true);
}

void VocabularyLayers::to(const torch::Device& device) {
  TORCH_CHECK(pending_.empty(), "moving the vocabulary shards with ", pending_.size(),
              " micro-batches between OUT_S and OUT_T");
  auto moved = [&](const torch::Tensor& shard) {
    TORCH_CHECK(!shard.grad().defined(), "moving a vocabulary shard that has a gradient");
    torch::NoGradGuard no_grad;
    return shard.detach().to(device).requires_grad_(true);
  };
  embedding_ = moved(embedding_);
  if (!tied_) head_ = moved(head_);
  last_hidden_ = torch::Tensor();
}

std::vector<torch::Tensor> VocabularyLayers::parameters() const {
  if (tied_) return {embedding_};
  return {embedding_, head_};
}

void VocabularyLayers::Accumulate(torch::Tensor param, const torch::Tensor& grad) {
  // A handle of the parameter: its .grad is the parameter's.
  torch::Tensor& g = param.mutable_grad();
  if (g.defined()) {
    g.add_(grad);
  } else {
    g = grad.clone();
  }
}

torch::Tensor VocabularyLayers::Embed(const torch::Tensor& ids) const {
  torch::NoGradGuard no_grad;
  return tensor_parallel::EmbeddingPartial(ids, embedding_, range_);
}

void VocabularyLayers::EmbedBackward(const torch::Tensor& ids, const torch::Tensor& grad_output) {
  torch::NoGradGuard no_grad;
  Accumulate(embedding_,
             tensor_parallel::EmbeddingWeightGrad(ids, grad_output, embedding_, range_));
}

torch::Tensor VocabularyLayers::OutputS(int mb, const torch::Tensor& hidden,
                                        const torch::Tensor& labels, bool partial) {
  torch::NoGradGuard no_grad;
  Pending& p = pending_[mb];
  p.hidden = hidden;
  last_hidden_ = hidden.detach();  // not the last stage's graph
  p.labels = labels;
  p.s = tensor_parallel::OutputS(hidden, head(), labels, vocab_size_, range_, ignore_index_);
  if (partial) p.partial = tensor_parallel::OutputPartialGrad(p.s, head());
  return p.s.stats;
}

torch::Tensor VocabularyLayers::Combine(int mb, const torch::Tensor& gathered) {
  auto it = pending_.find(mb);
  TORCH_CHECK(it != pending_.end(), "vocabulary statistics of micro-batch ", mb,
              " combined before its OUT_S");
  torch::NoGradGuard no_grad;
  it->second.combined =
      tensor_parallel::CombineOutputStats(gathered, it->second.labels, ignore_index_);
  it->second.combined_set = true;
  return it->second.combined.loss;
}

VocabularyLayers::Pending& VocabularyLayers::Combined(int mb, const char* pass) {
  auto it = pending_.find(mb);
  TORCH_CHECK(it != pending_.end() && it->second.combined_set, pass, " of micro-batch ", mb,
              " before its OUT_S and OUT_STATS");
  return it->second;
}

torch::Tensor VocabularyLayers::RescaledPartial(int mb, const torch::Tensor& grad_scale) {
  Pending& p = Combined(mb, "OUT_REDUCE");
  TORCH_CHECK(p.partial.defined(), "OUT_REDUCE of micro-batch ", mb,
              ": its OUT_S kept no partial gradient (the one-barrier algorithm's)");
  torch::NoGradGuard no_grad;
  const torch::Tensor out =
      tensor_parallel::RescaleOutputPartial(p.s, p.combined, p.partial, grad_scale, head());
  p.partial = torch::Tensor();
  return out;
}

void VocabularyLayers::OutputWeightGrad(int mb, const torch::Tensor& grad_scale) {
  Combined(mb, "OUT_T");
  torch::NoGradGuard no_grad;
  auto it = pending_.find(mb);
  Pending p = std::move(it->second);
  pending_.erase(it);
  Accumulate(head(),
             tensor_parallel::OutputTWeightGrad(p.s, p.combined, grad_scale, p.hidden, head()));
}

torch::Tensor VocabularyLayers::OutputT(int mb, const torch::Tensor& grad_scale) {
  Combined(mb, "OUT_T");
  auto it = pending_.find(mb);
  torch::NoGradGuard no_grad;
  Pending p = std::move(it->second);
  pending_.erase(it);
  tensor_parallel::OutputGrads grads =
      tensor_parallel::OutputT(p.s, p.combined, grad_scale, p.hidden, head());
  Accumulate(head(), grads.grad_weight);
  return grads.grad_hidden_partial;
}

absl::StatusOr<torch::Tensor> VocabularyLayers::GatherRows(const torch::Tensor& rows,
                                                           const std::string& what) const {
  const int64_t local = range_.end - range_.begin;
  if (rows.dim() < 1 || rows.size(0) != local) {
    return absl::InvalidArgumentError(absl::StrCat("gathering ", what, ": this rank holds ", local,
                                                   " vocabulary rows, the tensor has shape ",
                                                   c10::str(rows.sizes())));
  }
  torch::Tensor gathered;
  PP_RETURN_IF_ERROR(TorchCall(absl::StrCat("gathering ", what, " over the vocabulary group"), [&] {
    torch::NoGradGuard no_grad;
    gathered = tensor_parallel::AllGather(rows.detach(), group_, 0, what);
  }));
  return MergeVocabularyShards({gathered}, vocab_size_);
}

absl::StatusOr<torch::Tensor> VocabularyLayers::GatherLogits(const torch::Tensor& hidden) const {
  if (hidden.dim() != 1 || hidden.size(0) != dim()) {
    return absl::InvalidArgumentError(absl::StrCat("the head's input of one token must be [", dim(),
                                                   "], got ", c10::str(hidden.sizes())));
  }
  torch::Tensor rows;
  PP_RETURN_IF_ERROR(TorchCall("this rank's logits", [&] {
    torch::NoGradGuard no_grad;
    rows = torch::mv(head().detach().to(torch::kFloat32), hidden.detach().to(torch::kFloat32));
  }));
  return GatherRows(rows, "the sampling logits");
}

torch::Tensor VocabularyLayers::SequenceSlice(const torch::Tensor& full) const {
  TORCH_CHECK(full.dim() > kSequenceDim && full.size(kSequenceDim) % tensor_size_ == 0,
              "under sequence parallelism the sequence length (dimension ", kSequenceDim, " of ",
              full.sizes(), ") must be a multiple of the tensor-parallel size ", tensor_size_);
  const int64_t local = full.size(kSequenceDim) / tensor_size_;
  // Planted (tests only): the next tensor rank's slice.
  const int64_t rank = tensor_parallel::internal::CurrentFault() ==
                               tensor_parallel::internal::PlantedFault::kWrongVocabSequenceSlice
                           ? (tensor_rank() + 1) % tensor_size_
                           : tensor_rank();
  return full.narrow(kSequenceDim, rank * local, local);
}

torch::Tensor VocabularyLayers::LocalRows(const torch::Tensor& full) const {
  torch::NoGradGuard no_grad;
  return tensor_parallel::LocalVocabRows(full, group_);
}

namespace {

absl::StatusOr<torch::Tensor> DenseTable(const VocabularySplit& split, int64_t index,
                                         const std::function<torch::Tensor(LayerImpl&)>& table,
                                         uint64_t base_seed, const char* what) {
  const int64_t layers = static_cast<int64_t>(split.dense.size());
  if (index < 0 || index >= layers) {
    return absl::InvalidArgumentError(absl::StrCat("the vocabulary split's ", what, " layer ",
                                                   index, " is not a layer of the dense model (0..",
                                                   layers - 1, ")"));
  }
  torch::Tensor out;
  PP_RETURN_IF_ERROR(TorchCall(absl::StrCat("building the dense ", what), [&] {
    Layer layer = BuildSpecLayer(split.dense[index], index, base_seed);
    out = table(*layer).detach().clone();
  }));
  if (out.dim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("the vocabulary split's ", what,
                                                   " table must be [vocab, dim], got ",
                                                   c10::str(out.sizes())));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<VocabularyLayers>> MakeVocabularyLayers(const VocabularySplit& split,
                                                                       uint64_t base_seed,
                                                                       ModelParallelGroup group,
                                                                       int64_t ignore_index,
                                                                       int64_t tensor_size) {
  if (!split.embedding_table) {
    return absl::InvalidArgumentError("a vocabulary split needs its embedding_table");
  }
  PP_ASSIGN_OR_RETURN(
      torch::Tensor embedding,
      DenseTable(split, split.embedding_layer, split.embedding_table, base_seed, "embedding"));
  torch::Tensor head;
  if (!split.tied()) {
    PP_ASSIGN_OR_RETURN(head,
                        DenseTable(split, split.head_layer, split.head_table, base_seed, "head"));
    if (head.sizes() != embedding.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the vocabulary split's head table is ", c10::str(head.sizes()),
          " but its embedding table is ", c10::str(embedding.sizes()), "; they must match"));
    }
  }
  std::unique_ptr<VocabularyLayers> layers;
  PP_RETURN_IF_ERROR(TorchCall("sharding the vocabulary", [&] {
    layers = std::make_unique<VocabularyLayers>(embedding, head, split.tied(), std::move(group),
                                                ignore_index, tensor_size);
  }));
  layers->set_dense_layout({.embedding_name = split.embedding_name,
                            .head_name = split.tied() ? "" : split.head_name,
                            .dense_name = split.dense_name,
                            .num_layers = static_cast<int64_t>(split.dense.size())});
  return layers;
}

absl::StatusOr<torch::Tensor> MergeVocabularyShards(const std::vector<torch::Tensor>& shards,
                                                    int64_t vocab_size) {
  if (shards.empty()) return absl::InvalidArgumentError("no vocabulary shards to merge");
  torch::Tensor merged = torch::cat(shards, 0);
  if (merged.size(0) < vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the shards hold ", merged.size(0), " rows, fewer than the vocabulary's ", vocab_size));
  }
  torch::Tensor padding = merged.narrow(0, vocab_size, merged.size(0) - vocab_size);
  if (padding.numel() > 0 && !torch::equal(padding, torch::zeros_like(padding))) {
    return absl::InternalError(absl::StrCat("the vocabulary's padding rows past ", vocab_size,
                                            " trained (they must stay zero)"));
  }
  return merged.narrow(0, 0, vocab_size).contiguous();
}

}  // namespace pp
