// Dropout inside a tensor-parallel region with the dense model's mask.
//
// Megatron draws such masks from a per-tp-rank RNG stream, so its results
// depend on tp. pipe keeps them independent of tp instead: every rank of a
// model group holds the same generator state (the driver seeds a rank by its
// stage and data index, not its tp index) and draws the noise of the whole
// tensor, exactly as torch::dropout draws it for the dense one, then keeps
// its own slice. The masks then equal tp = 1's bit for bit (CPU), every rank
// of the group advances its generator alike, so the dropouts outside the
// region (on activations whole on every rank) agree across the group too,
// and activation checkpointing replays both by restoring one generator
// state. The price: tp times the local draws, no communication.
#ifndef PIPELINE_TENSOR_PARALLEL_DROPOUT_H_
#define PIPELINE_TENSOR_PARALLEL_DROPOUT_H_

#include <cstdint>

#include <torch/torch.h>

#include "pipeline/layers/layer_context.h"

namespace pp {
namespace tensor_parallel {

// `local` is this rank's slice along `dim` of a tensor split evenly over
// `group` (rank r holds [r * n, (r + 1) * n) of size(dim) = tp * n). Returns
// local * (the dense tensor's dropout noise, sliced): the noise of
// at::dropout's CPU path (bernoulli_(1 - p) on the whole shape, divided by
// 1 - p). The identity when !training or p == 0; with a group of size 1 it
// is torch::dropout's mask on the CPU. REQUIRES: 0 <= p < 1.
torch::Tensor ShardedDropout(const torch::Tensor& local, double p, bool training, int64_t dim,
                             const ModelParallelGroup& group);

}  // namespace tensor_parallel
}  // namespace pp

#endif  // PIPELINE_TENSOR_PARALLEL_DROPOUT_H_
