// The communication functions of tensor and sequence parallelism, as autograd
// functions whose backward is the conjugate collective (Megatron-core's
// tensor_parallel/mappings.py). Each is a pair:
//
//   function                        forward                 backward
//   CopyToTensorParallelRegion      identity                all-reduce
//   ReduceFromTensorParallelRegion  all-reduce              identity
//   ScatterToTensorParallelRegion   keep this rank's slice  all-gather
//   GatherFromTensorParallelRegion  all-gather              keep this rank's slice
//   ScatterToSequenceParallelRegion keep this rank's slice  all-gather
//   GatherFromSequenceParallelRegion all-gather             reduce-scatter
//   ReduceScatterToSequenceParallelRegion reduce-scatter    all-gather
//   CopyToReplicaGroup              identity                all-reduce over the
//                                                           ranks holding the same slice
//
// "Slice" and "gather" act on one dimension: the last for the tensor-parallel
// ones (hidden or vocabulary columns), `dim` for the sequence-parallel ones
// (pipe's activations are [batch, sequence, hidden]: dim 1). The dimension
// must divide by the group's size; a tensor that does not is refused naming
// both numbers. With a group of size 1 every function is the identity.
//
// Collectives wait at most group.timeout and throw c10::Error naming the
// collective and group.description when they fail (an autograd function has
// no Status to return; the runtime turns the exception into one where a step
// starts). bf16 and fp16 tensors travel and are summed as float32 (Gloo has
// neither; the sum rounds once), and every rank of a group sees the same
// bits. A reduce-scatter is an all-reduce and a slice: Gloo in LibTorch 1.13
// and the host-staged backend of ranks sharing a GPU have no reduce-scatter.
//
// Next: pipeline/tensor_parallel/linear.h (the layers built on these).
#ifndef PIPELINE_TENSOR_PARALLEL_MAPPINGS_H_
#define PIPELINE_TENSOR_PARALLEL_MAPPINGS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "pipeline/layers/layer_context.h"
#include "topology/wait_work.h"

namespace pp {
namespace tensor_parallel {

torch::Tensor CopyToTensorParallelRegion(const torch::Tensor& x, const ModelParallelGroup& group);
torch::Tensor ReduceFromTensorParallelRegion(const torch::Tensor& x,
                                             const ModelParallelGroup& group);
torch::Tensor ScatterToTensorParallelRegion(const torch::Tensor& x,
                                            const ModelParallelGroup& group);
torch::Tensor GatherFromTensorParallelRegion(const torch::Tensor& x,
                                             const ModelParallelGroup& group);

torch::Tensor ScatterToSequenceParallelRegion(const torch::Tensor& x,
                                              const ModelParallelGroup& group, int64_t dim);
torch::Tensor GatherFromSequenceParallelRegion(const torch::Tensor& x,
                                               const ModelParallelGroup& group, int64_t dim);
torch::Tensor ReduceScatterToSequenceParallelRegion(const torch::Tensor& x,
                                                    const ModelParallelGroup& group, int64_t dim);

// A parameter slice held by `replicas` neighbouring ranks (ShardSpec's
// replicas: LLaMA's kv heads at tp > num_kv_heads). Each of them computes
// the part of the slice's gradient that its own outputs need (a kv head's,
// for its own query heads); the backward sums them, so every holder gets the
// whole gradient and the copies stay equal. Carried by one all-reduce over
// the group of tp / replicas slices (zeros where a rank holds none), which
// needs no sub-groups. REQUIRES: replicas divides the group's size.
torch::Tensor CopyToReplicaGroup(const torch::Tensor& param, const ModelParallelGroup& group,
                                 int64_t replicas);

// The plain collectives the functions above are made of (no autograd), for
// the vocabulary-parallel cross-entropy and the runtime's grad reductions.
enum class ReduceOp { kSum, kMax };
// In place on a contiguous tensor.
void AllReduceInPlace(torch::Tensor& x, const ModelParallelGroup& group, ReduceOp op,
                      const std::string& what);
// In place on a contiguous tensor: every rank gets group rank `root`'s `x`
// (the others' `x` give the shape and dtype to receive into).
void Broadcast(torch::Tensor& x, const ModelParallelGroup& group, int64_t root,
               const std::string& what);
// The group's tensors concatenated along `dim`, in group-rank order.
torch::Tensor AllGather(const torch::Tensor& x, const ModelParallelGroup& group, int64_t dim,
                        const std::string& what);

// The same collectives, started without waiting (vocabulary parallelism's
// asynchronous collectives: the runtime computes beside them and waits where
// it first reads the result). Each is the blocking form's path up to its
// wait: the same Gloo operation on the same tensors, so the same bits, and
// the same planted faults (a skipped collective is a PendingCollective with
// nothing to wait for); the blocking forms are Start...().Wait().
//
// A PendingCollective owns what its collective reads and writes (the tensor,
// its float32 copy under bf16/fp16, the all-gather's slots) until Wait, and
// then finishes the result: a reduced-precision tensor's copy back, the
// all-gather's concatenation. Move-only; not thread-safe. Destroyed without
// Wait (a failed step), it waits for nothing: the backend's work keeps its
// tensors and ends by itself (it runs with the group's timeout).
class PendingCollective {
 public:
  // Nothing pending: Wait returns an undefined tensor.
  PendingCollective() = default;
  // Nothing to wait for: Wait returns `result` (a group of one, a planted
  // skip).
  static PendingCollective Done(torch::Tensor result);
  // `work` (or the Status its start failed with) of `collective` on
  // `group`; Wait waits for it at most `timeout`, then returns `finish()`.
  PendingCollective(absl::StatusOr<WorkPtr> work, std::string collective, std::string group,
                    std::chrono::milliseconds timeout, std::function<torch::Tensor()> finish);

  PendingCollective(PendingCollective&&) = default;
  PendingCollective& operator=(PendingCollective&&) = default;
  PendingCollective(const PendingCollective&) = delete;
  PendingCollective& operator=(const PendingCollective&) = delete;

  // The result (all-reduce, broadcast: the tensor given, written in place;
  // all-gather: the concatenation), after at most the group's timeout; a
  // failed or timed-out collective is WaitWork's Status, naming it and the
  // group. Call once: the object is empty afterwards.
  absl::StatusOr<torch::Tensor> Wait();

  // Whether Wait would return without waiting: nothing pending, a failed
  // start (Wait returns its Status), or the backend's work is complete
  // (c10d::Work::isCompleted; a backend that never says so is never
  // complete here, and Wait still waits for it).
  bool Completed() const;

  // Has the backend write the steady_clock microseconds at which the
  // collective completes into the returned cell (RecordCompletionTime; -1
  // until then): how long it was in flight, for traces. Null when there is
  // nothing to track (Done, a failed start, a backend without futures). Call
  // before Wait.
  std::shared_ptr<const std::atomic<int64_t>> TrackCompletion() const;

 private:
  absl::StatusOr<WorkPtr> work_ = WorkPtr();
  std::string collective_;
  std::string group_;
  std::chrono::milliseconds timeout_{0};
  std::function<torch::Tensor()> finish_;
};

// In place on a contiguous tensor, as AllReduceInPlace: Wait returns `x`.
PendingCollective StartAllReduce(torch::Tensor x, const ModelParallelGroup& group, ReduceOp op,
                                 const std::string& what);
// As Broadcast: Wait returns `x`, holding group rank `root`'s values.
PendingCollective StartBroadcast(torch::Tensor x, const ModelParallelGroup& group, int64_t root,
                                 const std::string& what);
// As AllGather: Wait returns the concatenation.
PendingCollective StartAllGather(const torch::Tensor& x, const ModelParallelGroup& group,
                                 int64_t dim, const std::string& what);

// This rank's slice along `dim` of the sum of the group's tensors.
torch::Tensor ReduceScatter(const torch::Tensor& x, const ModelParallelGroup& group, int64_t dim,
                            const std::string& what);
// This rank's slice of `x` along `dim` (a view). REQUIRES: dim divides.
torch::Tensor LocalSlice(const torch::Tensor& x, const ModelParallelGroup& group, int64_t dim,
                         const std::string& what);

}  // namespace tensor_parallel
}  // namespace pp

#endif  // PIPELINE_TENSOR_PARALLEL_MAPPINGS_H_
