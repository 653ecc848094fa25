// The gradients of sequence parallelism's replicated parameters, summed over
// the model group once per step instead of in every backward.
//
// Under sequence parallelism a parameter whole on every rank of a model group
// (a norm's weight and bias, a row-parallel bias, a position table) is applied
// to each rank's slice of the sequence, so each rank's backward computes only
// its slice's part of the gradient. Megatron-core sums these parts over the
// group once per step (finalize_model_grads, the parameters marked
// `sequence_parallel`, one flat buffer); DTensor leaves them Partial until the
// step. pipe does the same: SequenceParallelReplicated (linear.h) records the
// parameter here and adds no autograd node, the parts accumulate over the
// step's micro-batches in the parameter's gradient (its fp32 master's under
// bf16), and the runtime (Trainer, at the step's first tail action, before
// anything reads a gradient) sums them with one all-reduce of one flat buffer
// (SumGrads). Until it is armed (set_deferred), SequenceParallelReplicated
// sums each backward's part itself (CopyToTensorParallelRegion): a model used
// outside a Trainer still gets whole gradients. Arming lasts: once a Trainer
// armed its group, a backward run outside that Trainer's steps leaves the
// gradients partial too (no one sums them).
//
// Thread-safe (the parameters are recorded under a mutex). Not copyable; a
// ModelParallelGroup shares one through a shared_ptr.
//
// Next: pipeline/runtime/trainer.cc (Trainer::SumSequenceParallelGrads).
#ifndef PIPELINE_TENSOR_PARALLEL_SEQUENCE_PARALLEL_GRADS_H_
#define PIPELINE_TENSOR_PARALLEL_SEQUENCE_PARALLEL_GRADS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/base/thread_annotations.h"
#include "pipeline/layers/layer_context.h"

namespace pp {
namespace tensor_parallel {

class SequenceParallelGrads {
 public:
  SequenceParallelGrads() = default;
  SequenceParallelGrads(const SequenceParallelGrads&) = delete;
  SequenceParallelGrads& operator=(const SequenceParallelGrads&) = delete;

  // Armed: SequenceParallelReplicated records its parameter and leaves its
  // gradient partial; whoever arms it must call SumGrads once per step.
  void set_deferred(bool deferred) { deferred_ = deferred; }
  bool deferred() const { return deferred_; }

  // `param`'s gradient is this rank's part (SequenceParallelReplicated, on
  // every forward; recording again is a no-op). Keeps `param` alive.
  void Record(const torch::Tensor& param);
  // Of `params`, those recorded, in `params`' order (every rank of a group
  // lists the same ones in the same order when its ranks ran the same
  // forwards and pass the same `params`).
  std::vector<torch::Tensor> Recorded(const std::vector<torch::Tensor>& params) const;

  // Sums `holders`' gradients over `group` (SUM, in place) with one
  // all-reduce of one flat buffer in their promoted dtype (fp32 for fp32
  // gradients or masters); an undefined gradient counts as zero and becomes
  // defined. No collective for an empty list or a group of one. Throws
  // c10::Error naming the group when the collective fails. Every rank of the
  // group calls it with the same shapes in the same order.
  void SumGrads(const std::vector<torch::Tensor>& holders, const ModelParallelGroup& group);

  // Flat all-reduces SumGrads has issued (tests: one per step, not one per
  // micro-batch).
  int64_t reductions() const { return reductions_; }

 private:
  std::atomic<bool> deferred_{false};
  std::atomic<int64_t> reductions_{0};
  mutable std::mutex mu_;
  std::map<const void*, torch::Tensor> recorded_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tensor_parallel
}  // namespace pp

#endif  // PIPELINE_TENSOR_PARALLEL_SEQUENCE_PARALLEL_GRADS_H_
