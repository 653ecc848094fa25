// Adding a model from your own package (examples/README.md, "Adding a model"): a
// small autoencoder whose decoder reuses the encoder's weight (transposed),
// written as LayerSpecs, with its own loss and MicroBatchSource. Nothing in
// pipe knows it; PipelineModel cuts it into stages and the Trainer keeps the
// tied weight identical on the stages that hold it.
//
//   encoder  x[., kFeatures] -> h = x W^T         (Linear, no bias; tie "code")
//   blocks   h -> h + tanh(Linear(h))             (`blocks` of them)
//   decoder  h -> h W                             (the encoder's W, tied)
//   loss     mean squared error against the input
//
// Data: x = z B + noise, z drawn per (step, index) and B fixed, so x lies
// near a kCode-dimensional subspace the autoencoder can learn.
#ifndef EXAMPLES_CUSTOM_MODEL_TIED_AUTOENCODER_H_
#define EXAMPLES_CUSTOM_MODEL_TIED_AUTOENCODER_H_

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "pipeline/layers/layer.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/runtime/micro_batch_source.h"

namespace custom_model {

constexpr int64_t kFeatures = 16;
constexpr int64_t kCode = 4;

// encoder, `blocks` residual blocks, decoder: blocks + 2 layers.
std::vector<pp::LayerSpec> TiedAutoencoderSpecs(int blocks);

// Mean squared error of the decoder's output against batch "target".
torch::Tensor ReconstructionLoss(const pp::Activations& outputs, const pp::MicroBatch& batch);

// `rows` samples per micro-batch; deterministic in (seed, stream, step,
// index), as every rank reads the micro-batches it needs itself. `seed` picks
// the subspace, `stream` the samples (e.g. 0 training, 1 evaluation).
class LowRankSource : public pp::MicroBatchSource {
 public:
  LowRankSource(int64_t rows, uint64_t seed, uint64_t stream = 0);
  absl::StatusOr<pp::MicroBatchData> Get(int64_t step, int64_t index) override;

 private:
  int64_t rows_;
  uint64_t seed_;
  uint64_t stream_;
  torch::Tensor basis_;  // [kCode, kFeatures]
};

}  // namespace custom_model

#endif  // EXAMPLES_CUSTOM_MODEL_TIED_AUTOENCODER_H_
