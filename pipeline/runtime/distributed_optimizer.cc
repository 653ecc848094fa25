#include "pipeline/runtime/distributed_optimizer.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/torch_compat.h"
#include "common/torch_status.h"

namespace pp {
namespace {

// [begin, end) ∩ [lo, hi) as (start, length), length 0 when disjoint.
std::pair<int64_t, int64_t> Overlap(int64_t begin, int64_t end, int64_t lo, int64_t hi) {
  const int64_t start = std::max(begin, lo);
  const int64_t stop = std::min(end, hi);
  return {start, std::max<int64_t>(0, stop - start)};
}

bool SameTensor(const torch::Tensor& a, const torch::Tensor& b) {
  return a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl();
}

// The optimizer's state tensors of one parameter, by name; `step` apart.
struct SliceState {
  bool present = false;
  int64_t step = 0;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
};

SliceState StateOf(const torch::optim::Optimizer& optimizer, const torch::Tensor& param) {
  SliceState out;
  auto it = optimizer.state().find(torch_compat::OptimizerStateKeyOf(param));
  if (it == optimizer.state().end()) return out;
  const torch::optim::OptimizerParamState* state = it->second.get();
  if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
    out.present = true;
    out.step = s->step();
    out.tensors = {{"exp_avg", s->exp_avg()}, {"exp_avg_sq", s->exp_avg_sq()}};
  } else if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
    out.present = s->momentum_buffer().defined();
    if (out.present) out.tensors = {{"momentum_buffer", s->momentum_buffer()}};
  }
  return out;
}

void SetState(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
              const SliceState& state) {
  std::unique_ptr<torch::optim::OptimizerParamState> out;
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr) {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(state.step).exp_avg(state.tensors.at(0).second).exp_avg_sq(state.tensors.at(1).second);
    out = std::move(s);
  } else {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(state.tensors.at(0).second);
    out = std::move(s);
  }
  optimizer.state()[torch_compat::OptimizerStateKeyOf(param)] = std::move(out);
}

// The state tensors' names of `config`'s optimizer, in StateOf's order.
std::vector<std::string> StateNames(const OptimizerConfig& config) {
  if (config.name == "adamw") return {"exp_avg", "exp_avg_sq"};
  if (config.momentum != 0) return {"momentum_buffer"};
  return {};
}

}  // namespace

absl::StatusOr<std::unique_ptr<DistributedOptimizer>> DistributedOptimizer::Create(
    std::vector<std::vector<ShardedParam>> groups,
    c10::intrusive_ptr<c10d::ProcessGroup> data_group, std::string group_description,
    DistributedOptimizerOptions options) {
  if (options.bucket_numel < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed optimizer bucket size (", options.bucket_numel, " elements) must be >= 1"));
  }
  PP_RETURN_IF_ERROR(ValidateOptimizerConfig(options.optimizer));
  std::unique_ptr<DistributedOptimizer> d(new DistributedOptimizer());
  d->options_ = options;
  d->group_ = std::move(data_group);
  d->group_description_ = std::move(group_description);
  if (d->group_) {
    d->rank_ = d->group_->getRank();
    d->size_ = d->group_->getSize();
  }
  d->num_groups_ = static_cast<int>(groups.size());
  torch::NoGradGuard no_grad;
  std::set<const void*> seen;
  for (int g = 0; g < d->num_groups_; ++g) {
    Bucket bucket;
    bucket.group = g;
    auto close = [&] {
      if (bucket.params.empty()) return;
      d->buckets_.push_back(std::move(bucket));
      bucket = Bucket();
      bucket.group = g;
    };
    for (ShardedParam& p : groups[g]) {
      if (!p.holder.defined() || !p.param.defined()) {
        return absl::InvalidArgumentError("distributed optimizer: an undefined parameter");
      }
      if (p.holder.scalar_type() != torch::kFloat || !p.holder.sizes().equals(p.param.sizes())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "distributed optimizer: a parameter's holder must be fp32 and of its shape; got ",
            c10::toString(p.holder.scalar_type()), " ", c10::str(p.holder.sizes()), " for ",
            c10::str(p.param.sizes())));
      }
      if (!seen.insert(p.param.unsafeGetTensorImpl()).second) {
        return absl::InvalidArgumentError(
            "distributed optimizer: a parameter is listed twice (each belongs to one group)");
      }
      const int64_t n = p.param.numel();
      // A tied parameter waits for REDUCE_TIED: its own buckets, so that it
      // holds no other parameter back.
      if (!bucket.params.empty() &&
          (bucket.numel + n > options.bucket_numel || bucket.deferred != p.tied_across_ranks)) {
        close();
      }
      bucket.deferred = p.tied_across_ranks;
      bucket.params.push_back(static_cast<int>(d->params_.size()));
      bucket.offsets.push_back(bucket.numel);
      bucket.numel += n;
      d->params_.push_back(std::move(p));
    }
    close();
  }
  std::vector<torch::Tensor> masters;
  PP_RETURN_IF_ERROR(TorchCall("laying out the distributed optimizer's slices", [&] {
    for (Bucket& b : d->buckets_) {
      b.padded = (b.numel + d->size_ - 1) / d->size_ * d->size_;
      b.shard = b.padded / d->size_;
      const int64_t begin = d->SliceBegin(b);
      const ShardedParam& first = d->params_[b.params.front()];
      const auto fp32 = torch::dtype(torch::kFloat).device(first.holder.device());
      b.in_place = true;
      for (int i : b.params) b.in_place &= SameTensor(d->params_[i].holder, d->params_[i].param);
      if (b.in_place) {
        // fp32 training: the parameters become views of one buffer per
        // bucket and the slice's master is this rank's part of it, so the
        // masters cost nothing beyond the parameters.
        torch::Tensor buffer = torch::zeros({b.padded}, fp32);
        for (size_t k = 0; k < b.params.size(); ++k) {
          torch::Tensor param = d->params_[b.params[k]].param;
          const int64_t n = param.numel();
          torch::Tensor view = buffer.narrow(0, b.offsets[k], n).view(param.sizes());
          view.copy_(param.detach());
          param.set_data(view);
        }
        b.master = buffer.narrow(0, begin, b.shard).detach();
      } else {
        b.master = torch::zeros({b.shard}, fp32);
        for (size_t k = 0; k < b.params.size(); ++k) {
          const torch::Tensor& holder = d->params_[b.params[k]].holder;
          const int64_t off = b.offsets[k];
          auto [start, len] = Overlap(begin, begin + b.shard, off, off + holder.numel());
          if (len == 0) continue;
          b.master.narrow(0, start - begin, len)
              .copy_(holder.detach().reshape({-1}).narrow(0, start - off, len));
        }
      }
      b.master.set_requires_grad(true);
      for (size_t k = 0; k < b.params.size(); ++k) {
        if (!d->params_[b.params[k]].counts_in_norm) continue;
        const int64_t off = b.offsets[k];
        auto [start, len] =
            Overlap(begin, begin + b.shard, off, off + d->params_[b.params[k]].param.numel());
        if (len > 0) b.counted.push_back({start - begin, len});
      }
      masters.push_back(b.master);
    }
  }));
  d->optimizer_ = MakeOptimizer(options.optimizer, masters);
  d->started_.assign(d->num_groups_, false);
  if (d->size_ > 1 && !d->buckets_.empty()) PP_RETURN_IF_ERROR(d->Probe());
  return d;
}

absl::Status DistributedOptimizer::Probe() {
  // Which reduce-scatter the backend has. An unsupported collective throws
  // when it is called (c10d's "does not support"), on every rank alike, so
  // the ranks fall back together; a failure while it runs is an error.
  const torch::Device device = buckets_.front().master.device();
  const auto fp32 = torch::dtype(torch::kFloat).device(device);
  torch::Tensor in = torch::ones({size_}, fp32);
  std::vector<at::Tensor> out = {torch::zeros({1}, fp32)};
  std::vector<std::vector<at::Tensor>> ins = {{}};
  for (int r = 0; r < size_; ++r) ins[0].push_back(in.narrow(0, r, 1));
  WorkPtr work;
  try {
    work = group_->reduce_scatter(out, ins);
    method_ = Method::kReduceScatter;
    method_name_ = "reduce_scatter";
  } catch (const c10::Error&) {
    try {
      std::vector<at::Tensor> one = {in.narrow(0, 0, 1)};
      c10d::ReduceOptions opts;
      opts.rootRank = 0;
      work = group_->reduce(one, opts);
      method_ = Method::kReducePerOwner;
      method_name_ = "reduce per owner";
    } catch (const c10::Error&) {
      std::vector<at::Tensor> one = {in};
      PP_RETURN_IF_ERROR(RunCollective("distributed optimizer probe all-reduce", group_description_,
                                       options_.timeout, [&] { return group_->allreduce(one); }));
      method_ = Method::kAllReduce;
      method_name_ = "all-reduce, own slice kept";
      return absl::OkStatus();
    }
  }
  return WaitWork(work, absl::StrCat("distributed optimizer probe (", method_name_, ")"),
                  group_description_, options_.timeout);
}

void DistributedOptimizer::ZeroGrad() {
  for (ShardedParam& p : params_) {
    p.holder.mutable_grad().reset();
    if (!SameTensor(p.holder, p.param)) p.param.mutable_grad().reset();
  }
  for (Bucket& b : buckets_) {
    b.master.mutable_grad().reset();
    b.started = false;
  }
  started_.assign(num_groups_, false);
  done_stages_.clear();
}

absl::Status DistributedOptimizer::StartReduceScatter(int group) {
  if (group < 0 || group >= num_groups_) {
    return absl::InternalError(absl::StrCat("distributed optimizer: no group ", group));
  }
  if (started_[group]) {
    return absl::InternalError(
        absl::StrCat("distributed optimizer: group ", group, " reduced twice in one step"));
  }
  started_[group] = true;
  for (Bucket& b : buckets_) {
    if (b.group == group && !b.started) PP_RETURN_IF_ERROR(StartBucket(b));
  }
  return absl::OkStatus();
}

absl::Status DistributedOptimizer::StageDone(int stage) {
  done_stages_.insert(stage);
  for (Bucket& b : buckets_) {
    if (b.started || b.deferred) continue;
    // A parameter without writer stages waits for its group's
    // StartReduceScatter (ShardedParam::writer_stages).
    bool final = true;
    for (int i : b.params) {
      final &= !params_[i].writer_stages.empty();
      for (int writer : params_[i].writer_stages) final &= done_stages_.count(writer) > 0;
    }
    if (final) PP_RETURN_IF_ERROR(StartBucket(b));
  }
  return absl::OkStatus();
}

absl::Status DistributedOptimizer::StartBucket(Bucket& b) {
  b.started = true;
  b.start_us = SteadyClockMicros();
  b.waited_us = -1;
  b.completion_us = std::make_shared<std::atomic<int64_t>>(-1);
  b.end_at_wait = false;
  torch::NoGradGuard no_grad;
  PP_RETURN_IF_ERROR(TorchCall("flattening a gradient bucket", [&] {
    b.flat = torch::zeros({b.padded}, b.master.options().requires_grad(false));
    for (size_t k = 0; k < b.params.size(); ++k) {
      const torch::Tensor& grad = params_[b.params[k]].holder.grad();
      if (!grad.defined()) continue;
      b.flat.narrow(0, b.offsets[k], grad.numel()).copy_(grad.detach().reshape({-1}));
    }
  }));
  if (size_ == 1) return absl::OkStatus();
  const std::string what = absl::StrCat("gradient reduce-scatter (", method_name_, ")");
  try {
    switch (method_) {
      case Method::kReduceScatter: {
        std::vector<at::Tensor> out = {torch::empty({b.shard}, b.flat.options())};
        std::vector<std::vector<at::Tensor>> ins = {{}};
        for (int r = 0; r < size_; ++r) ins[0].push_back(b.flat.narrow(0, r * b.shard, b.shard));
        b.works.push_back(group_->reduce_scatter(out, ins));
        b.input = b.flat;
        b.flat = out[0];
        break;
      }
      case Method::kReducePerOwner:
        for (int r = 0; r < size_; ++r) {
          std::vector<at::Tensor> one = {b.flat.narrow(0, r * b.shard, b.shard)};
          c10d::ReduceOptions opts;
          opts.rootRank = r;
          b.works.push_back(group_->reduce(one, opts));
        }
        break;
      case Method::kAllReduce: {
        std::vector<at::Tensor> one = {b.flat};
        b.works.push_back(group_->allreduce(one));
        break;
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, " on ", group_description_,
                                            " failed to start: ", e.what_without_backtrace()));
  }
  for (const WorkPtr& work : b.works) {
    if (!RecordCompletionTime(work, b.completion_us)) b.end_at_wait = true;
  }
  return absl::OkStatus();
}

absl::Status DistributedOptimizer::WaitBucket(Bucket& b) {
  for (const WorkPtr& work : b.works) {
    PP_RETURN_IF_ERROR(WaitWork(work, absl::StrCat("gradient reduce-scatter (", method_name_, ")"),
                                group_description_, options_.timeout));
  }
  const bool waited = !b.works.empty();
  b.works.clear();
  b.input = torch::Tensor();
  if (waited) b.waited_us = SteadyClockMicros();
  return absl::OkStatus();
}

std::vector<DistributedOptimizer::ReductionWindow> DistributedOptimizer::ReductionWindows() const {
  std::vector<ReductionWindow> windows;
  std::map<int, int> index_in_group;
  int patience_ms = 100;
  for (const Bucket& b : buckets_) {
    const int index = index_in_group[b.group]++;
    if (!b.started || b.waited_us < 0) continue;
    // The works are complete; their futures' callbacks run in the backend's
    // thread right after, which a loaded machine may delay: give them up to
    // 100 ms in all (a backend whose futures never call back costs no more)
    // before falling back to the wait's end.
    const std::optional<int64_t> completed =
        b.end_at_wait ? std::nullopt : AwaitCompletionTime(*b.completion_us, &patience_ms);
    windows.push_back(
        {b.group, index, b.start_us, completed.value_or(b.waited_us), !completed.has_value()});
  }
  return windows;
}

absl::Status DistributedOptimizer::FinishReduceScatter() {
  for (int g = 0; g < num_groups_; ++g) {
    if (!started_[g]) {
      return absl::InternalError(
          absl::StrCat("distributed optimizer: group ", g, " was never reduced this step"));
    }
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    PP_RETURN_IF_ERROR(WaitBucket(b));
    PP_RETURN_IF_ERROR(TorchCall("averaging a gradient slice", [&] {
      torch::Tensor slice = (size_ == 1 || method_ == Method::kReduceScatter)
                                ? b.flat
                                : b.flat.narrow(0, SliceBegin(b), b.shard).clone();
      b.flat = torch::Tensor();
      // As AverageGrads: the sum, then / dp.
      if (size_ > 1) slice.div_(static_cast<double>(size_));
      if (i == 0 && options_.planted_fault ==
                        DistributedOptimizerOptions::PlantedFault::kBucketReducedTwice) {
        slice.add_(slice);
      }
      b.master.mutable_grad() = slice;
    }));
  }
  return absl::OkStatus();
}

double DistributedOptimizer::LocalSquaredNorm() const {
  torch::NoGradGuard no_grad;
  double sum = 0.0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    if (!b.master.grad().defined()) continue;
    if (i == 0 && rank_ == 1 &&
        options_.planted_fault == DistributedOptimizerOptions::PlantedFault::kSliceLeftOutOfNorm) {
      continue;
    }
    for (const auto& [start, len] : b.counted) {
      const double n = b.master.grad().narrow(0, start, len).norm().item<double>();
      sum += n * n;
    }
  }
  return sum;
}

void DistributedOptimizer::ScaleGrads(double coef) {
  torch::NoGradGuard no_grad;
  for (Bucket& b : buckets_) {
    if (b.master.grad().defined()) b.master.mutable_grad().mul_(coef);
  }
}

void DistributedOptimizer::SetLearningRate(double lr) { pp::SetLearningRate(*optimizer_, lr); }

absl::Status DistributedOptimizer::AllGather(const torch::Tensor& slice, torch::Tensor& full,
                                             const std::string& what) {
  // Pure data movement: bf16 moves as fp16's bits (Gloo in LibTorch 1.13
  // has no bf16 or int16 collectives), unchanged.
  const bool as_half = slice.scalar_type() == torch::kBFloat16;
  torch::Tensor dst = as_half ? full.view(torch::kHalf) : full;
  std::vector<std::vector<at::Tensor>> outs = {{}};
  const int64_t shard = slice.numel();
  for (int r = 0; r < size_; ++r) outs[0].push_back(dst.narrow(0, r * shard, shard));
  std::vector<at::Tensor> in = {as_half ? slice.view(torch::kHalf) : slice};
  return RunCollective(what, group_description_, options_.timeout,
                       [&] { return group_->allgather(outs, in); });
}

absl::Status DistributedOptimizer::Step() {
  PP_RETURN_IF_ERROR(TorchCall("distributed optimizer step", [&] { optimizer_->step(); }));
  torch::NoGradGuard no_grad;
  for (Bucket& b : buckets_) {
    const torch::ScalarType dtype = params_[b.params.front()].param.scalar_type();
    torch::Tensor full;
    PP_RETURN_IF_ERROR(TorchCall("casting an updated slice", [&] {
      full = torch::empty({b.padded}, b.master.options().dtype(dtype).requires_grad(false));
      full.narrow(0, SliceBegin(b), b.shard).copy_(b.master.detach());
    }));
    if (size_ > 1) {
      PP_RETURN_IF_ERROR(
          AllGather(full.narrow(0, SliceBegin(b), b.shard).clone(), full, "parameter all-gather"));
    }
    PP_RETURN_IF_ERROR(TorchCall("writing the gathered parameters", [&] {
      for (size_t k = 0; k < b.params.size(); ++k) {
        torch::Tensor param = params_[b.params[k]].param;
        torch::Tensor src = full.narrow(0, b.offsets[k], param.numel());
        param.detach().view({-1}).copy_(src);
      }
    }));
  }
  return absl::OkStatus();
}

absl::Status DistributedOptimizer::GatherFullState(const std::vector<torch::Tensor>& values,
                                                   torch::optim::Optimizer& full) {
  return Gather(values, full, /*with_state=*/true);
}

absl::Status DistributedOptimizer::Gather(const std::vector<torch::Tensor>& values,
                                          torch::optim::Optimizer& full, bool with_state) {
  if (values.size() != params_.size()) {
    return absl::InternalError(absl::StrCat("GatherFullState: ", values.size(), " values for ",
                                            params_.size(), " parameters"));
  }
  torch::NoGradGuard no_grad;
  const std::vector<std::string> names = StateNames(options_.optimizer);
  for (Bucket& b : buckets_) {
    auto gather = [&](const torch::Tensor& slice, const std::string& what,
                      torch::Tensor& out) -> absl::Status {
      out = torch::empty({b.padded}, slice.options().requires_grad(false));
      if (size_ == 1) {
        out.copy_(slice.detach());
        return absl::OkStatus();
      }
      return AllGather(slice.detach().contiguous(), out, what);
    };
    torch::Tensor all_values;
    PP_RETURN_IF_ERROR(gather(b.master, "master all-gather (checkpoint)", all_values));
    if (!with_state) {
      PP_RETURN_IF_ERROR(TorchCall("unflattening the masters", [&] {
        for (size_t k = 0; k < b.params.size(); ++k) {
          const torch::Tensor& value = values[b.params[k]];
          value.detach().view({-1}).copy_(all_values.narrow(0, b.offsets[k], value.numel()));
        }
      }));
      continue;
    }
    const SliceState state = StateOf(*optimizer_, b.master);
    std::vector<torch::Tensor> all_state(state.tensors.size());
    for (size_t s = 0; s < state.tensors.size(); ++s) {
      PP_RETURN_IF_ERROR(gather(state.tensors[s].second,
                                absl::StrCat(state.tensors[s].first, " all-gather (checkpoint)"),
                                all_state[s]));
    }
    PP_RETURN_IF_ERROR(TorchCall("unflattening the optimizer state", [&] {
      for (size_t k = 0; k < b.params.size(); ++k) {
        const torch::Tensor& value = values[b.params[k]];
        const int64_t n = value.numel();
        value.detach().view({-1}).copy_(all_values.narrow(0, b.offsets[k], n));
        if (!state.present) continue;
        SliceState one;
        one.present = true;
        one.step = state.step;
        for (size_t s = 0; s < all_state.size(); ++s) {
          one.tensors.push_back(
              {names.at(s), all_state[s].narrow(0, b.offsets[k], n).view(value.sizes()).clone()});
        }
        SetState(full, value, one);
      }
    }));
  }
  return absl::OkStatus();
}

absl::Status DistributedOptimizer::ScatterFullState(const std::vector<torch::Tensor>& values,
                                                    torch::optim::Optimizer& full) {
  if (values.size() != params_.size()) {
    return absl::InternalError(absl::StrCat("ScatterFullState: ", values.size(), " values for ",
                                            params_.size(), " parameters"));
  }
  torch::NoGradGuard no_grad;
  const std::vector<std::string> names = StateNames(options_.optimizer);
  for (Bucket& b : buckets_) {
    const int64_t begin = SliceBegin(b);
    int with_state = 0;
    int64_t step = -1;
    for (int i : b.params) {
      const SliceState s = StateOf(full, values[i]);
      if (!s.present) continue;
      ++with_state;
      if (step >= 0 && s.step != step) {
        return absl::DataLossError(
            absl::StrCat("the loaded optimizer state has step counts ", step, " and ", s.step,
                         " within one bucket; the distributed optimizer keeps one per bucket"));
      }
      step = s.step;
    }
    if (with_state != 0 && with_state != static_cast<int>(b.params.size())) {
      return absl::DataLossError(absl::StrCat(
          "the loaded optimizer state covers ", with_state, " of a bucket's ", b.params.size(),
          " parameters; the distributed optimizer needs all or none"));
    }
    std::vector<torch::Tensor> slices(names.size());
    PP_RETURN_IF_ERROR(TorchCall("scattering the loaded state into this rank's slice", [&] {
      for (torch::Tensor& s : slices)
        s = torch::zeros({b.shard}, b.master.options().requires_grad(false));
      for (size_t k = 0; k < b.params.size(); ++k) {
        const int i = b.params[k];
        const torch::Tensor flat_value = values[i].detach().reshape({-1});
        params_[i].param.detach().view({-1}).copy_(flat_value);
        const int64_t off = b.offsets[k];
        auto [start, len] = Overlap(begin, begin + b.shard, off, off + flat_value.numel());
        if (len == 0) continue;
        b.master.detach()
            .narrow(0, start - begin, len)
            .copy_(flat_value.narrow(0, start - off, len));
        if (with_state == 0) continue;
        const SliceState s = StateOf(full, values[i]);
        for (size_t t = 0; t < names.size(); ++t) {
          slices[t]
              .narrow(0, start - begin, len)
              .copy_(s.tensors.at(t).second.detach().reshape({-1}).narrow(0, start - off, len));
        }
      }
      if (with_state == 0) {
        optimizer_->state().erase(torch_compat::OptimizerStateKeyOf(b.master));
        return;
      }
      SliceState mine;
      mine.present = true;
      mine.step = std::max<int64_t>(step, 0);
      for (size_t t = 0; t < names.size(); ++t) mine.tensors.push_back({names[t], slices[t]});
      SetState(*optimizer_, b.master, mine);
    }));
  }
  return absl::OkStatus();
}

torch::Tensor DistributedOptimizer::WholeState::ValueOf(const torch::Tensor& param) const {
  auto it = index.find(param.unsafeGetTensorImpl());
  return it == index.end() ? torch::Tensor() : values[it->second];
}

DistributedOptimizer::WholeState DistributedOptimizer::NewWholeState() const {
  WholeState state;
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& param = params_[i].param;
    state.values.push_back(
        torch::zeros(param.sizes(), torch::dtype(torch::kFloat).device(param.device())));
    state.index[param.unsafeGetTensorImpl()] = i;
  }
  state.optimizer = MakeOptimizer(options_.optimizer, state.values);
  return state;
}

absl::StatusOr<DistributedOptimizer::OwnedState> DistributedOptimizer::LocalOwnedState() const {
  OwnedState owned;
  owned.parts.resize(params_.size());
  torch::NoGradGuard no_grad;
  const std::vector<std::string> names = StateNames(options_.optimizer);
  std::vector<std::pair<torch::Tensor, SliceState>> states;
  PP_RETURN_IF_ERROR(TorchCall("this rank's part of the optimizer state", [&] {
    for (const Bucket& b : buckets_) {
      const int64_t begin = SliceBegin(b), end = begin + b.shard;
      const SliceState state = StateOf(*optimizer_, b.master);
      for (size_t k = 0; k < b.params.size(); ++k) {
        const int64_t first = b.offsets[k];
        const int64_t last = first + params_[b.params[k]].holder.numel();
        const int64_t from = std::max(begin, first), to = std::min(end, last);
        if (from >= to) continue;  // another rank's
        OwnedPart& part = owned.parts[b.params[k]];
        part.offset = from - first;
        // Copies: the checkpoint holds them while the run goes on.
        part.value = b.master.detach().narrow(0, from - begin, to - from).clone();
        if (!state.present) continue;
        SliceState one;
        one.present = true;
        one.step = state.step;
        for (size_t s = 0; s < state.tensors.size(); ++s) {
          one.tensors.push_back(
              {names.at(s), state.tensors[s].second.narrow(0, from - begin, to - from).clone()});
        }
        states.push_back({part.value, std::move(one)});
      }
    }
  }));
  std::vector<torch::Tensor> values;
  for (const OwnedPart& part : owned.parts) {
    if (part.value.defined()) values.push_back(part.value);
  }
  owned.optimizer = MakeOptimizer(options_.optimizer, values);
  for (const auto& [value, state] : states) SetState(*owned.optimizer, value, state);
  return owned;
}

absl::StatusOr<DistributedOptimizer::WholeState> DistributedOptimizer::GatherWholeState() {
  WholeState state = NewWholeState();
  PP_RETURN_IF_ERROR(GatherFullState(state.values, *state.optimizer));
  return state;
}

absl::StatusOr<DistributedOptimizer::WholeState> DistributedOptimizer::GatherWholeValues() {
  WholeState state = NewWholeState();
  PP_RETURN_IF_ERROR(Gather(state.values, *state.optimizer, /*with_state=*/false));
  return state;
}

int64_t DistributedOptimizer::StateBytes() const {
  int64_t bytes = 0;
  for (const Bucket& b : buckets_) {
    if (!b.in_place) bytes += static_cast<int64_t>(b.master.storage().nbytes());
  }
  return bytes + OptimizerStateBytes(*optimizer_);
}

int DistributedOptimizer::started_buckets() const {
  int n = 0;
  for (const Bucket& b : buckets_) n += b.started ? 1 : 0;
  return n;
}

int64_t DistributedOptimizer::shard_numel() const {
  int64_t n = 0;
  for (const Bucket& b : buckets_) n += b.shard;
  return n;
}

int64_t DistributedOptimizer::total_numel() const {
  int64_t n = 0;
  for (const Bucket& b : buckets_) n += b.padded;
  return n;
}

}  // namespace pp
