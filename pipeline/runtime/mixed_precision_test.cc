#include "pipeline/runtime/mixed_precision.h"

#include <string>

#include <gtest/gtest.h>

namespace pp {
namespace {

TEST(PrecisionTest, ParsesFp32AndBf16AndRefusesFp16SayingWhy) {
  EXPECT_EQ(*ParsePrecision("fp32"), Precision::kFp32);
  EXPECT_EQ(*ParsePrecision("bf16"), Precision::kBf16);
  absl::StatusOr<Precision> fp16 = ParsePrecision("fp16");
  ASSERT_FALSE(fp16.ok());
  EXPECT_NE(std::string(fp16.status().message()).find("loss scaling"), std::string::npos)
      << fp16.status();
  absl::StatusOr<Precision> other = ParsePrecision("int8");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(std::string(other.status().message()).find("valid: fp32, bf16"), std::string::npos)
      << other.status();
}

TEST(PrecisionTest, TheCpuRunsBf16) { EXPECT_TRUE(CheckBf16Support(torch::kCPU).ok()); }

TEST(PrecisionTest, CastFloatingLeavesIntegersAndSameDtypeAlone) {
  torch::Tensor ids = torch::arange(4);
  torch::Tensor x = torch::ones({2}, torch::kBFloat16);
  Activations out = CastFloating({ids, x, torch::ones({3})}, torch::kBFloat16);
  EXPECT_EQ(out[0].scalar_type(), torch::kLong);
  EXPECT_TRUE(out[1].is_same(x));  // no copy: a received tensor keeps its autograd identity
  EXPECT_EQ(out[2].scalar_type(), torch::kBFloat16);
}

TEST(MasterWeightsTest, MastersAreFp32CopiesAndTheParametersBecomeBf16InPlace) {
  torch::nn::Linear linear(3, 2);
  const torch::Tensor before = linear->weight.detach().clone();
  torch::Tensor* const identity = &linear->weight;
  MasterWeights master(linear->parameters());
  EXPECT_EQ(linear->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(identity, &linear->weight);
  const torch::Tensor& m = master.MasterOf(linear->weight);
  EXPECT_EQ(m.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(m, before));
  EXPECT_TRUE(m.requires_grad());
  EXPECT_EQ(master.masters().size(), 2u);
  // A tensor that is not a parameter maps to itself.
  torch::Tensor other = torch::ones({1});
  EXPECT_TRUE(master.MasterOf(other).is_same(other));
}

// m contributions of 2^-10 on top of 1: bf16 (8 significant bits) would drop
// every one of them; the fp32 buffers keep them all.
TEST(MasterWeightsTest, GradientsAccumulateInFp32AcrossBackwardPasses) {
  torch::Tensor w = torch::ones({1}).requires_grad_(true);
  MasterWeights master({w});
  const int m = 64;
  for (int i = 0; i < m; ++i) {
    const double scale = i == 0 ? 1.0 : std::ldexp(1.0, -10);
    (w * scale).sum().backward();
    master.AccumulateGrads();
    EXPECT_FALSE(w.grad().defined());
  }
  const double want = 1.0 + (m - 1) * std::ldexp(1.0, -10);
  EXPECT_EQ(master.MasterOf(w).grad().item<double>(), want);
  // What bf16 accumulation would have given.
  torch::Tensor bf16 = torch::ones({1}, torch::kBFloat16);
  for (int i = 1; i < m; ++i) bf16 += std::ldexp(1.0, -10);
  EXPECT_EQ(bf16.item<double>(), 1.0);
}

TEST(MasterWeightsTest, CopyToModelRoundsTheMastersIntoTheParameters) {
  torch::Tensor w = torch::zeros({1}).requires_grad_(true);
  MasterWeights master({w});
  {
    torch::NoGradGuard no_grad;
    master.masters()[0].fill_(1.0 + std::ldexp(1.0, -12));  // below bf16's resolution at 1
  }
  master.CopyToModel();
  EXPECT_EQ(w.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(w.item<double>(), 1.0);
  EXPECT_EQ(master.masters()[0].item<double>(), 1.0 + std::ldexp(1.0, -12));
}

}  // namespace
}  // namespace pp
