#include "driver/save_on_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "topology/wait_work.h"

namespace pp {
namespace {

volatile sig_atomic_t g_signalled = 0;

void OnTerm(int) {
  if (g_signalled) _exit(128 + SIGTERM);  // the second one: no more patience
  g_signalled = 1;
}

constexpr char kStoppedBySignalPayload[] = "pipe/stopped-by-signal";

}  // namespace

void InstallSaveOnSignal() {
  static const bool installed = [] {
    struct sigaction action {};
    action.sa_handler = OnTerm;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    return ::sigaction(SIGTERM, &action, nullptr) == 0;
  }();
  (void)installed;
}

absl::StatusOr<bool> AnyRankSignalled(const ParallelGrid& grid, const c10::Device& device,
                                      std::chrono::milliseconds timeout) {
  if (grid.world_size() == 1) return g_signalled != 0;
  std::vector<at::Tensor> flag = {
      torch::full({1}, g_signalled ? 1 : 0, torch::TensorOptions(torch::kInt).device(device))};
  PP_RETURN_IF_ERROR(RunCollective("save-on-signal all-reduce", grid.DescribeWorldGroup(), timeout,
                                   [&] { return grid.world_group()->allreduce(flag); }));
  return flag[0].cpu().item<int>() > 0;
}

absl::Status StoppedBySignal(int64_t step, const std::string& saved) {
  absl::Status status = absl::CancelledError(
      absl::StrCat("stopped by SIGTERM after step ", step, " (checkpoint.save_on_signal): saved ",
                   saved, "; resume=auto continues from it"));
  status.SetPayload(kStoppedBySignalPayload, absl::Cord("1"));
  return status;
}

bool IsStoppedBySignal(const absl::Status& status) {
  return status.GetPayload(kStoppedBySignalPayload).has_value();
}

}  // namespace pp
