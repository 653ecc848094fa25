// The vocabulary split across a group: an embedding whose rows, an output
// projection whose logits, and a cross-entropy whose softmax are each held
// 1/size per rank (Megatron's VocabParallelEmbedding and
// vocab_parallel_cross_entropy). The full [tokens, vocabulary] logits never
// exist on one rank: the loss needs only the max and the sum of exponentials
// over the vocabulary (two all-reduces of one number per token) and the
// target's logit (one more).
//
// The vocabulary's split over the group (padding, each rank's rows) and the
// formulas are in vocab_passes.h, which also offers them as plain passes with
// the collectives left to the caller, for vocabulary parallelism across
// pipeline stages.
#ifndef PIPELINE_TENSOR_PARALLEL_VOCAB_PARALLEL_H_
#define PIPELINE_TENSOR_PARALLEL_VOCAB_PARALLEL_H_

#include <cstdint>
#include <map>
#include <string>

#include <torch/torch.h>

#include "pipeline/layers/layer_context.h"
#include "pipeline/tensor_parallel/sharded_module.h"
#include "pipeline/tensor_parallel/vocab_passes.h"

namespace pp {
namespace tensor_parallel {

// Token ids [..] -> embeddings [.., dim]: each rank looks up the ids in its
// rows (zeros elsewhere) and the group sums them; under sequence parallelism
// the sum is reduce-scattered along `sequence_dim` of the output.
class VocabParallelEmbeddingImpl : public torch::nn::Module, public ShardedModule {
 public:
  // `full_table`: the dense table [vocab_size, dim]; this rank keeps its rows.
  VocabParallelEmbeddingImpl(const torch::Tensor& full_table, ModelParallelGroup group,
                             int64_t sequence_dim = 1);
  torch::Tensor forward(const torch::Tensor& ids);
  std::map<std::string, ShardSpec> ShardDims() const override;

  int64_t vocab_size() const { return vocab_size_; }
  const ModelParallelGroup& group() const { return group_; }
  torch::Tensor weight;  // [padded vocab / size, dim]

 private:
  int64_t vocab_size_;
  ModelParallelGroup group_;
  int64_t sequence_dim_;
};
TORCH_MODULE(VocabParallelEmbedding);

// This rank's logits [.., vocab / size] of hidden states `x` [.., dim] through
// its rows `weight` [vocab / size, dim] (a tied embedding's or a head's own).
// The input's gradient is all-reduced over the group; under sequence
// parallelism `x` is a sequence shard and is all-gathered along `sequence_dim`.
torch::Tensor VocabParallelLogits(const torch::Tensor& x, const torch::Tensor& weight,
                                  const ModelParallelGroup& group, int64_t sequence_dim = 1);

// Per-token cross-entropy [..] of this rank's logits [.., vocab / size] and
// the targets [..] (ids of the unpadded vocabulary, or `ignore_index`, whose
// loss and gradient are 0). Computed in float32 whatever the logits' dtype;
// the gradient is returned in the logits' dtype.
torch::Tensor VocabParallelCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                        int64_t vocab_size, const ModelParallelGroup& group,
                                        int64_t ignore_index = -100);

}  // namespace tensor_parallel
}  // namespace pp

#endif  // PIPELINE_TENSOR_PARALLEL_VOCAB_PARALLEL_H_
