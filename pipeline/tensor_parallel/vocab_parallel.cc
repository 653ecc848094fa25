#include "pipeline/tensor_parallel/vocab_parallel.h"

#include <algorithm>
#include <limits>
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
    const torch::Tensor ignored = targets == ignore_index;
    const torch::Tensor out_of_vocab = ((targets < 0) | (targets >= vocab_size)) & ~ignored;
    TORCH_CHECK(!out_of_vocab.any().item<bool>(), "vocabulary-parallel cross-entropy: a target id ",
                targets.masked_select(out_of_vocab)[0].item<int64_t>(), " is outside [0, ",
                vocab_size, ") and is not the ignore index ", ignore_index);

    torch::Tensor scores = logits.to(torch::kFloat32).clone();
    // Padding columns (past the real vocabulary) take no part in the softmax.
    const int64_t real = std::clamp<int64_t>(vocab_size - range.begin, 0, local);
    if (real < local)
      scores.narrow(-1, real, local - real).fill_(-std::numeric_limits<float>::infinity());

    torch::Tensor max = std::get<0>(scores.max(-1)).contiguous();
    AllReduceInPlace(max, group, ReduceOp::kMax, "the logits' max over the vocabulary");
    scores.sub_(max.unsqueeze(-1));

    const torch::Tensor in_range =
        (targets >= range.begin) & (targets < range.begin + real) & ~ignored;
    const torch::Tensor local_target = (targets - range.begin).masked_fill(~in_range, 0);
    torch::Tensor target_score =
        scores.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(~in_range, 0);
    target_score = target_score.contiguous();
    AllReduceInPlace(target_score, group, ReduceOp::kSum, "the targets' logits");

    torch::Tensor exp = scores.exp_();
    torch::Tensor sum = exp.sum(-1).contiguous();
    AllReduceInPlace(sum, group, ReduceOp::kSum, "the softmax's sum over the vocabulary");

    torch::Tensor loss = (sum.log() - target_score).masked_fill(ignored, 0);
    exp.div_(sum.unsqueeze(-1));  // now the softmax
    ctx->save_for_backward({exp, in_range, local_target, ignored});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& softmax = saved[0];
    const torch::Tensor& in_range = saved[1];
    const torch::Tensor& local_target = saved[2];
    const torch::Tensor& ignored = saved[3];
    // d loss / d logit_j = softmax_j - [j == target], per token.
    torch::Tensor grad = softmax.clone();
    grad.scatter_add_(-1, local_target.unsqueeze(-1),
                      -in_range.to(grad.scalar_type()).unsqueeze(-1));
    grad.mul_(grads[0].masked_fill(ignored, 0).unsqueeze(-1));
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

int64_t PaddedVocabSize(int64_t vocab_size, int64_t parts) {
  TORCH_CHECK(vocab_size > 0 && parts > 0, "PaddedVocabSize(", vocab_size, ", ", parts, ")");
  return (vocab_size + parts - 1) / parts * parts;
}

VocabRange LocalVocabRange(int64_t vocab_size, const ModelParallelGroup& group) {
  const int64_t per_rank = PaddedVocabSize(vocab_size, group.size) / group.size;
  return {group.rank * per_rank, (group.rank + 1) * per_rank};
}

torch::Tensor LocalVocabRows(const torch::Tensor& full_table, const ModelParallelGroup& group) {
  TORCH_CHECK(full_table.dim() == 2, "a vocabulary table is [vocab, dim], got ",
              full_table.sizes());
  const int64_t vocab = full_table.size(0);
  const VocabRange range = LocalVocabRange(vocab, group);
  torch::Tensor rows = torch::zeros({range.end - range.begin, full_table.size(1)},
                                    full_table.options().requires_grad(false));
  const int64_t real = std::clamp<int64_t>(vocab - range.begin, 0, range.end - range.begin);
  if (real > 0) rows.narrow(0, 0, real).copy_(full_table.detach().narrow(0, range.begin, real));
  return rows;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const torch::Tensor& full_table,
                                                       ModelParallelGroup group,
                                                       int64_t sequence_dim)
    : vocab_size_(full_table.size(0)), group_(std::move(group)), sequence_dim_(sequence_dim) {
  weight = register_parameter("weight", LocalVocabRows(full_table, group_));
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& ids) {
  if (!group_.is_parallel()) return torch::embedding(weight, ids);
  const VocabRange range = LocalVocabRange(vocab_size_, group_);
  const torch::Tensor outside = (ids < range.begin) | (ids >= range.end);
  const torch::Tensor local = (ids - range.begin).masked_fill(outside, 0);
  const torch::Tensor partial =
      torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0);
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
