// Test support for tensor parallelism: ranks as threads of the test process
// with a real Gloo group as their ModelParallelGroup, and seeded builds that
// do not interleave across those threads.
#ifndef PIPELINE_TENSOR_PARALLEL_TP_TESTING_H_
#define PIPELINE_TENSOR_PARALLEL_TP_TESTING_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include <torch/torch.h>

#include "absl/status/status.h"
#include "common/default_generator.h"
#include "gtest/gtest.h"
#include "pipeline/layers/layer_context.h"

namespace pp {
namespace tensor_parallel {

// Runs `body` on `tp` thread ranks; each gets the group of all of them (rank
// = its thread rank), with sequence parallelism as given. The first rank's
// exception or failed status, prefixed with its rank, else OK.
absl::Status RunOnTensorParallelRanks(int tp, bool sequence_parallel,
                                      const std::function<void(const ModelParallelGroup&)>& body);

// `make()` run with the default CPU generator seeded with `seed`, holding the
// generator's lock (the rank threads share it), the generator restored after.
template <typename Fn>
auto Seeded(uint64_t seed, Fn make) {
  std::lock_guard<std::recursive_mutex> lock(DefaultGeneratorMutex());
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  torch::Tensor saved;
  {
    std::lock_guard<std::mutex> g(gen.mutex());
    saved = gen.get_state();
  }
  torch::manual_seed(seed);
  auto result = make();
  std::lock_guard<std::mutex> g(gen.mutex());
  gen.set_state(saved);
  return result;
}

// A non-fatal failure showing `status` when it is not OK (a rank's failed
// check or exception).
inline void ExpectOk(const absl::Status& status) { EXPECT_TRUE(status.ok()) << status; }

// max |a - b| as a double (shapes must match).
double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b);
// MaxAbsDiff(got, want) relative to want's largest magnitude.
double RelativeDiff(const torch::Tensor& got, const torch::Tensor& want);

// A case of a layer test parametrised over sequence parallelism and dtype:
// `tolerance` bounds RelativeDiff of every output and gradient.
struct TpCase {
  bool sequence_parallel;
  torch::Dtype dtype;
  double tolerance;
  std::string name;
};

}  // namespace tensor_parallel
}  // namespace pp

#endif  // PIPELINE_TENSOR_PARALLEL_TP_TESTING_H_
