// A model under vocabulary parallelism (issue #40): its token embedding table
// and its output projection leave the pipeline's stages and are split by rows
// over every pipeline rank (pipeline/runtime/vocab_layers.h runs them; the
// schedule places their passes: pipeline/schedule/ir/vocab_passes.h). The stages
// keep everything else. A model that supports it describes the split:
//
//   VocabularySplit split;
//   split.dense = specs;                       // what ToSequential() trains
//   split.body = ...;                          // the stages' layers
//   split.embedding_table = [](LayerImpl& l) { return ...->weight; };
//
// The tables start as the dense model's: every rank builds the dense layer
// that holds a table (seeded as the dense model builds it) and keeps its rows.
#ifndef PIPELINE_LAYERS_VOCAB_SPLIT_H_
#define PIPELINE_LAYERS_VOCAB_SPLIT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pipeline/layers/layer.h"
#include "pipeline/layers/layer_spec.h"

namespace pp {

struct VocabularySplit {
  // The dense model: the reference, and where the tables' values come from.
  std::vector<LayerSpec> dense;
  // The stages' layers: `dense` without the tables. Layer 0 takes the sum of
  // the token embeddings [.., D] as its one input (instead of the token ids);
  // the last returns the hidden states [.., D] the head reads. Layer i is
  // seeded as dense layer i, so a layer that keeps part of a dense one (GPT's
  // positions) draws it as the dense one does.
  std::vector<LayerSpec> body;
  // The embedding table [vocab, D] inside the built dense layer
  // `embedding_layer` (for a tied spec: its key's shared module, built at the
  // key's first position).
  int64_t embedding_layer = 0;
  std::function<torch::Tensor(LayerImpl&)> embedding_table;
  // An untied head: its table [vocab, D] (logits = hidden @ table^T) inside
  // dense layer `head_layer`. Null: the head is the embedding table (tied).
  int64_t head_layer = -1;
  std::function<torch::Tensor(LayerImpl&)> head_table;
  // Global names in the dense model (checkpoints and comparisons): the
  // tables', and a body parameter's (null: the same name).
  std::string embedding_name;
  std::string head_name;
  std::function<std::string(const std::string&)> dense_name;

  bool tied() const { return !head_table; }
  std::string DenseName(const std::string& body_name) const {
    return dense_name ? dense_name(body_name) : body_name;
  }
};

}  // namespace pp

#endif  // PIPELINE_LAYERS_VOCAB_SPLIT_H_
