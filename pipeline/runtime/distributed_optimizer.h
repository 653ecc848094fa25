// A distributed optimizer over the data-parallel group: Megatron-core's
// DistributedOptimizer, DeepSpeed's ZeRO stage 1. Each data-parallel rank
// owns a 1/dp slice of every gradient bucket of its stage and keeps the
// optimizer's state (fp32 master values and AdamW's two moments, or SGD's
// momentum) for that slice only.
//
//   auto dist = DistributedOptimizer::Create(groups, data_group, "data group [0,2]", options);
//   dist->ZeroGrad();
//   ... backward; tied gradients all-reduced ...
//   dist->StageDone(s);          // a stage's last backward ran: start what it finalised
//   for (int g ...) dist->StartReduceScatter(g);   // the rest (after REDUCE_TIED)
//   dist->FinishReduceScatter();                    // this rank's slice, averaged over dp
//   double norm2 = dist->LocalSquaredNorm();        // + reductions: GlobalGradNorm's job
//   dist->ScaleGrads(coef);                         // clipping
//   dist->Step();                                   // update the slice, all-gather the params
//
// Layout: the parameters of each group (one virtual stage's, in the order
// given) are cut into buckets of at most `bucket_numel` elements (a larger
// parameter is a bucket of its own); a bucket is padded to a multiple of dp
// and data-parallel rank r owns elements [r, r + 1) * padded / dp of it, as
// in Megatron-core (contiguous per bucket, so a reduce-scatter of the bucket
// lands each rank's slice directly). Padding elements have zero gradients
// and stay zero.
//
// Gradients: a bucket's gradients (the holders' .grad, fp32) are flattened
// into a transient buffer and reduce-scattered (SUM, then / dp) into the
// slice's gradient. The backend decides how (reduce_scatter_method()):
// c10d's reduce_scatter where the backend has it (NCCL; Gloo from LibTorch
// 2.x), else one rooted reduce per owner (Gloo in LibTorch 1.13: the same
// bytes as a reduce-scatter), else an all-reduce of which each rank keeps its
// slice (the host-staged backend of ranks sharing a GPU: all-reduce's bytes,
// the optimizer state still sharded).
//
// Parameters: after the slice's update, its values in the training dtype are
// all-gathered per bucket and copied into the model's parameters. The
// optimizer's arithmetic is elementwise (AdamW, SGD), so the update of an
// element does not depend on which rank owns it: with the same reduced
// gradient it is the unsharded update.
//
// Every collective waits at most `timeout`; a failure is a Status naming it
// and the group. Every data-parallel rank calls every method in the same
// order. Not thread-safe.
#ifndef PIPELINE_RUNTIME_DISTRIBUTED_OPTIMIZER_H_
#define PIPELINE_RUNTIME_DISTRIBUTED_OPTIMIZER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeline/runtime/optimizer.h"
#include "topology/wait_work.h"

namespace pp {

// Megatron-core's default bucket (40M elements).
inline constexpr int64_t kDefaultBucketNumel = 40'000'000;

struct DistributedOptimizerOptions {
  OptimizerConfig optimizer;
  // Testing only: a bug the equivalence tests must catch.
  enum class PlantedFault {
    kNone,
    // The first bucket's gradients are summed twice (as if its reduction ran
    // twice): twice the average.
    kBucketReducedTwice,
    // Data-parallel rank 1 leaves its slice of the first bucket out of the
    // gradient norm.
    kSliceLeftOutOfNorm,
  };
  PlantedFault planted_fault = PlantedFault::kNone;
  // Elements per gradient bucket (>= 1).
  int64_t bucket_numel = kDefaultBucketNumel;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// One parameter as the distributed optimizer sees it.
struct ShardedParam {
  // fp32, same shape as the parameter: its .grad holds the accumulated (and
  // tie-reduced) gradient, and at Create its value is the fp32 value the
  // slice's master starts from. Under fp32 training it is the model's
  // parameter; under bf16 the parameter's fp32 master (mixed_precision.h).
  torch::Tensor holder;
  // The model's parameter (training dtype) the updated values are gathered
  // into; may be `holder` itself.
  torch::Tensor param;
  // Counted in the gradient norm (false for a tied copy another stage owns,
  // or a parameter another tensor-parallel rank counts).
  bool counts_in_norm = true;
  // The local virtual stages whose backward passes write its gradient: once
  // StageDone has been told of all of them, its bucket may start early.
  // Empty: only its group's StartReduceScatter starts it (the Trainer leaves
  // it empty for a parameter whole on every tensor rank under sequence
  // parallelism, whose gradient is summed over the model group in the tail).
  std::vector<int> writer_stages;
  // Its gradient is summed with copies on other ranks (REDUCE_TIED) before
  // it is final: never started early.
  bool tied_across_ranks = false;
};

class DistributedOptimizer {
 public:
  // `groups[g]`: the parameters reduced together (each parameter in one
  // group, once). `data_group` may be null or of size 1 (then the slice is
  // everything and no collective runs). `group_description` names the group
  // in errors. The optimizer config must be valid (ValidateOptimizerConfig).
  // InvalidArgument for a bad bucket size or a non-fp32 holder. Collective
  // over the data group (probes which reduce-scatter the backend has).
  static absl::StatusOr<std::unique_ptr<DistributedOptimizer>> Create(
      std::vector<std::vector<ShardedParam>> groups,
      c10::intrusive_ptr<c10d::ProcessGroup> data_group, std::string group_description,
      DistributedOptimizerOptions options);

  // Resets every holder's gradient (undefined, as zero_grad does) and the
  // slices' gradients.
  void ZeroGrad();
  // Starts the reduce-scatter of group `group`'s buckets not started yet
  // (their holders' gradients must be final). Undefined gradients count as
  // zero.
  absl::Status StartReduceScatter(int group);
  // Every backward pass of local virtual stage `stage` in this step has run:
  // starts each bucket whose parameters' writer stages are all done and
  // none of which is tied across ranks, so its reduce-scatter overlaps the
  // rest of the schedule. Every data-parallel rank runs the same program, so
  // they start buckets in the same order.
  absl::Status StageDone(int stage);
  // Waits for every started reduce-scatter; the slices' gradients are then
  // the data-parallel average. A group never started is an Internal error.
  absl::Status FinishReduceScatter();
  // Sum of squares of this rank's slices' gradients over the elements of
  // counted parameters (each element on exactly one data-parallel rank).
  double LocalSquaredNorm() const;
  // Multiplies the slices' gradients by `coef` (clipping).
  void ScaleGrads(double coef);
  void SetLearningRate(double lr);
  // Steps the optimizer on the slices and all-gathers the updated values
  // into the parameters.
  absl::Status Step();

  // Checkpoints. The whole state, as an unsharded optimizer over `values`
  // would hold it: `values` (one fp32 tensor per parameter, in the groups'
  // order) receive the masters, `full` (MakeOptimizer over `values`) the
  // optimizer state. Collective (all-gathers).
  absl::Status GatherFullState(const std::vector<torch::Tensor>& values,
                               torch::optim::Optimizer& full);
  // The reverse: this rank's slices (masters and state) from the whole
  // values and an optimizer over them (as loaded from a checkpoint; a
  // parameter without state leaves its bucket without state only if no
  // parameter of the bucket has any), and the parameters from the values.
  // Not collective.
  absl::Status ScatterFullState(const std::vector<torch::Tensor>& values,
                                torch::optim::Optimizer& full);
  // The unsharded state, for checkpoints and tests: one fp32 value per
  // parameter (params() order) and an unsharded optimizer over them.
  struct WholeState {
    std::vector<torch::Tensor> values;
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    std::unordered_map<const void*, size_t> index;  // model parameter -> values
    // The value standing for model parameter `param` (undefined if none).
    torch::Tensor ValueOf(const torch::Tensor& param) const;
  };
  // Zero values on the parameters' devices, no optimizer state (to load into).
  WholeState NewWholeState() const;
  // GatherFullState into a NewWholeState(). Collective.
  absl::StatusOr<WholeState> GatherWholeState();
  // The same with the masters only (its optimizer holds no state): what a
  // checkpoint of per-rank state parts (LocalOwnedState) writes as the
  // model's files. Collective.
  absl::StatusOr<WholeState> GatherWholeValues();
  // ScatterFullState from `state`. Not collective.
  absl::Status ScatterWholeState(const WholeState& state) {
    return ScatterFullState(state.values, *state.optimizer);
  }

  // Checkpoints written per rank (Megatron's sharded distributed-optimizer
  // checkpoint): this rank's own part of each parameter, without any
  // collective. parts[i] is the range [offset, offset + value.numel()) of
  // parameter i's flattened elements that this rank owns, `value` its fp32
  // master values (1-D; undefined if the rank owns none of it), and
  // `optimizer` (MakeOptimizer over the defined values) their state, as an
  // unsharded optimizer holds it (AdamW's step included).
  struct OwnedPart {
    int64_t offset = 0;
    torch::Tensor value;
  };
  struct OwnedState {
    std::vector<OwnedPart> parts;  // params() order
    std::unique_ptr<torch::optim::Optimizer> optimizer;
  };
  absl::StatusOr<OwnedState> LocalOwnedState() const;

  // The parameters (holder, param) in the groups' order, each once.
  const std::vector<ShardedParam>& params() const { return params_; }

  // Bytes of this rank's optimizer state: the slices' fp32 masters (unless
  // they are views of fp32 parameters) and the optimizer's state tensors,
  // from their storage (measured, not derived).
  int64_t StateBytes() const;
  // Elements this rank owns (padding included) and in all buckets.
  int64_t shard_numel() const;
  int64_t total_numel() const;
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Buckets whose reduce-scatter has started this step.
  int started_buckets() const;
  // "reduce_scatter", "reduce per owner" or "all-reduce, own slice kept".
  const std::string& reduce_scatter_method() const { return method_name_; }

  // When a bucket's gradient reduction ran this step, in steady_clock
  // microseconds (ActionTiming's clock): from posting its collectives to
  // the last one's completion as the backend's thread reports it (c10d's
  // Work future), so an early reduction's window shows how much of it
  // overlapped the rank's remaining compute; a backend without futures
  // reports the end of the wait for it instead (`end_at_wait`). `bucket`
  // counts within its group. Read after the step (FinishReduceScatter and
  // whatever followed): the backend's callbacks run just after its waits
  // return. Empty at dp 1.
  struct ReductionWindow {
    int group = 0;
    int bucket = 0;
    int64_t start_us = 0;
    int64_t end_us = 0;
    bool end_at_wait = false;
  };
  std::vector<ReductionWindow> ReductionWindows() const;
  torch::optim::Optimizer& shard_optimizer() { return *optimizer_; }

 private:
  enum class Method { kReduceScatter, kReducePerOwner, kAllReduce };
  struct Bucket {
    int group = 0;
    std::vector<int> params;       // into params_
    std::vector<int64_t> offsets;  // of each parameter in the bucket
    int64_t numel = 0;
    int64_t padded = 0;
    int64_t shard = 0;     // padded / dp
    torch::Tensor master;  // fp32 [shard]: the optimizer's parameter
    // (start, length) within the slice of counted parameters' elements.
    std::vector<std::pair<int64_t, int64_t>> counted;
    torch::Tensor flat;   // in flight: the flattened gradients (or the slice they reduce into)
    torch::Tensor input;  // in flight: kept alive until the reduction is waited for
    std::vector<WorkPtr> works;
    // This step's reduction window (ReductionWindow): completion_us is -1
    // until the backend reports a completion, written from its thread (a
    // Work's wait() may return before its future's callbacks ran, so it is
    // read when the windows are, after the step); waited_us is when the
    // wait for it returned.
    int64_t start_us = -1;
    std::shared_ptr<std::atomic<int64_t>> completion_us;
    int64_t waited_us = -1;
    bool end_at_wait = false;
    // fp32 training: the parameters are views of one buffer and `master`
    // is this rank's part of it (no copy).
    bool in_place = false;
    bool deferred = false;  // holds a parameter tied across ranks
    bool started = false;   // this step
  };

  DistributedOptimizer() = default;
  absl::Status Probe();
  absl::Status WaitBucket(Bucket& bucket);
  // GatherFullState, with the optimizer's state or the masters only.
  absl::Status Gather(const std::vector<torch::Tensor>& values, torch::optim::Optimizer& full,
                      bool with_state);
  absl::Status StartBucket(Bucket& bucket);
  // Element range [begin, end) of the bucket this rank owns.
  int64_t SliceBegin(const Bucket& bucket) const { return bucket.shard * rank_; }
  absl::Status AllGather(const torch::Tensor& slice, torch::Tensor& full, const std::string& what);

  std::vector<ShardedParam> params_;
  std::vector<Bucket> buckets_;
  int num_groups_ = 0;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::string group_description_;
  int rank_ = 0;
  int size_ = 1;
  DistributedOptimizerOptions options_;
  Method method_ = Method::kReduceScatter;
  std::string method_name_ = "none (one rank)";
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<bool> started_;  // per group, this step
  std::set<int> done_stages_;  // this step
};

}  // namespace pp

#endif  // PIPELINE_RUNTIME_DISTRIBUTED_OPTIMIZER_H_
