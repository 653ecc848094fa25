#include "topology/host_staged_backend.h"

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/torch_compat.h"

#if PP_C10D_HAS_BACKENDS
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#endif

namespace pp {

#if PP_C10D_HAS_BACKENDS
namespace {

// A contiguous host buffer shaped like `t`: pinned when `t` lives on an
// accelerator (DMA copies; the caching host allocator then keeps a freed
// buffer until the copies queued on it have run).
at::Tensor HostBufferFor(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(!t.is_cpu()));
}

// `t` copied to the host. A blocking copy on the caller's current stream: the
// host waits for the kernels queued on that stream before it (the payload's
// producers, when the caller made that stream wait for them), no others.
at::Tensor StageIn(const at::Tensor& t) {
  at::Tensor host = HostBufferFor(t);
  host.copy_(t, /*non_blocking=*/false);
  return host;
}

std::vector<at::Tensor> StageIn(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> host;
  host.reserve(tensors.size());
  for (const at::Tensor& t : tensors) host.push_back(StageIn(t));
  return host;
}

// The Work of an operation whose results land in host buffers: wait() waits
// for Gloo's Work, then queues the copies into the caller's tensors on the
// caller's current stream.
class StagedWork : public c10d::Work {
 public:
  StagedWork(c10::intrusive_ptr<c10d::Work> inner, std::vector<at::Tensor> host,
             std::vector<at::Tensor> targets, c10d::OpType op)
      : c10d::Work(-1, op),
        inner_(std::move(inner)),
        host_(std::move(host)),
        targets_(std::move(targets)) {}

  bool wait(std::chrono::milliseconds timeout) override {
    if (copied_) return true;
    // Throws on a Gloo error or timeout; false when aborted.
    if (!inner_->wait(timeout)) return false;
    for (size_t i = 0; i < targets_.size(); ++i) {
      targets_[i].copy_(host_[i], /*non_blocking=*/true);
    }
    copied_ = true;
    return true;
  }
  // Complete once Gloo's operation is: the results are in the host buffers,
  // and wait() returns at once, queueing their copies. (Complete only after
  // wait() would leave a caller that polls, as asynchronous vocabulary
  // collectives do to release results early, never seeing it complete.)
  bool isCompleted() override { return copied_ || inner_->isCompleted(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  std::vector<at::Tensor> result() override { return targets_; }
  void abort() override { inner_->abort(); }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::vector<at::Tensor> host_;
  std::vector<at::Tensor> targets_;
  bool copied_ = false;
};

class HostStagedBackend : public c10d::Backend {
 public:
  explicit HostStagedBackend(c10::intrusive_ptr<c10d::Backend> gloo)
      : c10d::Backend(gloo->getRank(), gloo->getSize()), gloo_(std::move(gloo)) {}

  const std::string getBackendName() const override { return kHostStagedBackendName; }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override {
    CheckOne(tensors, "send");
    std::vector<at::Tensor> host = {StageIn(tensors[0])};
    // Gloo's send Work keeps the host buffer alive until the bytes are out.
    return gloo_->send(host, dst_rank, tag);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override {
    CheckOne(tensors, "recv");
    std::vector<at::Tensor> host = {HostBufferFor(tensors[0])};
    c10::intrusive_ptr<c10d::Work> work = gloo_->recv(host, src_rank, tag);
    return c10::make_intrusive<StagedWork>(std::move(work), std::move(host), tensors,
                                           c10d::OpType::RECV);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return InPlace(tensors, c10d::OpType::ALLREDUCE,
                   [&](std::vector<at::Tensor>& host) { return gloo_->allreduce(host, opts); });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return InPlace(tensors, c10d::OpType::BROADCAST,
                   [&](std::vector<at::Tensor>& host) { return gloo_->broadcast(host, opts); });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    std::vector<at::Tensor> host_inputs = StageIn(inputs);
    std::vector<std::vector<at::Tensor>> host_outputs(outputs.size());
    std::vector<at::Tensor> host_flat;
    std::vector<at::Tensor> targets;
    for (size_t i = 0; i < outputs.size(); ++i) {
      for (const at::Tensor& out : outputs[i]) {
        host_outputs[i].push_back(HostBufferFor(out));
        host_flat.push_back(host_outputs[i].back());
        targets.push_back(out);
      }
    }
    c10::intrusive_ptr<c10d::Work> work = gloo_->allgather(host_outputs, host_inputs, opts);
    return c10::make_intrusive<StagedWork>(std::move(work), std::move(host_flat),
                                           std::move(targets), c10d::OpType::ALLGATHER);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return gloo_->barrier(opts);
  }

 private:
  // A collective that works in place: `tensors` staged in, `run` on the host
  // copies, results copied back in wait().
  template <typename Run>
  c10::intrusive_ptr<c10d::Work> InPlace(std::vector<at::Tensor>& tensors, c10d::OpType op,
                                         Run run) {
    std::vector<at::Tensor> host = StageIn(tensors);
    c10::intrusive_ptr<c10d::Work> work = run(host);
    return c10::make_intrusive<StagedWork>(std::move(work), std::move(host), tensors, op);
  }

  void CheckOne(const std::vector<at::Tensor>& tensors, const char* op) const {
    TORCH_CHECK(tensors.size() == 1, kHostStagedBackendName, " ", op, " takes one tensor, got ",
                tensors.size());
  }

  c10::intrusive_ptr<c10d::Backend> gloo_;
};

}  // namespace
#endif  // PP_C10D_HAS_BACKENDS

bool HostStagedBackendAvailable() { return PP_C10D_HAS_BACKENDS != 0; }

absl::Status AddHostStagedBackend(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                  c10::DeviceType device_type) {
#if PP_C10D_HAS_BACKENDS
  c10::intrusive_ptr<c10d::Backend> gloo;
  try {
    gloo = group->getBackend(c10::DeviceType::CPU);
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("ranks sharing a device: the group has no CPU (Gloo) backend to stage ",
                     c10::DeviceTypeName(device_type), " tensors through: ", e.what()));
  }
  group->setBackend(device_type, c10d::ProcessGroup::BackendType::CUSTOM,
                    c10::make_intrusive<HostStagedBackend>(std::move(gloo)));
  return absl::OkStatus();
#else
  (void)group;
  return absl::FailedPreconditionError(absl::StrCat(
      "ranks sharing a device (parallelism.ranks_per_device > 1) need c10d backends, which "
      "LibTorch ",
      torch_compat::LibTorchVersion(), " lacks; build with --config=cuda (LibTorch 2.x) to stage ",
      c10::DeviceTypeName(device_type), " tensors through host buffers"));
#endif
}

}  // namespace pp
