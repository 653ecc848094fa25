// A residual MLP block as a pipe layer, for activation checkpointing's tests
// and benchmark (a deep MLP stack is the simplest model whose activation memory
// dominates its parameter memory). Models proper live in models/.
#ifndef PIPELINE_TESTING_MLP_BLOCK_H_
#define PIPELINE_TESTING_MLP_BLOCK_H_

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "pipeline/layers/layer.h"

namespace pp {

// x + fc2(dropout(gelu(fc1(x)))), fc1: width -> hidden, fc2: hidden -> width.
// Takes and returns one tensor [..., width]. Not thread-safe (a module).
class MlpBlock : public LayerImpl {
 public:
  MlpBlock(int64_t width, int64_t hidden, double dropout);

  Activations Forward(const Activations& inputs, const MicroBatch& batch) override;

 private:
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
};

// `num_blocks` blocks, each initialised from the current default generator.
std::vector<Layer> MakeMlpStack(int64_t num_blocks, int64_t width, int64_t hidden, double dropout);

}  // namespace pp

#endif  // PIPELINE_TESTING_MLP_BLOCK_H_
