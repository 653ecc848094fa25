#include "models/model_memory.h"

#include <algorithm>

namespace pp {
namespace {

constexpr double kFp32 = 4;

double Clamp1(double x) { return std::max(1.0, x); }

}  // namespace

ModelMemory TransformerMemory(const TransformerSizes& sizes) {
  ModelMemory m;
  m.context_length = sizes.context_length;
  m.width = sizes.width;
  m.num_blocks = sizes.num_layers;
  m.vocab_size = sizes.vocab_size;
  m.tied_embeddings = sizes.tied_embeddings;
  m.recompute_widths = Clamp1(sizes.mlp_ratio);
  const double t = Clamp1(sizes.context_length), w = Clamp1(sizes.width);
  const double h = Clamp1(sizes.num_heads), r = Clamp1(sizes.mlp_ratio);
  m.block_parameters = [w, r](int tp) {
    const double n = std::max(1, tp);
    return ((4 + 2 * r) * w * w + (3 + r) * w) / n + 6 * w;
  };
  m.block_activation_bytes = [t, w, h, r](const BlockActivationRun& run) {
    const double n = std::max(1, run.tp);
    const double whole = run.sequence_parallel && n > 1 ? 2 : 4;
    const double widths = whole + (7 + 2 * r - whole) / n;
    return Clamp1(run.micro_batch_size) * t *
           (widths * w * run.value_bytes + 2 * h * t * kFp32 / n);
  };
  return m;
}

}  // namespace pp
