// The LayerContext's view of a grid's model (tensor-parallel) axis: the
// group every tensor-parallel layer of this rank communicates on.
//
//   PipelineModelOptions mo;
//   mo.layer_environment.model_parallel = ModelParallelGroupOf(grid, timeout);
#ifndef PIPELINE_RUNTIME_MODEL_PARALLEL_GROUP_H_
#define PIPELINE_RUNTIME_MODEL_PARALLEL_GROUP_H_

#include <chrono>

#include "pipeline/layers/layer_context.h"
#include "topology/parallel_grid.h"

namespace pp {

// This rank's model group, its rank in it and size, described for errors,
// sequence parallel when asked; the default (size 1, no group, no sequence
// parallelism) when the grid's model axis is 1.
ModelParallelGroup ModelParallelGroupOf(const ParallelGrid& grid, std::chrono::milliseconds timeout,
                                        bool sequence_parallel = false);

// This rank's pipe group (its stage among num_stages peers) in the same form:
// vocabulary parallelism splits the vocabulary over it (vocab_layers.h).
// With one stage: size 1, no group.
ModelParallelGroup PipeGroupOf(const ParallelGrid& grid, std::chrono::milliseconds timeout);

// The ranks vocabulary parallelism splits the vocabulary over: this rank's
// replica, pipe x model (the grid's model-parallel group, whose rank is
// stage * tp + tensor rank, so the rows run pipe-major), or PipeGroupOf when
// tp is 1. With one rank: size 1, no group. `sequence_parallel` (tp > 1):
// the body's hidden states are split along the sequence (vocab_layers.h).
ModelParallelGroup VocabularyGroupOf(const ParallelGrid& grid, std::chrono::milliseconds timeout,
                                     bool sequence_parallel = false);

}  // namespace pp

#endif  // PIPELINE_RUNTIME_MODEL_PARALLEL_GROUP_H_
