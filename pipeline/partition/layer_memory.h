// Per-layer memory, measured once with LibTorch: each layer's parameter bytes
// and the bytes one forward on a sample micro-batch leaves allocated (what
// autograd saves for the backward plus the layer's outputs), for the memory
// planner (pipeline/schedule/analysis/memory_plan.h) and the `profile` partitioner's
// memory cap.
//
// How: the layers run one at a time, as `profile` runs them, each on the
// previous layer's detached output, under a c10 memory-reporting hook (the
// mechanism behind the PyTorch profiler's profile_memory: the CPU allocator
// and the CUDA caching allocator report every allocation and free of this
// thread and of the intra-op threads it starts). The bytes still allocated
// when the forward returns, with its outputs and autograd graph alive, are
// what one micro-batch keeps until its backward; the peak during the forward
// is recorded too. Results are cached per process, keyed by the layer names,
// the sample shapes and dtypes, and the seed.
//
// Tied layers: every position counts the shared module's parameters (each
// stage that holds a tied position holds a copy).
#ifndef PIPELINE_PARTITION_LAYER_MEMORY_H_
#define PIPELINE_PARTITION_LAYER_MEMORY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeline/layers/layer.h"
#include "pipeline/layers/layer_spec.h"

namespace pp {

struct LayerMemory {
  int64_t parameter_bytes = 0;
  int64_t activation_bytes = 0;    // allocated by the forward, still held after it
  int64_t output_bytes = 0;        // of which the outputs (the boundary message)
  int64_t forward_peak_bytes = 0;  // peak allocated during the forward
};

// Measures every layer of `specs` (see the file comment). InvalidArgument when
// both sample_inputs and sample_batch are empty or a layer's forward throws
// (naming the layer).
absl::StatusOr<std::vector<LayerMemory>> MeasureLayerMemory(const std::vector<LayerSpec>& specs,
                                                            const Activations& sample_inputs,
                                                            const MicroBatch& sample_batch,
                                                            uint64_t base_seed);

namespace internal_partition {

// Builds layer i of `specs` seeded as the real one (base_seed + i; a tied
// position reuses the module built for its key's first position, kept in
// `shared`).
Layer BuildForProfiling(const std::vector<LayerSpec>& specs, size_t i, uint64_t base_seed,
                        const std::map<std::string, std::vector<int64_t>>& tie_positions,
                        std::map<std::string, Layer>* shared);

// Outputs detached, floating-point ones requiring grad: the next layer's inputs.
Activations DetachForNextLayer(const Activations& outputs);

}  // namespace internal_partition
}  // namespace pp

#endif  // PIPELINE_PARTITION_LAYER_MEMORY_H_
