#include "pipeline/runtime/distributed_optimizer.h"

#include <chrono>
#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/torch_compat.h"
#include "pipeline/runtime/grad_sync.h"
#include "topology/host_staged_backend.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

using std::chrono::milliseconds;
using PlantedFault = DistributedOptimizerOptions::PlantedFault;

absl::Status Check(bool cond, const std::string& what) {
  return cond ? absl::OkStatus() : absl::InternalError(what);
}

// Parameters of shapes {3,2}, {5}, {1}, {4,3}: 24 elements, an odd total so
// that the last bucket pads at dp = 2 and 3.
// (Generators of their own: the ranks are threads.)
std::vector<torch::Tensor> InitialValues() {
  at::Generator gen = at::detail::createCPUGenerator(7);
  return {torch::randn({3, 2}, gen), torch::randn({5}, gen), torch::randn({1}, gen),
          torch::randn({4, 3}, gen)};
}

// Rank r's gradient of parameter i at `step`.
torch::Tensor GradOf(int rank, size_t i, int step, c10::IntArrayRef shape) {
  at::Generator gen =
      at::detail::createCPUGenerator(1000 * step + 10 * rank + static_cast<uint64_t>(i));
  return torch::randn(shape, gen);
}

OptimizerConfig Adamw() {
  OptimizerConfig c;
  c.name = "adamw";
  c.lr = 0.01;
  c.weight_decay = 0.1;
  return c;
}

// The unsharded reference: the same optimizer over whole parameters whose
// gradients are the data-parallel average (summed in rank order, / dp).
struct Reference {
  std::vector<torch::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;

  Reference(const OptimizerConfig& config) {
    for (const torch::Tensor& v : InitialValues()) params.push_back(v.clone().requires_grad_(true));
    optimizer = MakeOptimizer(config, params);
  }
  // Returns the squared norm of the averaged gradients.
  double Step(int dp, int step, double max_norm = 0.0) {
    torch::NoGradGuard no_grad;
    double sumsq = 0.0;
    for (size_t i = 0; i < params.size(); ++i) {
      torch::Tensor sum = GradOf(0, i, step, params[i].sizes());
      for (int r = 1; r < dp; ++r) sum = sum + GradOf(r, i, step, params[i].sizes());
      params[i].mutable_grad() = sum.div_(static_cast<double>(dp));
      const double n = params[i].grad().norm().item<double>();
      sumsq += n * n;
    }
    if (max_norm > 0) ClipGradsToNorm(params, std::sqrt(sumsq), max_norm);
    optimizer->step();
    return sumsq;
  }
};

struct Sharded {
  std::vector<torch::Tensor> params;
  std::unique_ptr<DistributedOptimizer> dist;
};

// Two groups ({0,1}, {2,3}) as two virtual stages would be.
absl::StatusOr<Sharded> MakeSharded(World& world, const DistributedOptimizerOptions& options,
                                    torch::ScalarType dtype = torch::kFloat) {
  Sharded s;
  std::vector<std::vector<ShardedParam>> groups(2);
  std::vector<torch::Tensor> values = InitialValues();
  for (size_t i = 0; i < values.size(); ++i) {
    ShardedParam p;
    p.holder = values[i].clone().requires_grad_(true);
    p.param = dtype == torch::kFloat ? p.holder : values[i].to(dtype).requires_grad_(true);
    s.params.push_back(p.param);
    groups[i < 2 ? 0 : 1].push_back(p);
  }
  PP_ASSIGN_OR_RETURN(
      s.dist, DistributedOptimizer::Create(std::move(groups), world.group, "data group", options));
  return s;
}

absl::Status ShardedStep(World& world, Sharded& s, int step, double max_norm, double* norm2) {
  s.dist->ZeroGrad();
  const std::vector<ShardedParam>& params = s.dist->params();
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor holder = params[i].holder;
    holder.mutable_grad() = GradOf(world.rank, i, step, params[i].param.sizes());
  }
  PP_RETURN_IF_ERROR(s.dist->StartReduceScatter(1));  // any order
  PP_RETURN_IF_ERROR(s.dist->StartReduceScatter(0));
  PP_RETURN_IF_ERROR(s.dist->FinishReduceScatter());
  PP_ASSIGN_OR_RETURN(double norm, ShardedGradNorm(s.dist->LocalSquaredNorm(),
                                                   c10::intrusive_ptr<c10d::ProcessGroup>(),
                                                   world.group, milliseconds(10000)));
  *norm2 = norm * norm;
  if (max_norm > 0) {
    const double coef = ClipCoefficient(norm, max_norm);
    if (coef < 1.0) s.dist->ScaleGrads(coef);
  }
  return s.dist->Step();
}

absl::Status ExpectClose(const torch::Tensor& got, const torch::Tensor& want,
                         const std::string& what, double rtol = 1e-6) {
  return Check(
      torch::allclose(got.to(torch::kFloat), want.to(torch::kFloat), rtol, 1e-7),
      absl::StrCat(what, ": max diff ",
                   (got.to(torch::kFloat) - want.to(torch::kFloat)).abs().max().item<float>()));
}

// The sharded update equals the unsharded one, for several bucket sizes
// (one bucket per group; a bucket per parameter and parameters larger than
// a bucket), dp = 2 and 3, with clipping, for AdamW and SGD with momentum.
TEST(DistributedOptimizerTest, EqualsUnshardedOptimizer) {
  for (int dp : {2, 3}) {
    for (int64_t bucket : {int64_t{1000}, int64_t{4}}) {
      for (const std::string opt : {"adamw", "sgd"}) {
        SCOPED_TRACE(absl::StrCat("dp ", dp, " bucket ", bucket, " ", opt));
        OptimizerConfig config = Adamw();
        if (opt == "sgd") {
          config.name = "sgd";
          config.momentum = 0.9;
        }
        absl::Status status = RunOnThreadRanks(dp, milliseconds(30000), [&](World& world) {
          DistributedOptimizerOptions options;
          options.optimizer = config;
          options.bucket_numel = bucket;
          options.timeout = milliseconds(10000);
          PP_ASSIGN_OR_RETURN(Sharded s, MakeSharded(world, options));
          Reference ref(config);
          for (int step = 0; step < 3; ++step) {
            double norm2 = 0;
            PP_RETURN_IF_ERROR(ShardedStep(world, s, step, /*max_norm=*/0.5, &norm2));
            const double ref_norm2 = ref.Step(dp, step, 0.5);
            PP_RETURN_IF_ERROR(Check(std::abs(norm2 - ref_norm2) <= 1e-5 * ref_norm2,
                                     absl::StrCat("norm^2 ", norm2, " vs ", ref_norm2)));
          }
          for (size_t i = 0; i < s.params.size(); ++i) {
            PP_RETURN_IF_ERROR(ExpectClose(s.params[i].detach(), ref.params[i].detach(),
                                           absl::StrCat("param ", i)));
          }
          return absl::OkStatus();
        });
        EXPECT_TRUE(status.ok()) << status;
      }
    }
  }
}

// The reduce-scatter the backend gives: c10d's own where Gloo has it
// (LibTorch 2.x), one rooted reduce per owner on LibTorch 1.13's Gloo.
TEST(DistributedOptimizerTest, PicksTheBackendsReduceScatter) {
  absl::Status status = RunOnThreadRanks(2, milliseconds(30000), [&](World& world) {
    DistributedOptimizerOptions options;
    options.optimizer = Adamw();
    options.timeout = milliseconds(10000);
    PP_ASSIGN_OR_RETURN(Sharded s, MakeSharded(world, options));
    const std::string want =
        torch_compat::LibTorchMajorVersion() >= 2 ? "reduce_scatter" : "reduce per owner";
    return Check(s.dist->reduce_scatter_method() == want,
                 absl::StrCat("method '", s.dist->reduce_scatter_method(), "', want '", want, "'"));
  });
  EXPECT_TRUE(status.ok()) << status;
}

// Ranks sharing a GPU use the host-staged backend, which has neither
// reduce_scatter nor reduce: the all-reduce fallback, still the unsharded
// update. Run here with the backend staging CPU tensors (LibTorch 2.x).
TEST(DistributedOptimizerTest, HostStagedBackendFallsBackToAllReduce) {
  if (!HostStagedBackendAvailable()) GTEST_SKIP() << "this LibTorch has no c10d backends";
  absl::Status status = RunOnThreadRanks(2, milliseconds(30000), [&](World& world) {
    // A fresh world per test: its group's CPU path becomes the staged one.
    PP_RETURN_IF_ERROR(AddHostStagedBackend(world.group, c10::DeviceType::CPU));
    DistributedOptimizerOptions options;
    options.optimizer = Adamw();
    options.bucket_numel = 5;
    options.timeout = milliseconds(10000);
    PP_ASSIGN_OR_RETURN(Sharded s, MakeSharded(world, options));
    PP_RETURN_IF_ERROR(Check(s.dist->reduce_scatter_method() == "all-reduce, own slice kept",
                             s.dist->reduce_scatter_method()));
    Reference ref(options.optimizer);
    for (int step = 0; step < 2; ++step) {
      double norm2 = 0;
      PP_RETURN_IF_ERROR(ShardedStep(world, s, step, 0.5, &norm2));
      ref.Step(2, step, 0.5);
    }
    for (size_t i = 0; i < s.params.size(); ++i) {
      PP_RETURN_IF_ERROR(
          ExpectClose(s.params[i].detach(), ref.params[i].detach(), absl::StrCat("param ", i)));
    }
    return AfterAllRanks(world, "staged_done");
  });
  EXPECT_TRUE(status.ok()) << status;
}

// Each rank keeps 1/dp of the state: AdamW's two moments over the slice
// (fp32 training: the masters are the parameters' own buffer), and with
// separate masters (bf16) the slice's fp32 masters too.
TEST(DistributedOptimizerTest, StateIsOneSlicePerRank) {
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
    absl::Status status = RunOnThreadRanks(2, milliseconds(30000), [&](World& world) {
      DistributedOptimizerOptions options;
      options.optimizer = Adamw();
      options.timeout = milliseconds(10000);
      PP_ASSIGN_OR_RETURN(Sharded s, MakeSharded(world, options, dtype));
      double norm2 = 0;
      PP_RETURN_IF_ERROR(ShardedStep(world, s, 0, 0.0, &norm2));
      // 24 elements: two buckets of 11 and 13, padded to 12 and 14.
      PP_RETURN_IF_ERROR(
          Check(s.dist->total_numel() == 26 && s.dist->shard_numel() == 13,
                absl::StrCat("layout ", s.dist->total_numel(), " / ", s.dist->shard_numel())));
      const int64_t per_element = dtype == torch::kFloat ? 8 : 12;
      PP_RETURN_IF_ERROR(Check(s.dist->StateBytes() == 13 * per_element,
                               absl::StrCat("state bytes ", s.dist->StateBytes())));
      if (dtype != torch::kFloat) {
        // The bf16 parameters are the fp32 masters rounded, as
        // MasterWeights::CopyToModel would write them.
        std::vector<torch::Tensor> values;
        for (const torch::Tensor& p : s.params) values.push_back(torch::empty(p.sizes()));
        auto full = MakeOptimizer(options.optimizer, values);
        PP_RETURN_IF_ERROR(s.dist->GatherFullState(values, *full));
        for (size_t i = 0; i < values.size(); ++i) {
          PP_RETURN_IF_ERROR(Check(torch::equal(s.params[i].detach(), values[i].to(dtype)),
                                   absl::StrCat("bf16 param ", i, " is its master rounded")));
        }
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(status.ok()) << status;
  }
}

// Gathered state is what an unsharded optimizer holds; scattered into
// another data-parallel degree (and bucket size) it continues the same
// trajectory.
TEST(DistributedOptimizerTest, GatherAndScatterReshardAcrossDp) {
  const OptimizerConfig config = Adamw();
  struct Saved {
    torch::Tensor value, exp_avg, exp_avg_sq;
    int64_t step = 0;
  };
  std::vector<Saved> saved(InitialValues().size());
  Reference ref(config);
  for (int step = 0; step < 2; ++step) ref.Step(2, step);
  absl::Status status = RunOnThreadRanks(2, milliseconds(30000), [&](World& world) {
    DistributedOptimizerOptions options;
    options.optimizer = config;
    options.bucket_numel = 5;
    options.timeout = milliseconds(10000);
    PP_ASSIGN_OR_RETURN(Sharded s, MakeSharded(world, options));
    for (int step = 0; step < 2; ++step) {
      double norm2 = 0;
      PP_RETURN_IF_ERROR(ShardedStep(world, s, step, 0.0, &norm2));
    }
    std::vector<torch::Tensor> values;
    for (const torch::Tensor& p : s.params) values.push_back(torch::empty(p.sizes()));
    auto full = MakeOptimizer(config, values);
    PP_RETURN_IF_ERROR(s.dist->GatherFullState(values, *full));
    for (size_t i = 0; i < values.size(); ++i) {
      const auto* got = dynamic_cast<const torch::optim::AdamWParamState*>(
          full->state().at(torch_compat::OptimizerStateKeyOf(values[i])).get());
      const auto* want = dynamic_cast<const torch::optim::AdamWParamState*>(
          ref.optimizer->state().at(torch_compat::OptimizerStateKeyOf(ref.params[i])).get());
      PP_RETURN_IF_ERROR(Check(got != nullptr && want != nullptr, "AdamW state gathered"));
      PP_RETURN_IF_ERROR(Check(got->step() == want->step(), "step"));
      PP_RETURN_IF_ERROR(ExpectClose(got->exp_avg(), want->exp_avg(), "exp_avg"));
      PP_RETURN_IF_ERROR(ExpectClose(got->exp_avg_sq(), want->exp_avg_sq(), "exp_avg_sq"));
      PP_RETURN_IF_ERROR(ExpectClose(values[i], ref.params[i].detach(), "values"));
      if (world.rank == 0) {
        saved[i] = {values[i].clone(), got->exp_avg().clone(), got->exp_avg_sq().clone(),
                    got->step()};
      }
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  ref.Step(3, 2);
  status = RunOnThreadRanks(3, milliseconds(30000), [&](World& world) {
    DistributedOptimizerOptions options;
    options.optimizer = config;
    options.bucket_numel = 7;
    options.timeout = milliseconds(10000);
    PP_ASSIGN_OR_RETURN(Sharded s, MakeSharded(world, options));
    std::vector<torch::Tensor> values;
    for (const Saved& one : saved) values.push_back(one.value.clone());
    auto full = MakeOptimizer(config, values);
    for (size_t i = 0; i < values.size(); ++i) {
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(saved[i].step).exp_avg(saved[i].exp_avg).exp_avg_sq(saved[i].exp_avg_sq);
      full->state()[torch_compat::OptimizerStateKeyOf(values[i])] = std::move(state);
    }
    PP_RETURN_IF_ERROR(s.dist->ScatterFullState(values, *full));
    double norm2 = 0;
    PP_RETURN_IF_ERROR(ShardedStep(world, s, 2, 0.0, &norm2));
    for (size_t i = 0; i < s.params.size(); ++i) {
      PP_RETURN_IF_ERROR(ExpectClose(s.params[i].detach(), ref.params[i].detach(),
                                     absl::StrCat("param ", i, " after resharding to dp 3")));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// Early starts: a bucket starts once every stage writing its parameters
// is done, never one holding a parameter tied across ranks; the group's
// StartReduceScatter starts the rest; the update is the unsharded one.
TEST(DistributedOptimizerTest, StageDoneStartsFinalBucketsEarly) {
  absl::Status status = RunOnThreadRanks(2, milliseconds(30000), [&](World& world) {
    DistributedOptimizerOptions options;
    options.optimizer = Adamw();
    options.bucket_numel = 6;
    options.timeout = milliseconds(10000);
    // Group 0 = params 0, 1 (stage 0), group 1 = params 2, 3 (stage 3);
    // param 1 is also written by stage 3 (a module both chunks use), param
    // 3 is tied to another rank.
    std::vector<std::vector<ShardedParam>> groups(2);
    std::vector<torch::Tensor> values = InitialValues();
    std::vector<torch::Tensor> params;
    for (size_t i = 0; i < values.size(); ++i) {
      ShardedParam p;
      p.holder = values[i].clone().requires_grad_(true);
      p.param = p.holder;
      p.writer_stages = i < 2 ? std::vector<int>{0} : std::vector<int>{3};
      if (i == 1) p.writer_stages = {0, 3};
      p.tied_across_ranks = i == 3;
      params.push_back(p.param);
      groups[i < 2 ? 0 : 1].push_back(p);
    }
    PP_ASSIGN_OR_RETURN(auto dist, DistributedOptimizer::Create(std::move(groups), world.group,
                                                                "data group", options));
    // Buckets (<= 6 elements, tied apart): {p0}, {p1}, {p2}, {p3 tied}.
    PP_RETURN_IF_ERROR(Check(dist->num_buckets() == 4, absl::StrCat(dist->num_buckets())));
    Reference ref(options.optimizer);
    for (int step = 0; step < 2; ++step) {
      dist->ZeroGrad();
      for (size_t i = 0; i < params.size(); ++i) {
        torch::Tensor holder = dist->params()[i].holder;
        holder.mutable_grad() = GradOf(world.rank, i, step, params[i].sizes());
      }
      PP_RETURN_IF_ERROR(dist->StageDone(0));  // p0 only: p1 waits for stage 3
      PP_RETURN_IF_ERROR(Check(dist->started_buckets() == 1, "after stage 0"));
      PP_RETURN_IF_ERROR(dist->StageDone(3));  // p1 and p2; not the tied p3
      PP_RETURN_IF_ERROR(Check(dist->started_buckets() == 3, "after stage 3"));
      PP_RETURN_IF_ERROR(dist->StartReduceScatter(0));
      PP_RETURN_IF_ERROR(dist->StartReduceScatter(1));
      PP_RETURN_IF_ERROR(Check(dist->started_buckets() == 4, "after REDUCE_GRAD"));
      PP_RETURN_IF_ERROR(dist->FinishReduceScatter());
      PP_RETURN_IF_ERROR(dist->Step());
      ref.Step(2, step);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      PP_RETURN_IF_ERROR(
          ExpectClose(params[i].detach(), ref.params[i].detach(), absl::StrCat("param ", i)));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// The planted faults change the result.
TEST(DistributedOptimizerTest, PlantedFaultsAreVisible) {
  for (PlantedFault fault :
       {PlantedFault::kBucketReducedTwice, PlantedFault::kSliceLeftOutOfNorm}) {
    absl::Status status = RunOnThreadRanks(2, milliseconds(30000), [&](World& world) {
      DistributedOptimizerOptions options;
      options.optimizer = Adamw();
      options.timeout = milliseconds(10000);
      options.planted_fault = fault;
      PP_ASSIGN_OR_RETURN(Sharded s, MakeSharded(world, options));
      Reference ref(options.optimizer);
      double norm2 = 0;
      PP_RETURN_IF_ERROR(ShardedStep(world, s, 0, 0.5, &norm2));
      const double ref_norm2 = ref.Step(2, 0, 0.5);
      bool differs = std::abs(norm2 - ref_norm2) > 1e-5 * ref_norm2;
      for (size_t i = 0; i < s.params.size(); ++i) {
        differs |= !torch::allclose(s.params[i].detach(), ref.params[i].detach(), 1e-6, 1e-7);
      }
      return Check(differs, "the planted fault went unnoticed");
    });
    EXPECT_TRUE(status.ok()) << status;
  }
}

TEST(DistributedOptimizerTest, RefusesBadInput) {
  DistributedOptimizerOptions options;
  options.optimizer = Adamw();
  options.bucket_numel = 0;
  auto bad = DistributedOptimizer::Create({}, c10::intrusive_ptr<c10d::ProcessGroup>(),
                                          "data group", options);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bucket size (0 elements)"), std::string::npos);
  options.bucket_numel = 10;
  ShardedParam half;
  half.holder = torch::zeros({2}, torch::kBFloat16);
  half.param = half.holder;
  bad = DistributedOptimizer::Create({{half}}, c10::intrusive_ptr<c10d::ProcessGroup>(),
                                     "data group", options);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("must be fp32"), std::string::npos);
}

}  // namespace
}  // namespace pp
