#include "pipeline/tensor_parallel/vocab_parallel.h"

#include <utility>

#include "pipeline/tensor_parallel/mappings.h"

namespace pp {
namespace tensor_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward: the per-token loss from three all-reduces; backward: the softmax
// minus the target's one-hot, on this rank's columns only (no communication).
struct CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t vocab_size,
                               const ModelParallelGroup& group, int64_t ignore_index) {
    const VocabRange range = LocalVocabRange(vocab_size, group);
    const int64_t local = logits.size(-1);
    TORCH_CHECK(local == range.end - range.begin, "vocabulary-parallel cross-entropy: logits of ",
                local, " columns on ", DescribeModelParallel(group), " where a vocabulary of ",
                vocab_size, " padded to ", PaddedVocabSize(vocab_size, group.size),
                " gives each rank ", range.end - range.begin);
    TORCH_CHECK(targets.sizes() == logits.sizes().slice(0, logits.dim() - 1),
                "vocabulary-parallel cross-entropy: targets of shape ", targets.sizes(),
                " do not match logits of shape ", logits.sizes());
    const internal::LocalTargets t =
        internal::LocateTargets(targets, vocab_size, range.begin, local, ignore_index);

    torch::Tensor scores = internal::MaskedScores(logits, vocab_size, range.begin);
    torch::Tensor max = std::get<0>(scores.max(-1)).contiguous();
    AllReduceInPlace(max, group, ReduceOp::kMax, "the logits' max over the vocabulary");
    // The target's logit itself (one rank's, the others send 0: the sum is
    // exact), so TokenLoss subtracts the max from it as it would have been
    // subtracted from the scores.
    torch::Tensor target = internal::TargetScore(scores, t).contiguous();
    AllReduceInPlace(target, group, ReduceOp::kSum, "the targets' logits");
    torch::Tensor sum = internal::ExpSumInPlace(scores, max).contiguous();
    AllReduceInPlace(sum, group, ReduceOp::kSum, "the softmax's sum over the vocabulary");

    torch::Tensor loss = internal::TokenLoss(max, sum, target, t.ignored);
    scores.div_(sum.unsqueeze(-1));  // now the softmax
    ctx->save_for_backward({scores, t.in_range, t.local_target, t.ignored});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const internal::LocalTargets t{saved[3], saved[1], saved[2]};
    // d loss / d logit_j = softmax_j - [j == target], per token.
    const torch::Tensor grad = internal::SoftmaxMinusOneHotInPlace(saved[0].clone(), t, grads[0]);
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const torch::Tensor& full_table,
                                                       ModelParallelGroup group,
                                                       int64_t sequence_dim)
    : vocab_size_(full_table.size(0)), group_(std::move(group)), sequence_dim_(sequence_dim) {
  weight = register_parameter("weight", LocalVocabRows(full_table, group_));
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& ids) {
  if (!group_.is_parallel()) return torch::embedding(weight, ids);
  const torch::Tensor partial = EmbeddingPartial(ids, weight, LocalVocabRange(vocab_size_, group_));
  return group_.sequence_parallel
             ? ReduceScatterToSequenceParallelRegion(partial, group_, sequence_dim_)
             : ReduceFromTensorParallelRegion(partial, group_);
}

std::map<std::string, ShardSpec> VocabParallelEmbeddingImpl::ShardDims() const {
  if (!group_.is_parallel()) return {};
  return {{"weight", ShardSpec{0, 1}}};
}

torch::Tensor VocabParallelLogits(const torch::Tensor& x, const torch::Tensor& weight,
                                  const ModelParallelGroup& group, int64_t sequence_dim) {
  const torch::Tensor input = group.sequence_parallel
                                  ? GatherFromSequenceParallelRegion(x, group, sequence_dim)
                                  : CopyToTensorParallelRegion(x, group);
  return torch::matmul(input, weight.t());
}

torch::Tensor VocabParallelCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                        int64_t vocab_size, const ModelParallelGroup& group,
                                        int64_t ignore_index) {
  return CrossEntropyFunction::apply(logits, targets, vocab_size, group, ignore_index);
}

}  // namespace tensor_parallel
}  // namespace pp
