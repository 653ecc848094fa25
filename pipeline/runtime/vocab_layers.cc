#include "pipeline/runtime/vocab_layers.h"

#include <utility>

namespace pp {

VocabularyLayers::VocabularyLayers(const torch::Tensor& embedding, const torch::Tensor& head,
                                   bool tied, ModelParallelGroup pipe, int64_t ignore_index)
    : vocab_size_(embedding.size(0)),
      tied_(tied),
      pipe_(std::move(pipe)),
      ignore_index_(ignore_index),
      range_(tensor_parallel::LocalVocabRange(vocab_size_, pipe_)) {
  TORCH_CHECK(tied || (head.dim() == 2 && head.sizes() == embedding.sizes()),
              "an untied head must be [vocab, dim] like the embedding ", embedding.sizes(),
              ", got ", head.sizes());
  embedding_ = tensor_parallel::LocalVocabRows(embedding, pipe_).requires_grad_(true);
  if (!tied) head_ = tensor_parallel::LocalVocabRows(head, pipe_).requires_grad_(true);
}

std::vector<torch::Tensor> VocabularyLayers::parameters() const {
  if (tied_) return {embedding_};
  return {embedding_, head_};
}

void VocabularyLayers::Accumulate(const torch::Tensor& param, const torch::Tensor& grad) {
  torch::Tensor& g = const_cast<torch::Tensor&>(param).mutable_grad();
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
                                        const torch::Tensor& labels) {
  torch::NoGradGuard no_grad;
  Pending& p = pending_[mb];
  p.hidden = hidden;
  p.labels = labels;
  p.s = tensor_parallel::OutputS(hidden, head(), labels, vocab_size_, range_, ignore_index_);
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

torch::Tensor VocabularyLayers::OutputT(int mb, const torch::Tensor& grad_scale) {
  auto it = pending_.find(mb);
  TORCH_CHECK(it != pending_.end() && it->second.combined_set, "OUT_T of micro-batch ", mb,
              " before its OUT_S and OUT_STATS");
  torch::NoGradGuard no_grad;
  Pending p = std::move(it->second);
  pending_.erase(it);
  tensor_parallel::OutputGrads grads =
      tensor_parallel::OutputT(p.s, p.combined, grad_scale, p.hidden, head());
  Accumulate(head(), grads.grad_weight);
  return grads.grad_hidden_partial;
}

}  // namespace pp
