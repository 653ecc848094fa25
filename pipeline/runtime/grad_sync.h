// Gradient reductions of a pipeline training step, after the schedule ran:
// tied-weight groups (SUM), data parallelism (average), and the global
// gradient norm for clipping (reduced over the pipe and data groups, each tied
// parameter counted once).
//
// Every collective waits at most `timeout`; a failure becomes a Status that
// names the collective and the group. Functions are thread-compatible.
#ifndef PIPELINE_RUNTIME_GRAD_SYNC_H_
#define PIPELINE_RUNTIME_GRAD_SYNC_H_

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeline/pipeline_model.h"
#include "pipeline/tensor_parallel/sharded_module.h"

namespace pp {

// This rank's view of one tie group: the copies of a shared weight held by
// several pipeline stages (GPT's embedding and LM head).
struct TiedParams {
  std::string key;
  // The member ranks of one pipeline (one data-parallel replica); group rank
  // 0 is the lowest stage. Null when only this rank holds the key.
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::string
      members;  // for error messages, e.g. "tie group [0,3] (this rank's peers: global rank 3)"
  // This rank's copies, in the same order on every member.
  std::vector<torch::Tensor> params;
  // True on the lowest member only: the grad norm counts each tied
  // parameter once.
  bool counts_in_norm = true;
};

// Broadcasts every tied parameter from group rank 0, so all copies start
// identical (they then stay identical: equal grads, equal optimizer steps).
absl::Status BroadcastTiedParams(const std::vector<TiedParams>& ties,
                                 std::chrono::milliseconds timeout);

// SUM all-reduce of the tied parameters' gradients within each tie group.
absl::Status AllReduceTiedGrads(const std::vector<TiedParams>& ties,
                                std::chrono::milliseconds timeout);

// Averages `params`' gradients over `data_group` (one flat buffer, one
// all-reduce). Undefined gradients count as zero and become defined.
// No-op for a null group or a group of one.
absl::Status AverageGrads(const std::vector<torch::Tensor>& params,
                          const c10::intrusive_ptr<c10d::ProcessGroup>& data_group,
                          std::chrono::milliseconds timeout);

// The L2 norm of all gradients of the model: the sum of squares of
// `counted_params`' gradients is summed over `pipe_group` and averaged over
// `data_group` (after AverageGrads replicas agree; averaging makes every rank
// use the bit-identical norm). Null groups are skipped. `device` holds the
// reduced scalar (the rank's CUDA device for NCCL).
absl::StatusOr<double> GlobalGradNorm(const std::vector<torch::Tensor>& counted_params,
                                      const c10::intrusive_ptr<c10d::ProcessGroup>& pipe_group,
                                      const c10::intrusive_ptr<c10d::ProcessGroup>& data_group,
                                      std::chrono::milliseconds timeout,
                                      torch::Device device = torch::kCPU);

// The parameters of this stage's chunks that are tensor-parallel shards
// (tensor_parallel::ShardedModule), by global name, with how they split. A
// parameter not named here is whole on every tensor-parallel rank.
std::map<std::string, tensor_parallel::ShardSpec> ModelShardDims(const PipelineModel& model);

// The global norm from this rank's sum of squares: summed over `pipe_group`
// and over `data_group` (a distributed optimizer's slices are disjoint, so
// their squares add up), then the square root. Null groups are skipped.
absl::StatusOr<double> ShardedGradNorm(double local_sum_of_squares,
                                       const c10::intrusive_ptr<c10d::ProcessGroup>& pipe_group,
                                       const c10::intrusive_ptr<c10d::ProcessGroup>& data_group,
                                       std::chrono::milliseconds timeout,
                                       torch::Device device = torch::kCPU);

// max_norm / (norm + 1e-6) when that is < 1 (clip), else 1: what
// ClipGradsToNorm multiplies gradients by.
double ClipCoefficient(double norm, double max_norm);

// Scales all `params`' gradients by max_norm / (norm + 1e-6) when norm >
// max_norm, like torch::nn::utils::clip_grad_norm_.
void ClipGradsToNorm(const std::vector<torch::Tensor>& params, double norm, double max_norm);

}  // namespace pp

#endif  // PIPELINE_RUNTIME_GRAD_SYNC_H_
