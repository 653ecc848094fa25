#include "models/llama/llama.h"

#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "models/config_testing.h"
#include "pipeline/pipeline_model.h"

namespace pp {
namespace {

LlamaModelConfig Tiny() {
  return ParseModelConfig<LlamaModelConfig>(
      "vocab_size: 300 context_length: 16 width: 32 num_heads: 4 num_kv_heads: 2 num_layers: 2 "
      "intermediate_size: 48");
}

MicroBatch Batch(torch::Tensor ids) {
  MicroBatch batch;
  batch.id = 0;
  batch.tensors["input_ids"] = ids;
  batch.tensors["labels"] = ids.roll(-1, 1);
  return batch;
}

TEST(LlamaSpecsTest, UntiedLayoutAndDeclaredCounts) {
  absl::StatusOr<std::vector<LayerSpec>> specs = MakeLlamaSpecs(Tiny());
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 2u + 3u);
  const std::vector<std::string> names = {"LlamaEmbedding", "LlamaBlock", "LlamaBlock",
                                          "FinalRmsNorm", "LmHead"};
  for (size_t i = 0; i < specs->size(); ++i) {
    EXPECT_EQ((*specs)[i].name(), names[i]);
    EXPECT_EQ((*specs)[i].tie_key(), "") << i;
    Layer layer = BuildSpecLayer((*specs)[i], i, /*base_seed=*/0);
    EXPECT_EQ(layer->TypeName(), names[i]);
    EXPECT_EQ(*(*specs)[i].declared_parameter_count(), CountTrainableParameters(*layer))
        << names[i];
  }
  // GQA: k and v are half the width of q with 2 of 4 heads.
  EXPECT_EQ(LlamaBlockParameterCount(Tiny()), 32 * 32 * 2 + 32 * 16 * 2 + 3 * 32 * 48 + 2 * 32);
}

TEST(LlamaSpecsTest, TiedHeadProjectsThroughTheTokenTable) {
  LlamaModelConfig c = Tiny();
  c.set_tie_embeddings(true);
  absl::StatusOr<std::vector<LayerSpec>> specs = MakeLlamaSpecs(c);
  ASSERT_TRUE(specs.ok()) << specs.status();
  EXPECT_EQ(specs->front().tie_key(), "embed");
  EXPECT_EQ(specs->back().tie_key(), "embed");
  EXPECT_EQ(specs->back().name(), "LmHead");
  StageModule model = *BuildSequential(*specs, 1234);
  ASSERT_EQ(model->tied_modules().size(), 1u);
  auto& embedding = dynamic_cast<LlamaEmbeddingImpl&>(*model->tied_modules().at("embed"));
  torch::Tensor x = torch::randn({2, 5, 32});
  Activations logits = model->layers().back()->Forward({x}, MicroBatch{});
  EXPECT_TRUE(torch::allclose(logits[0], torch::matmul(x, embedding.tok_embed->weight.t())));
  // One table: 1 embedding, 9 tensors per block, 1 final norm weight.
  EXPECT_EQ(model->parameters().size(), 1u + 2u * 9u + 1u);
  // Untied: the head has its own [vocab, width] weight.
  StageModule untied = *BuildSequential(*MakeLlamaSpecs(Tiny()), 1234);
  EXPECT_EQ(untied->parameters().size(), 1u + 2u * 9u + 1u + 1u);
}

TEST(LlamaTest, LogitsShapeInitialLossAndCausality) {
  torch::manual_seed(0);
  StageModule model = *BuildSequential(*MakeLlamaSpecs(Tiny()), 1234);
  torch::Tensor ids = torch::randint(0, 300, {3, 16}, torch::kLong);
  MicroBatch batch = Batch(ids);
  Activations out = model->Forward({}, batch);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].sizes(), (std::vector<int64_t>{3, 16, 300}));
  EXPECT_NEAR(LlamaLoss(out, batch).item<double>(), std::log(300.0), 0.3);
  torch::Tensor changed = ids.clone();
  changed.index_put_({torch::indexing::Slice(), 9}, (ids.select(1, 9) + 1) % 300);
  torch::Tensor b = model->Forward({}, Batch(changed))[0];
  EXPECT_TRUE(torch::allclose(out[0].slice(1, 0, 9), b.slice(1, 0, 9)));
  EXPECT_FALSE(torch::allclose(out[0].slice(1, 9), b.slice(1, 9)));
  EXPECT_THROW(model->Forward({}, Batch(torch::zeros({1, 17}, torch::kLong))), c10::Error);
}

TEST(LlamaAttentionTest, GroupedQueryEqualsMultiHeadWithRepeatedKvWeights) {
  torch::manual_seed(1);
  LlamaModelConfig gqa = Tiny();  // 4 heads, 2 kv heads, head_dim 8
  LlamaModelConfig mha = gqa;
  mha.set_num_kv_heads(4);
  LlamaAttention grouped(gqa);
  LlamaAttention full(mha);
  {
    torch::NoGradGuard no_grad;
    full->q_proj->weight.copy_(grouped->q_proj->weight);
    full->o_proj->weight.copy_(grouped->o_proj->weight);
    // Query heads 0,1 read kv head 0 and heads 2,3 read kv head 1: repeat each
    // kv head's rows [head_dim, width] twice, consecutively.
    for (auto [dst, src] :
         {std::pair{full->k_proj, grouped->k_proj}, std::pair{full->v_proj, grouped->v_proj}}) {
      dst->weight.copy_(src->weight.view({2, 8, 32}).repeat_interleave(2, 0).reshape({32, 32}));
    }
  }
  torch::Tensor x = torch::randn({2, 7, 32});
  torch::Tensor a = grouped(x);
  torch::Tensor b = full(x);
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-6)) << (a - b).abs().max();
  // Repeating the rows the other way (kv head h % 2) is a different model:
  // the check above can fail.
  {
    torch::NoGradGuard no_grad;
    full->k_proj->weight.copy_(grouped->k_proj->weight.repeat({2, 1}));
  }
  EXPECT_FALSE(torch::allclose(grouped(x), full(x), 1e-5, 1e-6));
}

// On a GPU (LibTorch 2.x) the attention runs LibTorch's fused kernel; on the
// CPU the explicit path. Both are the same function: outputs and gradients
// agree (the GPU kit runs this with TF32 off, tools/gpu/cuda_tests.txt).
TEST(LlamaAttentionTest, FusedOnCudaEqualsTheExplicitPath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(2);
  LlamaAttention attention(Tiny());  // grouped: 4 heads, 2 kv heads
  torch::Tensor x = torch::randn({2, 7, 32}, torch::requires_grad());
  torch::Tensor cpu = attention(x);
  cpu.pow(2).sum().backward();
  const torch::Tensor cpu_x_grad = x.grad().clone();
  const torch::Tensor cpu_q_grad = attention->q_proj->weight.grad().clone();
  attention->zero_grad();
  attention->to(torch::kCUDA);
  torch::Tensor xc = x.detach().to(torch::kCUDA).requires_grad_();
  torch::Tensor gpu = attention(xc);
  gpu.pow(2).sum().backward();
  EXPECT_TRUE(torch::allclose(gpu.cpu(), cpu, 1e-4, 1e-5)) << (gpu.cpu() - cpu).abs().max();
  EXPECT_TRUE(torch::allclose(xc.grad().cpu(), cpu_x_grad, 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(attention->q_proj->weight.grad().cpu(), cpu_q_grad, 1e-4, 1e-5));
}

TEST(RotaryTest, HandComputedRotation) {
  // head_dim 4, theta 100: frequencies 1 and 100^(-1/2) = 0.1; dimension i
  // pairs with i + 2 (rotate-half layout).
  auto [cos, sin] = RotaryTables(3, 4, 100.0, torch::kCPU);
  ASSERT_EQ(cos.sizes(), (std::vector<int64_t>{3, 4}));
  torch::Tensor x = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).expand({3, 4});
  torch::Tensor y = ApplyRotary(x, cos, sin);
  for (int p = 0; p < 3; ++p) {
    const double a = p * 1.0, b = p * 0.1;
    const double want[4] = {1 * std::cos(a) - 3 * std::sin(a), 2 * std::cos(b) - 4 * std::sin(b),
                            3 * std::cos(a) + 1 * std::sin(a), 4 * std::cos(b) + 2 * std::sin(b)};
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(y[p][i].item<double>(), want[i], 1e-6) << "position " << p << " dim " << i;
    }
  }
  // Attention scores depend on the offset only: <R(p)q, R(p+k)k> is the same
  // for every p.
  auto [c, s] = RotaryTables(12, 8, 10000.0, torch::kCPU);
  torch::Tensor q = torch::randn({8}).expand({12, 8});
  torch::Tensor k = torch::randn({8}).expand({12, 8});
  torch::Tensor rq = ApplyRotary(q, c, s);
  torch::Tensor rk = ApplyRotary(k, c, s);
  const double d0 = rq[0].dot(rk[3]).item<double>();
  EXPECT_NEAR(rq[5].dot(rk[8]).item<double>(), d0, 1e-4);
  EXPECT_NEAR(rq[8].dot(rk[11]).item<double>(), d0, 1e-4);
}

TEST(RmsNormTest, HandComputed) {
  RmsNorm norm(2, 0.0);
  {
    torch::NoGradGuard no_grad;
    norm->weight.copy_(torch::tensor({1.0f, 2.0f}));
  }
  // rms of (3, 4) is sqrt(12.5).
  torch::Tensor y = norm(torch::tensor({{3.0f, 4.0f}}));
  EXPECT_NEAR(y[0][0].item<double>(), 3 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(y[0][1].item<double>(), 8 / std::sqrt(12.5), 1e-6);
}

TEST(LlamaConfigTest, BadConfigsNameTheFieldAndValue) {
  auto message = [](LlamaModelConfig c) {
    return std::string(ValidateLlamaModelConfig(c).message());
  };
  LlamaModelConfig c = Tiny();
  c.set_num_kv_heads(3);
  EXPECT_EQ(MakeLlamaSpecs(c).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(message(c), "llama.num_kv_heads (3) must divide llama.num_heads (4)");
  c = Tiny();
  c.set_num_heads(5);
  EXPECT_EQ(message(c), "llama.width (32) must be a multiple of llama.num_heads (5)");
  c = Tiny();
  c.set_num_heads(32);
  c.set_num_kv_heads(1);
  EXPECT_NE(message(c).find("llama.width (32) / llama.num_heads (32) must be even"),
            std::string::npos);
  c = Tiny();
  c.set_intermediate_size(0);
  EXPECT_EQ(message(c), "llama.intermediate_size (0) must be positive");
  c = Tiny();
  c.set_rope_theta(0.5);
  EXPECT_EQ(message(c),
            "llama.rope_theta (0.5) must be finite and in (1, 1e+12] (the base of the rotary "
            "frequencies)");
  c = Tiny();
  c.set_dropout(1.0);
  EXPECT_EQ(message(c), "llama.dropout (1) must be finite and in [0, 1)");
  // Issue #42 class 5: non-finite and absurd reals trained silently (norm_eps
  // inf or 1e300 at a constant loss); every real field is checked finite and
  // bounded.
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const double bad : {inf, -inf, nan, 1e300}) {
    c = Tiny();
    c.set_norm_eps(bad);
    EXPECT_NE(message(c).find("llama.norm_eps ("), std::string::npos) << bad;
    c = Tiny();
    c.set_rope_theta(bad);
    EXPECT_NE(message(c).find("llama.rope_theta ("), std::string::npos) << bad;
    c = Tiny();
    c.set_dropout(bad);
    EXPECT_NE(message(c).find("llama.dropout ("), std::string::npos) << bad;
  }
  c = Tiny();
  c.set_norm_eps(1e300);
  EXPECT_EQ(message(c),
            "llama.norm_eps (1e+300) must be finite and in (0, 1] (a larger epsilon swamps the "
            "activations it normalises)");
  EXPECT_TRUE(ValidateLlamaModelConfig(Tiny()).ok());
}

TEST(LlamaTest, DropoutOnlyInTraining) {
  LlamaModelConfig c = Tiny();
  c.set_dropout(0.5);
  StageModule model = *BuildSequential(*MakeLlamaSpecs(c), 1234);
  MicroBatch batch = Batch(torch::randint(0, 300, {2, 8}, torch::kLong));
  model->eval();
  EXPECT_TRUE(torch::equal(model->Forward({}, batch)[0], model->Forward({}, batch)[0]));
  model->train();
  EXPECT_FALSE(torch::equal(model->Forward({}, batch)[0], model->Forward({}, batch)[0]));
}

}  // namespace
}  // namespace pp
