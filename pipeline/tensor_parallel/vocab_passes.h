// The vocabulary layers as plain tensor functions split at their collectives,
// for vocabulary parallelism across pipeline stages (issue #40; Yeung et al.,
// "Balancing Pipeline Parallelism with Vocabulary Parallelism", arXiv
// 2411.05288). Every pipeline rank holds 1/p of the padded vocabulary's rows
// of the input embedding and of the output layer; the schedule runs each pass
// below as its own action and the runtime runs the collective between them.
// Nothing here communicates or defines an autograd function (the runtime
// calls the passes on detached tensors; torch ops record a graph only if the
// inputs require grad, as VocabParallelEmbedding's weight does).
//
// Output layer, per micro-batch of N tokens (the paper's S and T passes):
//
//   OutputS             logits of this rank's rows, stats [N, 3] per token
//     all-gather stats  -> [p, N, 3]          (12 N bytes from each rank)
//   CombineOutputStats  global max, sum of exps, target logit, loss
//   OutputT             grad of the hidden states (this rank's part) and of
//                       this rank's rows
//     all-reduce (sum) of the hidden states' gradient [N, D] (in its dtype)
//
// That is the paper's two-barrier algorithm ("Vocab-2"): the last stage's
// backward waits for both collectives and a T pass between them. Its
// one-barrier algorithm ("Vocab-1", the paper's default) moves the hidden
// states' gradient into S, relative to the rank's own max, and leaves T only
// the weight gradient, which no other rank waits for:
//
//   OutputS + OutputPartialGrad   stats, and A_r = sum_j exp(y_j - m_r) W_j
//     all-gather stats            -> [p, N, 3]
//   CombineOutputStats
//   RescaleOutputPartial          grad_scale (A_r exp(m_r - M) / S - [t here] W_t)
//     all-reduce (sum)            -> the hidden states' gradient
//   OutputTWeightGrad             grad of this rank's rows (any time later)
//
// Megatron's vocabulary-parallel cross-entropy (VocabParallelCrossEntropy,
// vocab_parallel.h) all-reduces the max, then the sum of exps relative to it,
// then the target's logit: three collectives, the second waiting on the first.
// Here each rank sends its own max and its sum relative to that max, and every
// rank rescales the sums to the global max (the online-softmax trick:
// sum_r s_r * exp(m_r - M)), so one all-gather of 3 floats per token is the
// only barrier between S and T.
//
// Input layer, per micro-batch:
//
//   EmbeddingPartial     this rank's rows for its ids, zeros for the others
//     reduce (sum) to the first stage of [N, D] (in the weight's dtype)
//   ... the model's forward and backward ...
//     broadcast from the first stage of the embeddings' gradient [N, D]
//   EmbeddingWeightGrad  the gradient of this rank's rows
//
// The formulas are shared with the tensor-parallel path (vocab_parallel.cc),
// one copy of each, through the `internal` functions at the end.
//
// Next: vocab_parallel.h (the same math as autograd functions whose
// collectives run inside, for tensor parallelism).
#ifndef PIPELINE_TENSOR_PARALLEL_VOCAB_PASSES_H_
#define PIPELINE_TENSOR_PARALLEL_VOCAB_PASSES_H_

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "pipeline/layers/layer_context.h"

namespace pp {
namespace tensor_parallel {

// --- The vocabulary split ---------------------------------------------------
// The vocabulary is padded to a multiple of the group's size (Megatron does
// the same): rows past `vocab_size` are zero, never looked up, and their
// logits are left out of the softmax, so the loss and every gradient equal the
// unpadded dense model's. A rank may hold padding only (vocabulary 5 over 4
// ranks: 2 rows each, rank 3's rows 6 and 7 are both padding).

// `vocab_size` rounded up to a multiple of `parts`.
int64_t PaddedVocabSize(int64_t vocab_size, int64_t parts);

// The rows [begin, end) of the padded vocabulary rank `group.rank` holds.
struct VocabRange {
  int64_t begin = 0;
  int64_t end = 0;
};
VocabRange LocalVocabRange(int64_t vocab_size, const ModelParallelGroup& group);

// This rank's rows of `full_table` ([vocab_size, dim], drawn by the model as
// its dense embedding draws it), padded with zero rows to PaddedVocabSize.
torch::Tensor LocalVocabRows(const torch::Tensor& full_table, const ModelParallelGroup& group);

// --- Output layer ------------------------------------------------------------
// Shapes: hidden [N.., D] (any number of token dimensions, N tokens in all),
// targets [N..], weight [rows, D] with rows = range.end - range.begin.
// Softmax math is float32 whatever hidden's dtype (as in
// VocabParallelCrossEntropy); gradients come back in hidden's dtype.

// Columns of the per-token statistics OutputS returns.
inline constexpr int64_t kStatMax = 0;     // max logit over this rank's real columns
inline constexpr int64_t kStatSumExp = 1;  // sum over them of exp(logit - that max)
inline constexpr int64_t kStatTarget = 2;  // the target's logit here, else 0
inline constexpr int64_t kNumOutputStats = 3;

// What OutputT needs of OutputS. Holds a float32 [N, rows] tensor until
// OutputT (or OutputTWeightGrad): the memory the paper's schedule accounts
// for between S and T.
struct OutputSResult {
  // exp(logit - this rank's max), float32 [N, rows]; 0 in padding columns.
  torch::Tensor exps;
  // float32 [N, kNumOutputStats], contiguous: this rank's part of the
  // all-gather. A rank of padding only sends max -inf, sum 0, target 0.
  torch::Tensor stats;
  // Per token [N]: whether the target is ignored, whether it is one of this
  // rank's real rows, and its column here (0 where not).
  torch::Tensor ignored;
  torch::Tensor in_range;
  torch::Tensor local_target;
  std::vector<int64_t> token_sizes;  // N.., to shape OutputT's results
};

// Logits of `hidden` through this rank's rows and their statistics.
// REQUIRES: targets in [0, vocab_size) or equal to `ignore_index`.
OutputSResult OutputS(const torch::Tensor& hidden, const torch::Tensor& weight,
                      const torch::Tensor& targets, int64_t vocab_size, VocabRange range,
                      int64_t ignore_index = -100);

// The softmax over the whole vocabulary, per token, shaped [N..] like the
// targets; float32.
struct CombinedOutputStats {
  torch::Tensor max;           // global max logit
  torch::Tensor sum_exp;       // sum over the vocabulary of exp(logit - max)
  torch::Tensor target_logit;  // the target's logit (0 for an ignored token)
  torch::Tensor loss;          // log(sum_exp) + max - target_logit; 0 if ignored
};

// `gathered`: every rank's OutputSResult::stats in rank order, [p, N, 3]
// float32 (an all-gather of stats.unsqueeze(0) along dim 0). Every rank that
// gives the same `gathered` gets the same bits (the ranks are combined in rank
// order by the same kernels), so all ranks agree on the loss and on T's
// softmax.
CombinedOutputStats CombineOutputStats(const torch::Tensor& gathered, const torch::Tensor& targets,
                                       int64_t ignore_index = -100);

struct OutputGrads {
  // [N.., D] in fp32: this rank's term of d loss / d hidden; the caller sums
  // the ranks' terms (all-reduce) and rounds the sum to the hidden dtype.
  torch::Tensor grad_hidden_partial;
  // [rows, D]: d loss / d weight for this rank's rows; padding rows are 0.
  torch::Tensor grad_weight;
};

// d loss / d logits = (softmax - onehot(target)) * grad_scale per token, then
// through the projection. `grad_scale` [N..]: d total loss / d token loss
// (1 / number of counted tokens for a mean; ignored tokens get 0 whatever it
// says). `hidden` and `weight` are OutputS's.
OutputGrads OutputT(const OutputSResult& s, const CombinedOutputStats& combined,
                    const torch::Tensor& grad_scale, const torch::Tensor& hidden,
                    const torch::Tensor& weight);

// The one-barrier algorithm's S-side term: exp(logit - m_r) through this
// rank's rows, sum_j s.exps[:, j] W_j, float32 [N, D] (0 on a rank of padding
// only, whose exps are 0). `weight` is OutputS's.
torch::Tensor OutputPartialGrad(const OutputSResult& s, const torch::Tensor& weight);

// This rank's term of d loss / d hidden from OutputPartialGrad's `partial`
// once the stats are combined: grad_scale * (partial * exp(m_r - M) / S -
// W_target if the target is one of this rank's rows), 0 for ignored tokens;
// float32 [N.., D]. The ranks' terms sum to OutputT's grad_hidden_partial.
torch::Tensor RescaleOutputPartial(const OutputSResult& s, const CombinedOutputStats& combined,
                                   const torch::Tensor& partial, const torch::Tensor& grad_scale,
                                   const torch::Tensor& weight);

// OutputT's grad_weight alone (the one-barrier algorithm's T pass), the same
// bits.
torch::Tensor OutputTWeightGrad(const OutputSResult& s, const CombinedOutputStats& combined,
                                const torch::Tensor& grad_scale, const torch::Tensor& hidden,
                                const torch::Tensor& weight);

// --- Input layer ---------------------------------------------------------------
// ids [..], weight [rows, D] (this rank's rows of the table, `range`).

// [.., D]: the rows of the ids in `range`, zeros for the others; the caller
// sums the ranks' partials.
torch::Tensor EmbeddingPartial(const torch::Tensor& ids, const torch::Tensor& weight,
                               VocabRange range);

// [rows, D] in weight's dtype: d loss / d weight given `grad_output` [.., D],
// the gradient of the summed embeddings (each in-range id adds its row of it;
// repeated ids add up). Accumulated in float32.
torch::Tensor EmbeddingWeightGrad(const torch::Tensor& ids, const torch::Tensor& grad_output,
                                  const torch::Tensor& weight, VocabRange range);

// --- Shared with vocab_parallel.cc -------------------------------------------
namespace internal {

// Where the targets [..] fall among a rank's `columns` columns starting at
// vocabulary row `begin`. Throws naming an id outside [0, vocab_size) that is
// not `ignore_index`.
struct LocalTargets {
  torch::Tensor ignored;       // bool [..]
  torch::Tensor in_range;      // bool [..]: a real row of this rank, not ignored
  torch::Tensor local_target;  // int64 [..]: its column, 0 where not in range
};
LocalTargets LocateTargets(const torch::Tensor& targets, int64_t vocab_size, int64_t begin,
                           int64_t columns, int64_t ignore_index);

// logits [.., columns] as a float32 copy with the padding columns (rows past
// `vocab_size`) set to -inf, so they drop out of every max and sum.
torch::Tensor MaskedScores(const torch::Tensor& logits, int64_t vocab_size, int64_t begin);

// scores[.., target] where the target is in range, else 0.
torch::Tensor TargetScore(const torch::Tensor& scores, const LocalTargets& t);

// Turns `scores` into exp(scores - max) in place and returns their sum over
// the last dimension. A max of -inf (a rank of padding only) shifts by 0, so
// its exps are exp(-inf) = 0, never NaN.
torch::Tensor ExpSumInPlace(torch::Tensor& scores, const torch::Tensor& max);

// log(sum_exp) - (target - max), 0 where ignored: a token's cross-entropy
// given the softmax's max and sum of exps relative to it.
torch::Tensor TokenLoss(const torch::Tensor& max, const torch::Tensor& sum_exp,
                        const torch::Tensor& target, const torch::Tensor& ignored);

// d loss / d logits, in place on `probs` (the softmax over this rank's
// columns, float32): probs - onehot(target), times `grad_loss` per token (0
// where ignored).
torch::Tensor SoftmaxMinusOneHotInPlace(torch::Tensor probs, const LocalTargets& t,
                                        const torch::Tensor& grad_loss);

}  // namespace internal
}  // namespace tensor_parallel
}  // namespace pp

#endif  // PIPELINE_TENSOR_PARALLEL_VOCAB_PASSES_H_
