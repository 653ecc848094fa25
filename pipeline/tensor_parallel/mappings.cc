#include "pipeline/tensor_parallel/mappings.h"

#include <atomic>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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

void Wait(const ModelParallelGroup& group, const std::string& collective,
          const std::function<WorkPtr()>& start) {
  const absl::Status status = RunCollective(collective, group.description, group.timeout, start);
  TORCH_CHECK(status.ok(), "tensor parallelism: ", status.ToString());
}

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

void AllReduceInPlace(torch::Tensor& x, const ModelParallelGroup& group, ReduceOp op,
                      const std::string& what) {
  if (!group.is_parallel()) return;
  if (op == ReduceOp::kSum && internal::Fault() == internal::PlantedFault::kSkipAllReduce) return;
  TORCH_CHECK(x.is_contiguous(), what, ": all-reduce needs a contiguous tensor");
  if (IsReducedPrecision(x)) {
    torch::Tensor wide = x.to(torch::kFloat32);
    AllReduceInPlace(wide, group, op, what);
    x.copy_(wide);
    return;
  }
  std::vector<torch::Tensor> tensors = {x};
  c10d::AllreduceOptions options;
  options.reduceOp = op == ReduceOp::kSum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  options.timeout = group.timeout;
  Wait(group, absl::StrCat("all-reduce of ", what),
       [&] { return group.group->allreduce(tensors, options); });
}

void Broadcast(torch::Tensor& x, const ModelParallelGroup& group, int64_t root,
               const std::string& what) {
  if (!group.is_parallel()) return;
  TORCH_CHECK(root >= 0 && root < group.size, what, ": broadcast root ", root, " outside [0, ",
              group.size, ")");
  TORCH_CHECK(x.is_contiguous(), what, ": broadcast needs a contiguous tensor");
  if (IsReducedPrecision(x)) {  // Gloo has no bf16/fp16; the cast is exact both ways
    torch::Tensor wide = x.to(torch::kFloat32);
    Broadcast(wide, group, root, what);
    x.copy_(wide);
    return;
  }
  std::vector<torch::Tensor> tensors = {x};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  options.timeout = group.timeout;
  Wait(group, absl::StrCat("broadcast of ", what),
       [&] { return group.group->broadcast(tensors, options); });
}

torch::Tensor AllGather(const torch::Tensor& x, const ModelParallelGroup& group, int64_t dim,
                        const std::string& what) {
  if (!group.is_parallel()) return x;
  dim = NormalDim(x, dim);
  if (IsReducedPrecision(x)) {
    return AllGather(x.to(torch::kFloat32), group, dim, what).to(x.scalar_type());
  }
  if (internal::Fault() == internal::PlantedFault::kSkipAllGather) {
    return torch::cat(std::vector<torch::Tensor>(group.size, x), dim);
  }
  std::vector<torch::Tensor> input = {x.contiguous()};
  std::vector<std::vector<torch::Tensor>> output(1);
  for (int64_t r = 0; r < group.size; ++r) output[0].push_back(torch::empty_like(input[0]));
  c10d::AllgatherOptions options;
  options.timeout = group.timeout;
  Wait(group, absl::StrCat("all-gather of ", what),
       [&] { return group.group->allgather(output, input, options); });
  return torch::cat(output[0], dim);
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
