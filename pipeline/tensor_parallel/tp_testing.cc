#include "pipeline/tensor_parallel/tp_testing.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include "absl/strings/str_cat.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace tensor_parallel {

absl::Status RunOnTensorParallelRanks(int tp, bool sequence_parallel,
                                      const std::function<void(const ModelParallelGroup&)>& body) {
  const std::chrono::milliseconds timeout(60000);
  return RunOnThreadRanks(tp, timeout, [&](World& world) -> absl::Status {
    ModelParallelGroup group;
    group.rank = world.rank;
    group.size = world.size;
    group.group = world.group;
    group.sequence_parallel = sequence_parallel;
    group.timeout = timeout;
    group.description = absl::StrCat("tp group of ", world.size, " thread ranks");
    try {
      body(group);
    } catch (const std::exception& e) {
      return absl::InternalError(e.what());
    }
    return absl::OkStatus();
  });
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes(), "MaxAbsDiff: shapes ", a.sizes(), " and ", b.sizes());
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

double RelativeDiff(const torch::Tensor& got, const torch::Tensor& want) {
  return MaxAbsDiff(got, want) / std::max(1e-12, want.abs().max().item<double>());
}

}  // namespace tensor_parallel
}  // namespace pp
