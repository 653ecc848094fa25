// What a model costs in memory, in the model's own arithmetic: its
// registration's `memory` (models/registry.h) gives it, and the driver's two
// readers of it (the fit estimate before launch, driver/preflight.h, and the
// per-rank byte planner, driver/memory_budget.h) know no model's formulas.
//
// A model is described as what pipeline stages share out: `num_blocks`
// repeated blocks spread evenly over the virtual stages, a token table (and
// position table) on the first, a final norm and the head on the last, and a
// residual stream of `width` values per token between them.
#ifndef MODELS_MODEL_MEMORY_H_
#define MODELS_MODEL_MEMORY_H_

#include <cstdint>
#include <functional>

namespace pp {

// How a run keeps one block's activations.
struct BlockActivationRun {
  double micro_batch_size = 1;
  double value_bytes = 4;  // 4 fp32, 2 bf16
  int tp = 1;              // tensor-parallel ranks of the model group
  bool sequence_parallel = false;
};

struct ModelMemory {
  int64_t context_length = 0;  // tokens per sample (also a corpus's window)
  int64_t width = 0;           // values per token of the residual stream
  int64_t num_blocks = 0;
  int64_t vocab_size = 260;
  // The head shares the token table (a second copy on the last stage when
  // they are on different ranks); untied: a matrix of its own.
  bool tied_embeddings = true;
  // Widths per token the backward of a recomputed block holds beside its
  // regenerated activations (the gradient of its widest hidden layer).
  double recompute_widths = 4;
  // One block's parameters on one of `tp` tensor-parallel ranks.
  std::function<double(int tp)> block_parameters;
  // The bytes one block keeps per micro-batch for its backward.
  std::function<double(const BlockActivationRun&)> block_activation_bytes;
};

// The pre-LayerNorm transformer block of pipe's reference models (GPT, BERT;
// LLaMA with its SwiGLU as GPT's MLP of the same size): attention of
// `num_heads` heads and an MLP of `mlp_ratio` x width, tensor-parallel the
// Megatron way. Parameters: q, k, v and the projection (4 w^2), the MLP
// (2 r w^2) and the column-parallel biases ((3 + r) w) split over the model
// group; the row-parallel biases and the two norms (6 w) whole. Activations:
// ~(7 + 2r) values per token and width (the inputs of each matrix, norms,
// GELU) plus the attention probabilities (h x t x t per sequence, before and
// after the softmax, fp32 in both precisions); the 7 is measured, the GPT's
// live bytes per block and micro-batch under GPipe (bench/memory_planner.py).
// Under tensor parallelism 4 of the widths stay whole on each rank (the two
// norms' outputs, which the column-parallel layers keep, and their inputs);
// the rest, and the heads' probabilities, split. With sequence parallelism the
// norms' inputs split along the sequence, and the layers keep the
// all-gathered outputs whole. Measured at tp = 2: 5837 and 5427 bytes per
// token against 5888 and 5376 predicted (bench/memory_planner.py --tp).
struct TransformerSizes {
  int64_t context_length = 0;
  int64_t width = 0;
  int64_t num_heads = 1;
  int64_t num_layers = 0;
  int64_t mlp_ratio = 4;
  int64_t vocab_size = 260;  // byte-level models: 256 bytes and 4 special ids
  bool tied_embeddings = true;
};
ModelMemory TransformerMemory(const TransformerSizes& sizes);

}  // namespace pp

#endif  // MODELS_MODEL_MEMORY_H_
