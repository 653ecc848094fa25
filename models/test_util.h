// Test helpers for the reference models: build a spec list in one process
// without the pipeline machinery, so model tests do not depend on it.
#ifndef MODELS_TEST_UTIL_H_
#define MODELS_TEST_UTIL_H_

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "pipeline/layer.h"
#include "pipeline/layer_spec.h"

namespace pp {

// All layers of `specs` in order; each tie key's module is built once and
// shared by its positions. Owns the layers. Not thread-safe.
struct LocalModel {
  std::vector<Layer> layers;
  std::vector<Layer> shared;  // one per tie key

  Activations Forward(const MicroBatch& batch) const { return RunLayers(layers, {}, batch); }
  // Every trainable tensor once.
  std::vector<torch::Tensor> Parameters() const;
};

LocalModel BuildLocalModel(const std::vector<LayerSpec>& specs, uint64_t seed);

}  // namespace pp

#endif  // MODELS_TEST_UTIL_H_
