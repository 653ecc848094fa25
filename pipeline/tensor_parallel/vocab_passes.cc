#include "pipeline/tensor_parallel/vocab_passes.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "pipeline/tensor_parallel/planted_fault.h"

namespace pp {
namespace tensor_parallel {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// How many of a rank's `columns` columns, starting at vocabulary row `begin`,
// are real rows (the rest are padding).
int64_t RealColumns(int64_t vocab_size, int64_t begin, int64_t columns) {
  return std::clamp<int64_t>(vocab_size - begin, 0, columns);
}

// What to subtract from scores whose max is `max`: the max, or 0 where it is
// -inf (no real column), since -inf - -inf is NaN.
torch::Tensor Shift(const torch::Tensor& max) { return max.masked_fill(max == kMinusInf, 0); }

void CheckRows(const char* pass, const torch::Tensor& weight, VocabRange range) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == range.end - range.begin, pass,
              ": weight of shape ", weight.sizes(), " is not this rank's rows [", range.begin, ", ",
              range.end, ") of the vocabulary: want [", range.end - range.begin, ", dim]");
}

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
  const int64_t real = RealColumns(vocab, range.begin, range.end - range.begin);
  // Planted (tests only): ranks > 0 read their rows one row early.
  const int64_t shift =
      group.rank > 0 && internal::CurrentFault() == internal::PlantedFault::kShiftedVocabRows ? -1
                                                                                              : 0;
  if (real > 0) {
    rows.narrow(0, 0, real).copy_(full_table.detach().narrow(0, range.begin + shift, real));
  }
  return rows;
}

namespace internal {

LocalTargets LocateTargets(const torch::Tensor& targets, int64_t vocab_size, int64_t begin,
                           int64_t columns, int64_t ignore_index) {
  const torch::Tensor ignored = targets == ignore_index;
  const torch::Tensor out_of_vocab = ((targets < 0) | (targets >= vocab_size)) & ~ignored;
  TORCH_CHECK(!out_of_vocab.any().item<bool>(), "vocabulary-parallel cross-entropy: a target id ",
              targets.masked_select(out_of_vocab)[0].item<int64_t>(), " is outside [0, ",
              vocab_size, ") and is not the ignore index ", ignore_index);
  const int64_t real = RealColumns(vocab_size, begin, columns);
  const torch::Tensor in_range = (targets >= begin) & (targets < begin + real) & ~ignored;
  return {ignored, in_range, (targets - begin).masked_fill(~in_range, 0)};
}

torch::Tensor MaskedScores(const torch::Tensor& logits, int64_t vocab_size, int64_t begin) {
  torch::Tensor scores = logits.to(torch::kFloat32).clone();
  const int64_t columns = logits.size(-1);
  const int64_t real = RealColumns(vocab_size, begin, columns);
  if (real < columns) scores.narrow(-1, real, columns - real).fill_(kMinusInf);
  return scores;
}

torch::Tensor TargetScore(const torch::Tensor& scores, const LocalTargets& t) {
  return scores.gather(-1, t.local_target.unsqueeze(-1)).squeeze(-1).masked_fill(~t.in_range, 0);
}

torch::Tensor ExpSumInPlace(torch::Tensor& scores, const torch::Tensor& max) {
  scores.sub_(Shift(max).unsqueeze(-1)).exp_();
  return scores.sum(-1);
}

torch::Tensor TokenLoss(const torch::Tensor& max, const torch::Tensor& sum_exp,
                        const torch::Tensor& target, const torch::Tensor& ignored) {
  return (sum_exp.log() - (target - max)).masked_fill(ignored, 0);
}

torch::Tensor SoftmaxMinusOneHotInPlace(torch::Tensor probs, const LocalTargets& t,
                                        const torch::Tensor& grad_loss) {
  probs.scatter_add_(-1, t.local_target.unsqueeze(-1),
                     -t.in_range.to(probs.scalar_type()).unsqueeze(-1));
  probs.mul_(grad_loss.masked_fill(t.ignored, 0).unsqueeze(-1));
  return probs;
}

}  // namespace internal

OutputSResult OutputS(const torch::Tensor& hidden, const torch::Tensor& weight,
                      const torch::Tensor& targets, int64_t vocab_size, VocabRange range,
                      int64_t ignore_index) {
  CheckRows("OutputS", weight, range);
  TORCH_CHECK(hidden.dim() >= 1 && hidden.size(-1) == weight.size(1), "OutputS: hidden states of ",
              "shape ", hidden.sizes(), " do not match weight of shape ", weight.sizes(),
              " (their last dimensions must agree)");
  TORCH_CHECK(hidden.scalar_type() == weight.scalar_type(), "OutputS: hidden states in ",
              hidden.scalar_type(), " and weight in ", weight.scalar_type());
  const auto token_sizes = hidden.sizes().slice(0, hidden.dim() - 1);
  TORCH_CHECK(targets.sizes() == token_sizes, "OutputS: targets of shape ", targets.sizes(),
              " do not match hidden states of shape ", hidden.sizes());

  const internal::LocalTargets t = internal::LocateTargets(
      targets.reshape({-1}), vocab_size, range.begin, weight.size(0), ignore_index);
  const torch::Tensor logits = torch::matmul(hidden.reshape({-1, weight.size(1)}), weight.t());
  torch::Tensor scores = internal::MaskedScores(logits, vocab_size, range.begin);
  const torch::Tensor max = std::get<0>(scores.max(-1));  // -inf on a rank of padding only
  const torch::Tensor target = internal::TargetScore(scores, t);
  const torch::Tensor sum = internal::ExpSumInPlace(scores, max);

  OutputSResult s;
  s.exps = std::move(scores);
  s.stats = torch::stack({max, sum, target}, -1).contiguous();
  s.ignored = t.ignored;
  s.in_range = t.in_range;
  s.local_target = t.local_target;
  s.token_sizes = token_sizes.vec();
  return s;
}

CombinedOutputStats CombineOutputStats(const torch::Tensor& gathered, const torch::Tensor& targets,
                                       int64_t ignore_index) {
  TORCH_CHECK(gathered.dim() == 3 && gathered.size(1) == targets.numel() &&
                  gathered.size(2) == kNumOutputStats && gathered.scalar_type() == torch::kFloat32,
              "CombineOutputStats: gathered statistics of shape ", gathered.sizes(), " (",
              gathered.scalar_type(), ") where [p, N, ", kNumOutputStats,
              "] float32 is needed, N = ", targets.numel(), " tokens (targets of shape ",
              targets.sizes(), ")");
  const torch::Tensor max = std::get<0>(gathered.select(2, kStatMax).max(0));
  const torch::Tensor shift = Shift(max);
  torch::Tensor sum = torch::zeros_like(max);
  torch::Tensor target = torch::zeros_like(max);
  // In rank order, so that every rank adds in the same order.
  for (int64_t r = 0; r < gathered.size(0); ++r) {
    const torch::Tensor stats = gathered[r];
    sum.add_(stats.select(1, kStatSumExp) * (stats.select(1, kStatMax) - shift).exp());
    target.add_(stats.select(1, kStatTarget));  // one rank holds the target, the rest send 0
  }
  const torch::Tensor ignored = targets.reshape({-1}) == ignore_index;
  CombinedOutputStats c;
  c.max = max.reshape(targets.sizes());
  c.sum_exp = sum.reshape(targets.sizes());
  c.target_logit = target.reshape(targets.sizes());
  c.loss = internal::TokenLoss(max, sum, target, ignored).reshape(targets.sizes());
  return c;
}

namespace {

// `grad_scale` and `combined` cover OutputS's tokens: the check of every
// pass that applies the combined statistics.
void CheckTokens(const char* pass, const OutputSResult& s, const CombinedOutputStats& combined,
                 const torch::Tensor& grad_scale) {
  const int64_t tokens = s.exps.size(0);
  TORCH_CHECK(grad_scale.numel() == tokens && combined.max.numel() == tokens &&
                  combined.sum_exp.numel() == tokens,
              pass, ": grad_scale of shape ", grad_scale.sizes(), " and combined statistics of ",
              "shape ", combined.max.sizes(), " for OutputS's ", tokens, " tokens");
}

// The checks OutputT's variants share: `hidden` and `weight` are OutputS's,
// `grad_scale` and `combined` cover its tokens.
void CheckOutputT(const char* pass, const OutputSResult& s, const CombinedOutputStats& combined,
                  const torch::Tensor& grad_scale, const torch::Tensor& hidden,
                  const torch::Tensor& weight) {
  const int64_t tokens = s.exps.size(0);
  std::vector<int64_t> hidden_sizes = s.token_sizes;
  hidden_sizes.push_back(weight.dim() == 2 ? weight.size(1) : -1);
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == s.exps.size(1) &&
                  hidden.sizes() == torch::IntArrayRef(hidden_sizes) &&
                  hidden.scalar_type() == weight.scalar_type(),
              pass, ": hidden states of shape ", hidden.sizes(), " (", hidden.scalar_type(),
              ") and weight of shape ", weight.sizes(), " (", weight.scalar_type(),
              ") are not OutputS's: it saw ", tokens, " tokens of shape ",
              torch::IntArrayRef(s.token_sizes), " and ", s.exps.size(1), " rows");
  CheckTokens(pass, s, combined, grad_scale);
}

// exp(m_r - M) / sum per token [N]: what turns this rank's exps (relative to
// its own max m_r) into the softmax, exp(logit - m_r) * exp(m_r - M) / sum =
// exp(logit - M) / sum. A rank of padding only (m_r = -inf) gets
// exp(-inf) = 0.
torch::Tensor SoftmaxFactor(const OutputSResult& s, const CombinedOutputStats& combined) {
  const torch::Tensor local_max = s.stats.select(1, kStatMax);
  return (local_max - combined.max.reshape({-1})).exp_().div_(combined.sum_exp.reshape({-1}));
}

internal::LocalTargets TargetsOf(const OutputSResult& s) {
  return {s.ignored, s.in_range, s.local_target};
}

// d loss / d logits of this rank's columns [N, rows], in `dtype`.
torch::Tensor GradLogits(const OutputSResult& s, const CombinedOutputStats& combined,
                         const torch::Tensor& grad_scale, torch::ScalarType dtype) {
  return internal::SoftmaxMinusOneHotInPlace(s.exps * SoftmaxFactor(s, combined).unsqueeze(-1),
                                             TargetsOf(s),
                                             grad_scale.reshape({-1}).to(torch::kFloat32))
      .to(dtype);
}

std::vector<int64_t> HiddenSizes(const OutputSResult& s, const torch::Tensor& weight) {
  std::vector<int64_t> sizes = s.token_sizes;
  sizes.push_back(weight.size(1));
  return sizes;
}

// d loss / d weight of this rank's rows [rows, D] from GradLogits'
// `grad_logits`: OutputT's and OutputTWeightGrad's one product, so that the
// two give the same bits.
torch::Tensor WeightGrad(const OutputSResult& s, const torch::Tensor& grad_logits,
                         const torch::Tensor& hidden) {
  return torch::matmul(grad_logits.t(), hidden.reshape({s.exps.size(0), -1}));
}

}  // namespace

OutputGrads OutputT(const OutputSResult& s, const CombinedOutputStats& combined,
                    const torch::Tensor& grad_scale, const torch::Tensor& hidden,
                    const torch::Tensor& weight) {
  CheckOutputT("OutputT", s, combined, grad_scale, hidden, weight);
  const torch::Tensor grad_logits = GradLogits(s, combined, grad_scale, hidden.scalar_type());
  OutputGrads g;
  // The share in fp32 whatever the weight's dtype: the shares are summed
  // before the sum is rounded once to the hidden states' dtype, as the dense
  // head's one matrix product accumulates in fp32 and rounds once.
  g.grad_hidden_partial = torch::matmul(grad_logits.to(torch::kFloat32), weight.to(torch::kFloat32))
                              .reshape(HiddenSizes(s, weight));
  g.grad_weight = WeightGrad(s, grad_logits, hidden);
  return g;
}

torch::Tensor OutputTWeightGrad(const OutputSResult& s, const CombinedOutputStats& combined,
                                const torch::Tensor& grad_scale, const torch::Tensor& hidden,
                                const torch::Tensor& weight) {
  CheckOutputT("OutputTWeightGrad", s, combined, grad_scale, hidden, weight);
  return WeightGrad(s, GradLogits(s, combined, grad_scale, hidden.scalar_type()), hidden);
}

torch::Tensor OutputPartialGrad(const OutputSResult& s, const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == s.exps.size(1),
              "OutputPartialGrad: weight of shape ", weight.sizes(), " is not OutputS's (",
              s.exps.size(1), " rows)");
  // In fp32, as OutputT's share: summed over the ranks, rounded once.
  return torch::matmul(s.exps, weight.to(torch::kFloat32));
}

torch::Tensor RescaleOutputPartial(const OutputSResult& s, const CombinedOutputStats& combined,
                                   const torch::Tensor& partial, const torch::Tensor& grad_scale,
                                   const torch::Tensor& weight) {
  const int64_t tokens = s.exps.size(0);
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == s.exps.size(1) && partial.dim() == 2 &&
                  partial.size(0) == tokens && partial.size(1) == weight.size(1) &&
                  partial.scalar_type() == torch::kFloat32,
              "RescaleOutputPartial: partial of shape ", partial.sizes(), " (",
              partial.scalar_type(), ") and weight of shape ", weight.sizes(),
              " are not OutputPartialGrad's for ", tokens, " tokens and ", s.exps.size(1), " rows");
  CheckTokens("RescaleOutputPartial", s, combined, grad_scale);
  const internal::LocalTargets t = TargetsOf(s);
  // Planted (tests only): the partial left relative to this rank's own max.
  const torch::Tensor factor =
      internal::CurrentFault() == internal::PlantedFault::kVocabPartialNotRescaled
          ? torch::ones({tokens}, partial.options())
          : SoftmaxFactor(s, combined);
  // The target's row where it is one of this rank's real rows, else 0.
  const torch::Tensor target_rows = torch::embedding(weight, s.local_target).to(torch::kFloat32) *
                                    t.in_range.to(torch::kFloat32).unsqueeze(-1);
  const torch::Tensor grad_loss =
      grad_scale.reshape({-1}).to(torch::kFloat32).masked_fill(t.ignored, 0);
  return ((partial * factor.unsqueeze(-1) - target_rows) * grad_loss.unsqueeze(-1))
      .reshape(HiddenSizes(s, weight));
}

torch::Tensor EmbeddingPartial(const torch::Tensor& ids, const torch::Tensor& weight,
                               VocabRange range) {
  CheckRows("EmbeddingPartial", weight, range);
  const torch::Tensor outside = (ids < range.begin) | (ids >= range.end);
  const torch::Tensor local = (ids - range.begin).masked_fill(outside, 0);
  return torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0);
}

torch::Tensor EmbeddingWeightGrad(const torch::Tensor& ids, const torch::Tensor& grad_output,
                                  const torch::Tensor& weight, VocabRange range) {
  CheckRows("EmbeddingWeightGrad", weight, range);
  const int64_t dim = weight.size(1);
  TORCH_CHECK(
      grad_output.dim() == ids.dim() + 1 &&
          grad_output.sizes().slice(0, ids.dim()) == ids.sizes() && grad_output.size(-1) == dim,
      "EmbeddingWeightGrad: output gradient of shape ", grad_output.sizes(), " for ids of shape ",
      ids.sizes(), " and weight of shape ", weight.sizes(), ": want the ids' shape and ", dim);
  const torch::Tensor flat_ids = ids.reshape({-1});
  const torch::Tensor in_range = (flat_ids >= range.begin) & (flat_ids < range.end);
  torch::Tensor grad =
      torch::zeros({weight.size(0), dim}, grad_output.options().dtype(torch::kFloat32));
  grad.index_add_(0, flat_ids.masked_select(in_range) - range.begin,
                  grad_output.reshape({-1, dim}).index({in_range}).to(torch::kFloat32));
  return grad.to(weight.scalar_type());
}

}  // namespace tensor_parallel
}  // namespace pp
