#include "pipeline/testing/mlp_block.h"

#include <memory>

namespace pp {

MlpBlock::MlpBlock(int64_t width, int64_t hidden, double dropout) : LayerImpl("MlpBlock") {
  fc1_ = register_module("fc1", torch::nn::Linear(width, hidden));
  fc2_ = register_module("fc2", torch::nn::Linear(hidden, width));
  dropout_ = register_module("dropout", torch::nn::Dropout(dropout));
}

Activations MlpBlock::Forward(const Activations& inputs, const MicroBatch& batch) {
  TORCH_CHECK(inputs.size() == 1, "MlpBlock takes one tensor but received ", inputs.size());
  const torch::Tensor& x = inputs[0];
  return {x + fc2_(dropout_(torch::gelu(fc1_(x))))};
}

std::vector<Layer> MakeMlpStack(int64_t num_blocks, int64_t width, int64_t hidden, double dropout) {
  std::vector<Layer> layers;
  layers.reserve(num_blocks);
  for (int64_t i = 0; i < num_blocks; ++i) {
    layers.push_back(std::make_shared<MlpBlock>(width, hidden, dropout));
  }
  return layers;
}

}  // namespace pp
