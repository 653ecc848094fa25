// Activation checkpointing's core: run a range of layers forward without
// keeping its intermediate activations, and recompute it in backward.
//
// LibTorch's C++ API has no torch.utils.checkpoint; RunLayersWithRecompute is
// ours. It is a custom autograd function whose graph node saves only the
// range's input tensors. In backward it restores the random-number generator
// state the original forward saw (CPU, and CUDA for the devices involved, when
// CUDA is in use), reruns the range with grad enabled, back-propagates through
// it and hands the input and parameter gradients to the autograd engine, which
// accumulates parameter .grad as for an ordinary graph. The generator state of
// the code outside is put back afterwards, so a step with checkpointing
// consumes exactly the random numbers a step without it consumes.
//
// The range's trainable parameters are inputs of the autograd node. That is
// what makes a range whose activation inputs need no gradient (token ids into
// an embedding; DeepSpeed issues #4274/#4479) still produce parameter
// gradients, and it lets a caller that asks torch::autograd::grad for input
// gradients only (zero-bubble's I/W split) skip the weight gradients.
//
// Policies (which ranges to checkpoint) are in activation_checkpointing.h.
#ifndef PIPELINE_AUTOGRAD_RECOMPUTE_H_
#define PIPELINE_AUTOGRAD_RECOMPUTE_H_

#include <vector>

#include <torch/torch.h>

#include "pipeline/layers/layer.h"

namespace pp {

// The parameters `layer`'s forward uses: its registered ones, plus, for a
// TiedLayer (pipeline/layers/layer_spec.h), those of the shared module it holds
// without registering. Each tensor once.
std::vector<torch::Tensor> LayerParameters(const LayerImpl& layer);

// Runs `layers` on `inputs` like RunLayers, as one checkpointed range.
//
// Inputs may mix floating tensors (with or without requires_grad) and integer
// ones (ids, masks); outputs may include integer tensors, which get no
// gradient. `batch`'s side inputs are kept (by reference count) for the
// recompute. When grad mode is off, or neither the inputs nor the layers'
// parameters require grad, this is exactly RunLayers (nothing to recompute).
//
// REQUIRES: the layers are deterministic given the RNG state and inputs, and do
// not update state in forward that the recompute would update twice (a
// BatchNorm's running statistics would be updated twice in training mode, as
// with torch.utils.checkpoint). Layers must not be modified in place between
// forward and backward (parameters are read again at recompute time). Every
// tensor that requires grad and that the layers use must be found by
// LayerParameters or be an input or side input: backward fails loudly (rather
// than dropping its gradient) when the recompute reaches any other leaf.
// Thread-safety: like running the layers. Saving and restoring the generator
// state holds DefaultGeneratorMutex (common/default_generator.h), so it never
// lands inside another thread's seeded layer build; but the default generators
// are process globals, so two threads drawing random numbers (dropout)
// concurrently are nondeterministic with or without checkpointing.
Activations RunLayersWithRecompute(const std::vector<Layer>& layers, Activations inputs,
                                   const MicroBatch& batch);

// The state of the default random-number generators a range may draw from:
// always the CPU one, plus the default CUDA generator of each CUDA device in
// `devices` when this LibTorch has CUDA (a runtime check, so CPU builds need no
// #ifdef). Copyable value; Restore may be called any number of times.
class RngSnapshot {
 public:
  // Captures the current state of the generators for `devices` (CPU always).
  static RngSnapshot Capture(const std::vector<c10::Device>& devices = {});
  // Puts the captured states back into the generators.
  void Restore() const;
  // The devices whose generators were captured: the CPU first, then each
  // accelerator of `devices` this process has (deduplicated).
  const std::vector<c10::Device>& devices() const { return devices_; }

 private:
  struct Entry {
    at::Generator generator;  // The (global) generator, not a copy.
    at::Tensor state;
  };
  std::vector<Entry> entries_;
  std::vector<c10::Device> devices_;
};

// The non-CPU devices of `tensors`, in first-seen order, each once (the
// generators a checkpointed range must save besides the CPU's).
std::vector<c10::Device> AcceleratorDevicesOf(const std::vector<torch::Tensor>& tensors);

}  // namespace pp

#endif  // PIPELINE_AUTOGRAD_RECOMPUTE_H_
