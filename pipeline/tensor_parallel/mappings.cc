#include "pipeline/tensor_parallel/mappings.h"

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "pipeline/tensor_parallel/planted_fault.h"
#include "topology/wait_work.h"

namespace pp {
namespace tensor_parallel {
namespace internal {

std::atomic<PlantedFault>& Fault() {
  static std::atomic<PlantedFault> fault{PlantedFault::kNone};
  return fault;
}

PlantedFault PlantFault(PlantedFault fault) { return Fault().exchange(fault); }
PlantedFault CurrentFault() { return Fault(); }

}  // namespace internal

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Holds a group across an autograd function's forward and backward.
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(ModelParallelGroup g) : group(std::move(g)) {}
  ModelParallelGroup group;
};

void SaveGroup(AutogradContext* ctx, const ModelParallelGroup& group, int64_t dim) {
  ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(group));
  ctx->saved_data["dim"] = dim;
}

const ModelParallelGroup& SavedGroup(AutogradContext* ctx) {
  // The capsule stays alive in saved_data for the whole backward.
  return c10::static_intrusive_pointer_cast<GroupCapsule>(ctx->saved_data["group"].toCapsule())
      ->group;
}

int64_t SavedDim(AutogradContext* ctx) { return ctx->saved_data["dim"].toInt(); }

// Gloo has no bf16 or fp16: such tensors travel as float32, and sums round
// to the tensor's dtype once, after the whole group's sum.
bool IsReducedPrecision(const torch::Tensor& x) {
  return x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kHalf;
}

int64_t NormalDim(const torch::Tensor& x, int64_t dim) {
  TORCH_CHECK(x.dim() > 0, "tensor parallelism needs a tensor of at least one dimension");
  return dim < 0 ? dim + x.dim() : dim;
}

// One autograd function per (forward, backward) pair of collectives.
enum class Op { kIdentity, kAllReduce, kSlice, kAllGather, kReduceScatter };

torch::Tensor Apply(Op op, const torch::Tensor& x, const ModelParallelGroup& group, int64_t dim,
                    const char* what) {
  switch (op) {
    case Op::kIdentity:
      return x;
    case Op::kAllReduce: {
      torch::Tensor y = x.contiguous().clone();
      AllReduceInPlace(y, group, ReduceOp::kSum, what);
      return y;
    }
    case Op::kSlice:
      return LocalSlice(x, group, dim, what).contiguous();
    case Op::kAllGather:
      return AllGather(x, group, dim, what);
    case Op::kReduceScatter:
      return ReduceScatter(x, group, dim, what);
  }
  TORCH_CHECK(false, "unknown tensor-parallel op");
}

template <Op kForward, Op kBackward>
struct Mapping : public torch::autograd::Function<Mapping<kForward, kBackward>> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const ModelParallelGroup& group, int64_t dim, const char* what) {
    SaveGroup(ctx, group, dim);
    ctx->saved_data["what"] = std::string(what);
    return Apply(kForward, x, group, dim, what);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::string what = ctx->saved_data["what"].toStringRef() + " (backward)";
    torch::Tensor grad = grads[0].defined() ? Apply(kBackward, grads[0], SavedGroup(ctx),
                                                    SavedDim(ctx), what.c_str())
                                            : grads[0];
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

template <Op kForward, Op kBackward>
torch::Tensor Run(const torch::Tensor& x, const ModelParallelGroup& group, int64_t dim,
                  const char* what) {
  if (!group.is_parallel()) return x;
  return Mapping<kForward, kBackward>::apply(x, group, NormalDim(x, dim), what);
}

struct ReplicaGroupCopy : public torch::autograd::Function<ReplicaGroupCopy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& param,
                               const ModelParallelGroup& group, int64_t replicas) {
    SaveGroup(ctx, group, /*dim=*/0);
    ctx->saved_data["replicas"] = replicas;
    return param;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const ModelParallelGroup& group = SavedGroup(ctx);
    const int64_t replicas = ctx->saved_data["replicas"].toInt();
    torch::Tensor grad = grads[0];
    if (grad.defined() && internal::Fault() != internal::PlantedFault::kSkipReplicaGradientSum) {
      std::vector<int64_t> shape = {group.size / replicas};
      shape.insert(shape.end(), grad.sizes().begin(), grad.sizes().end());
      torch::Tensor slots = torch::zeros(shape, grad.options());
      slots[group.rank / replicas].copy_(grad);
      AllReduceInPlace(slots, group, ReduceOp::kSum,
                       "the gradient of a slice held by several ranks (backward)");
      grad = slots[group.rank / replicas];
    }
    return {grad, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor CopyToReplicaGroup(const torch::Tensor& param, const ModelParallelGroup& group,
                                 int64_t replicas) {
  TORCH_CHECK(replicas > 0 && group.size % replicas == 0, "a slice held by ", replicas,
              " ranks each does not fit a tensor-parallel group of ", group.size);
  if (replicas == 1) return param;
  return ReplicaGroupCopy::apply(param, group, replicas);
}

torch::Tensor LocalSlice(const torch::Tensor& x, const ModelParallelGroup& group, int64_t dim,
                         const std::string& what) {
  dim = NormalDim(x, dim);
  const int64_t size = x.size(dim);
  TORCH_CHECK(size % group.size == 0, what, ": dimension ", dim, " of a tensor of shape ",
              x.sizes(), " (", size, ") must be a multiple of the tensor-parallel size ",
              group.size);
  const int64_t part = size / group.size;
  const int64_t rank = internal::Fault() == internal::PlantedFault::kWrongSlice
                           ? (group.rank + 1) % group.size
                           : group.rank;
  return x.narrow(dim, rank * part, part);
}

PendingCollective PendingCollective::Done(torch::Tensor result) {
  return PendingCollective(WorkPtr(), "", "", std::chrono::milliseconds(0),
                           [result = std::move(result)] { return result; });
}

PendingCollective::PendingCollective(absl::StatusOr<WorkPtr> work, std::string collective,
                                     std::string group, std::chrono::milliseconds timeout,
                                     std::function<torch::Tensor()> finish)
    : work_(std::move(work)),
      collective_(std::move(collective)),
      group_(std::move(group)),
      timeout_(timeout),
      finish_(std::move(finish)) {}

absl::StatusOr<torch::Tensor> PendingCollective::Wait() {
  absl::StatusOr<WorkPtr> work = std::move(work_);
  std::function<torch::Tensor()> finish = std::move(finish_);
  work_ = WorkPtr();
  finish_ = nullptr;
  if (!work.ok()) return work.status();
  if (*work) PP_RETURN_IF_ERROR(WaitWork(*work, collective_, group_, timeout_));
  return finish ? finish() : torch::Tensor();
}

bool PendingCollective::Completed() const {
  return !work_.ok() || !*work_ || (*work_)->isCompleted();
}

std::shared_ptr<const std::atomic<int64_t>> PendingCollective::TrackCompletion() const {
  if (!work_.ok() || !*work_) return nullptr;
  auto completed_us = std::make_shared<std::atomic<int64_t>>(-1);
  return RecordCompletionTime(*work_, completed_us) ? completed_us : nullptr;
}

namespace {

// Starts `start` on `group` (its exception becomes the Status Wait returns).
PendingCollective Start(const ModelParallelGroup& group, std::string collective,
                        const std::function<WorkPtr()>& start,
                        std::function<torch::Tensor()> finish) {
  absl::StatusOr<WorkPtr> work = StartWork(collective, group.description, group.timeout, start);
  return PendingCollective(std::move(work), std::move(collective), group.description, group.timeout,
                           std::move(finish));
}

// The blocking forms' wait: an autograd function has no Status to return.
torch::Tensor Finish(PendingCollective pending) {
  absl::StatusOr<torch::Tensor> result = pending.Wait();
  TORCH_CHECK(result.ok(), "tensor parallelism: ", result.status().ToString());
  return *std::move(result);
}

}  // namespace

PendingCollective StartAllReduce(torch::Tensor x, const ModelParallelGroup& group, ReduceOp op,
                                 const std::string& what) {
  if (!group.is_parallel()) return PendingCollective::Done(std::move(x));
  if (op == ReduceOp::kSum && internal::Fault() == internal::PlantedFault::kSkipAllReduce) {
    return PendingCollective::Done(std::move(x));
  }
  TORCH_CHECK(x.is_contiguous(), what, ": all-reduce needs a contiguous tensor");
  // Gloo has no bf16/fp16: summed in float32, rounded once when copied back.
  torch::Tensor buffer = IsReducedPrecision(x) ? x.to(torch::kFloat32) : x;
  std::vector<torch::Tensor> tensors = {buffer};
  c10d::AllreduceOptions options;
  options.reduceOp = op == ReduceOp::kSum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  options.timeout = group.timeout;
  return Start(
      group, absl::StrCat("all-reduce of ", what),
      [&] { return group.group->allreduce(tensors, options); },
      [x, buffer]() mutable {
        if (!buffer.is_same(x)) x.copy_(buffer);
        return x;
      });
}

PendingCollective StartBroadcast(torch::Tensor x, const ModelParallelGroup& group, int64_t root,
                                 const std::string& what) {
  if (!group.is_parallel()) return PendingCollective::Done(std::move(x));
  TORCH_CHECK(root >= 0 && root < group.size, what, ": broadcast root ", root, " outside [0, ",
              group.size, ")");
  TORCH_CHECK(x.is_contiguous(), what, ": broadcast needs a contiguous tensor");
  // Gloo has no bf16/fp16; the cast is exact both ways.
  torch::Tensor buffer = IsReducedPrecision(x) ? x.to(torch::kFloat32) : x;
  std::vector<torch::Tensor> tensors = {buffer};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  options.timeout = group.timeout;
  return Start(
      group, absl::StrCat("broadcast of ", what),
      [&] { return group.group->broadcast(tensors, options); },
      [x, buffer]() mutable {
        if (!buffer.is_same(x)) x.copy_(buffer);
        return x;
      });
}

PendingCollective StartAllGather(const torch::Tensor& x, const ModelParallelGroup& group,
                                 int64_t dim, const std::string& what) {
  if (!group.is_parallel()) return PendingCollective::Done(x);
  dim = NormalDim(x, dim);
  const torch::ScalarType dtype = x.scalar_type();
  // Gloo has no bf16/fp16: gathered as float32 (exact), cast back after.
  torch::Tensor input = (IsReducedPrecision(x) ? x.to(torch::kFloat32) : x).contiguous();
  if (internal::Fault() == internal::PlantedFault::kSkipAllGather) {
    return PendingCollective::Done(
        torch::cat(std::vector<torch::Tensor>(group.size, input), dim).to(dtype));
  }
  std::vector<torch::Tensor> inputs = {input};
  auto output = std::make_shared<std::vector<std::vector<torch::Tensor>>>(1);
  for (int64_t r = 0; r < group.size; ++r) (*output)[0].push_back(torch::empty_like(input));
  c10d::AllgatherOptions options;
  options.timeout = group.timeout;
  return Start(
      group, absl::StrCat("all-gather of ", what),
      [&] { return group.group->allgather(*output, inputs, options); },
      [output, input, dim, dtype] { return torch::cat((*output)[0], dim).to(dtype); });
}

void AllReduceInPlace(torch::Tensor& x, const ModelParallelGroup& group, ReduceOp op,
                      const std::string& what) {
  Finish(StartAllReduce(x, group, op, what));
}

void Broadcast(torch::Tensor& x, const ModelParallelGroup& group, int64_t root,
               const std::string& what) {
  Finish(StartBroadcast(x, group, root, what));
}

torch::Tensor AllGather(const torch::Tensor& x, const ModelParallelGroup& group, int64_t dim,
                        const std::string& what) {
  return Finish(StartAllGather(x, group, dim, what));
}

torch::Tensor ReduceScatter(const torch::Tensor& x, const ModelParallelGroup& group, int64_t dim,
                            const std::string& what) {
  if (!group.is_parallel()) return x;
  // Gloo in LibTorch 1.13 and the host-staged backend (ranks sharing a GPU)
  // have no reduce-scatter: an all-reduce and this rank's slice give the same
  // values (the same sums in the same order) for twice the bytes.
  torch::Tensor sum = x.contiguous().clone();
  AllReduceInPlace(sum, group, ReduceOp::kSum, what);
  return LocalSlice(sum, group, dim, what).contiguous();
}

torch::Tensor CopyToTensorParallelRegion(const torch::Tensor& x, const ModelParallelGroup& group) {
  return Run<Op::kIdentity, Op::kAllReduce>(x, group, -1, "the input of a tensor-parallel region");
}

torch::Tensor ReduceFromTensorParallelRegion(const torch::Tensor& x,
                                             const ModelParallelGroup& group) {
  return Run<Op::kAllReduce, Op::kIdentity>(x, group, -1, "the output of a tensor-parallel region");
}

torch::Tensor ScatterToTensorParallelRegion(const torch::Tensor& x,
                                            const ModelParallelGroup& group) {
  return Run<Op::kSlice, Op::kAllGather>(x, group, -1,
                                         "a tensor scattered to tensor-parallel ranks");
}

torch::Tensor GatherFromTensorParallelRegion(const torch::Tensor& x,
                                             const ModelParallelGroup& group) {
  return Run<Op::kAllGather, Op::kSlice>(x, group, -1,
                                         "a tensor gathered from tensor-parallel ranks");
}

torch::Tensor ScatterToSequenceParallelRegion(const torch::Tensor& x,
                                              const ModelParallelGroup& group, int64_t dim) {
  return Run<Op::kSlice, Op::kAllGather>(x, group, dim, "a sequence scattered to its shards");
}

torch::Tensor GatherFromSequenceParallelRegion(const torch::Tensor& x,
                                               const ModelParallelGroup& group, int64_t dim) {
  return Run<Op::kAllGather, Op::kReduceScatter>(x, group, dim,
                                                 "a sequence gathered from its shards");
}

torch::Tensor ReduceScatterToSequenceParallelRegion(const torch::Tensor& x,
                                                    const ModelParallelGroup& group, int64_t dim) {
  return Run<Op::kReduceScatter, Op::kAllGather>(x, group, dim,
                                                 "a sequence reduce-scattered to its shards");
}

}  // namespace tensor_parallel
}  // namespace pp
