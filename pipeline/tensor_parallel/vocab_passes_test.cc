#include "pipeline/tensor_parallel/vocab_passes.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <string>

#include "gtest/gtest.h"
#include "pipeline/tensor_parallel/mappings.h"
#include "pipeline/tensor_parallel/planted_fault.h"
#include "pipeline/tensor_parallel/tp_testing.h"

namespace pp {
namespace tensor_parallel {
namespace {

// The passes on p thread ranks (a real Gloo group standing in for the pipe
// group), with the collectives the runtime will run between them, against the
// dense layers and autograd.
constexpr int64_t kIgnore = -100, kDim = 8, kBatch = 3, kSeq = 5;

struct PassCase {
  int64_t parts;
  int64_t vocab;
  torch::Dtype dtype;
  double tolerance;  // bounds RelativeDiff of the loss and every gradient
  std::string name;
};

// Mistakes planted on the passes' side (test-local: the production code has
// no hooks) that the comparison with the dense model must notice.
enum class Fault {
  kNone,
  // The sums of exps added as they come, without rescaling to the global max
  // (every rank's max in the gathered statistics replaced by the global one).
  kNoRescale,
  // Each rank combines as though its own max were every rank's.
  kLocalMax,
  // The passes are told rows [begin + 1, end + 1) for the rows [begin, end)
  // they hold: an off-by-one range.
  kShiftedRange,
};

struct Inputs {
  torch::Tensor hidden;   // [kBatch, kSeq, kDim]
  torch::Tensor table;    // [vocab, kDim]: the output layer's or the embedding's
  torch::Tensor targets;  // [kBatch, kSeq]: two ignored, one the last real row
};

Inputs MakeInputs(const PassCase& c) {
  Inputs in;
  // Logits of a few units, so that the ranks' maxes differ widely.
  in.hidden = Seeded(1, [] { return torch::randn({kBatch, kSeq, kDim}) * 2; }).to(c.dtype);
  in.table = Seeded(2, [&] { return torch::randn({c.vocab, kDim}); }).to(c.dtype);
  in.targets = Seeded(3, [&] { return torch::randint(c.vocab, {kBatch, kSeq}); });
  in.targets[0][1] = kIgnore;
  in.targets[2][3] = kIgnore;
  in.targets[1][0] = c.vocab - 1;
  return in;
}

VocabRange RangeFor(const ModelParallelGroup& g, int64_t vocab, Fault fault) {
  VocabRange range = LocalVocabRange(vocab, g);
  if (fault == Fault::kShiftedRange) {
    ++range.begin;
    ++range.end;
  }
  return range;
}

// The largest RelativeDiff of each quantity over the ranks (NaN counts as
// infinite), and whether every rank combined to the same bits.
struct Diffs {
  double loss = 0;
  double grad_hidden = 0;
  double grad_weight = 0;
  bool ranks_agree = true;
  // The one-barrier algorithm (OutputPartialGrad, RescaleOutputPartial,
  // OutputTWeightGrad): its summed hidden states' gradient against the dense
  // one and against the two-barrier sum, and whether its weight gradient has
  // OutputT's bits.
  double grad_hidden_one_barrier = 0;
  double one_vs_two_barriers = 0;
  bool weight_grad_bits_equal = true;

  double Worst() const { return std::max({loss, grad_hidden, grad_weight}); }
};

void TakeWorst(double* worst, double d) {
  *worst = std::max(*worst, std::isnan(d) ? std::numeric_limits<double>::infinity() : d);
}

// S, all-gather, Combine, T and the all-reduce of the hidden states'
// gradient, for the mean loss over the counted tokens, against
// cross_entropy(hidden @ table^T) (softmax in float32) and autograd.
Diffs OutputLayerDiffs(const PassCase& c, Fault fault) {
  const Inputs in = MakeInputs(c);
  torch::Tensor dense_hidden = in.hidden.clone().requires_grad_(true);
  torch::Tensor dense_table = in.table.clone().requires_grad_(true);
  const torch::Tensor dense_loss = torch::nn::functional::cross_entropy(
      torch::matmul(dense_hidden, dense_table.t()).reshape({-1, c.vocab}).to(torch::kFloat32),
      in.targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnore));
  dense_loss.backward();

  std::mutex mu;
  Diffs diffs;
  ExpectOk(RunOnTensorParallelRanks(c.parts, false, [&](const ModelParallelGroup& g) {
    const torch::Tensor weight = LocalVocabRows(in.table, g);
    const OutputSResult s =
        OutputS(in.hidden, weight, in.targets, c.vocab, RangeFor(g, c.vocab, fault), kIgnore);
    EXPECT_TRUE(s.stats.is_contiguous());
    torch::Tensor gathered = AllGather(s.stats.unsqueeze(0), g, 0, "the output statistics");
    ASSERT_EQ(gathered.sizes(), (std::vector<int64_t>{c.parts, kBatch * kSeq, 3}));
    torch::Tensor maxes = gathered.select(2, kStatMax);
    if (fault == Fault::kNoRescale) maxes.copy_(std::get<0>(maxes.max(0)).expand_as(maxes));
    if (fault == Fault::kLocalMax) maxes.copy_(s.stats.select(1, kStatMax).expand_as(maxes));
    const CombinedOutputStats combined = CombineOutputStats(gathered, in.targets, kIgnore);

    const torch::Tensor counted = in.targets != kIgnore;
    const double count = counted.sum().item<double>();
    const OutputGrads grads =
        OutputT(s, combined, counted.to(torch::kFloat32) / count, in.hidden, weight);
    torch::Tensor grad_hidden = grads.grad_hidden_partial.clone();
    AllReduceInPlace(grad_hidden, g, ReduceOp::kSum, "the hidden states' gradient");
    EXPECT_EQ(grad_hidden.scalar_type(), torch::kFloat32);  // rounded by the caller
    EXPECT_EQ(grads.grad_weight.scalar_type(), c.dtype);

    // The one-barrier algorithm from the same S: the partial relative to the
    // rank's own max, rescaled once the stats are combined, then summed.
    const torch::Tensor partial = OutputPartialGrad(s, weight);
    EXPECT_EQ(partial.scalar_type(), torch::kFloat32);
    torch::Tensor one_barrier =
        RescaleOutputPartial(s, combined, partial, counted.to(torch::kFloat32) / count, weight);
    EXPECT_EQ(one_barrier.sizes(), grads.grad_hidden_partial.sizes());
    if (fault == Fault::kNone) {
      EXPECT_FALSE(one_barrier.isnan().any().item<bool>());
    }
    AllReduceInPlace(one_barrier, g, ReduceOp::kSum, "the one-barrier hidden states' gradient");
    const bool weight_bits = torch::equal(
        OutputTWeightGrad(s, combined, counted.to(torch::kFloat32) / count, in.hidden, weight),
        grads.grad_weight);

    // Every rank's combined statistics, to compare their bits.
    const torch::Tensor mine =
        torch::stack({combined.max, combined.sum_exp, combined.target_logit, combined.loss})
            .unsqueeze(0)
            .contiguous();
    const torch::Tensor all = AllGather(mine, g, 0, "the combined statistics");
    bool agree = true;
    for (int64_t r = 1; r < c.parts; ++r) agree = agree && torch::equal(all[r], all[0]);

    const VocabRange range = LocalVocabRange(c.vocab, g);
    if (fault == Fault::kNone && range.begin >= c.vocab) {
      // A rank of padding only sends max -inf, sum 0, target 0; it gets a zero
      // weight gradient and its part of the hidden states' gradient is 0.
      EXPECT_TRUE(torch::all(s.stats.select(1, kStatMax).isneginf()).item<bool>());
      EXPECT_EQ(s.stats.narrow(1, kStatSumExp, 2).abs().max().item<double>(), 0.0);
      EXPECT_EQ(grads.grad_weight.abs().max().item<double>(), 0.0);
      EXPECT_EQ(grads.grad_hidden_partial.abs().max().item<double>(), 0.0);
      EXPECT_EQ(partial.abs().max().item<double>(), 0.0);
    }
    const int64_t real = std::clamp<int64_t>(c.vocab - range.begin, 0, range.end - range.begin);
    if (fault == Fault::kNone && real < range.end - range.begin) {
      EXPECT_EQ(grads.grad_weight.narrow(0, real, range.end - range.begin - real)
                    .abs()
                    .max()
                    .item<double>(),
                0.0)
          << "padding rows get no gradient";
    }

    std::lock_guard<std::mutex> lock(mu);
    TakeWorst(&diffs.loss, RelativeDiff(combined.loss.sum() / count, dense_loss));
    TakeWorst(&diffs.grad_hidden, RelativeDiff(grad_hidden, dense_hidden.grad()));
    TakeWorst(&diffs.grad_weight,
              RelativeDiff(grads.grad_weight, LocalVocabRows(dense_table.grad(), g)));
    diffs.ranks_agree = diffs.ranks_agree && agree;
    TakeWorst(&diffs.grad_hidden_one_barrier, RelativeDiff(one_barrier, dense_hidden.grad()));
    TakeWorst(&diffs.one_vs_two_barriers, RelativeDiff(one_barrier, grad_hidden));
    diffs.weight_grad_bits_equal = diffs.weight_grad_bits_equal && weight_bits;
  }));
  return diffs;
}

// The summed EmbeddingPartial against torch::embedding of the whole table,
// and EmbeddingWeightGrad against autograd's gradient of the table's rows
// (ids repeat): the larger RelativeDiff over the ranks.
double EmbeddingDiff(const PassCase& c, Fault fault) {
  const Inputs in = MakeInputs(c);
  torch::Tensor ids = Seeded(4, [&] { return torch::randint(c.vocab, {kBatch, kSeq}); });
  ids[0][0] = c.vocab - 1;
  ids[2][4] = c.vocab - 1;
  ids[1][1] = 0;
  ids[1][2] = 0;
  const torch::Tensor grad_output = Seeded(5, [] {
                                      return torch::randn({kBatch, kSeq, kDim});
                                    }).to(c.dtype);
  torch::Tensor dense_table = in.table.clone().requires_grad_(true);
  const torch::Tensor dense = torch::embedding(dense_table, ids);
  dense.backward(grad_output);

  std::mutex mu;
  double worst = 0;
  ExpectOk(RunOnTensorParallelRanks(c.parts, false, [&](const ModelParallelGroup& g) {
    const torch::Tensor weight = LocalVocabRows(in.table, g);
    const VocabRange range = RangeFor(g, c.vocab, fault);
    torch::Tensor sum = EmbeddingPartial(ids, weight, range).contiguous();
    AllReduceInPlace(sum, g, ReduceOp::kSum, "the partial embeddings");
    const torch::Tensor grad = EmbeddingWeightGrad(ids, grad_output, weight, range);
    EXPECT_EQ(grad.scalar_type(), c.dtype);
    // One rank holds each id and the others add zeros: exact.
    const double forward = RelativeDiff(sum, dense.detach());
    if (fault == Fault::kNone) {
      EXPECT_EQ(forward, 0.0);
    }
    const double backward = RelativeDiff(grad, LocalVocabRows(dense_table.grad(), g));
    std::lock_guard<std::mutex> lock(mu);
    TakeWorst(&worst, forward);
    TakeWorst(&worst, backward);
  }));
  return worst;
}

class VocabPassesTest : public ::testing::TestWithParam<PassCase> {};

TEST_P(VocabPassesTest, OutputLayerEqualsTheDenseLossAndGradients) {
  const PassCase c = GetParam();
  const Diffs diffs = OutputLayerDiffs(c, Fault::kNone);
  EXPECT_LE(diffs.loss, c.tolerance) << "loss";
  EXPECT_LE(diffs.grad_hidden, c.tolerance) << "hidden states' gradient";
  EXPECT_LE(diffs.grad_weight, c.tolerance) << "weight gradient";
  EXPECT_TRUE(diffs.ranks_agree) << "the combined statistics differ between ranks";
}

// The one-barrier algorithm (the paper's Vocab-1) gives the two-barrier
// gradients: the hidden states' to fp32 round-off (the same terms, summed in
// another order), the weight's bit for bit. A rank of padding only
// contributes 0, not NaN; ignored targets contribute nothing.
TEST_P(VocabPassesTest, OneBarrierEqualsTwoBarriersAndTheDense) {
  const PassCase c = GetParam();
  const Diffs diffs = OutputLayerDiffs(c, Fault::kNone);
  EXPECT_LE(diffs.grad_hidden_one_barrier, c.tolerance) << "against dense autograd";
  if (c.dtype == torch::kFloat32) {
    EXPECT_LE(diffs.one_vs_two_barriers, 1e-6) << "against the two-barrier sum";
  } else {
    // bf16: the two-barrier path rounds d loss / d logits to bf16 before its
    // matmul, the one-barrier one keeps the exps in fp32.
    EXPECT_LE(diffs.one_vs_two_barriers, c.tolerance) << "against the two-barrier sum";
  }
  EXPECT_TRUE(diffs.weight_grad_bits_equal) << "OutputTWeightGrad is OutputT's grad_weight";
}

TEST_P(VocabPassesTest, EmbeddingEqualsTheDenseTable) {
  const PassCase c = GetParam();
  EXPECT_LE(EmbeddingDiff(c, Fault::kNone), c.tolerance);
}

// 11 rows: unpadded at p = 1, one padding row at p = 2 (12 = 2 x 6) and at
// p = 3 (12 = 3 x 4); 5 rows over p = 4: 2 rows each, rank 2 holds a real row
// and a padding row, rank 3 padding only. fp32 differs from the dense model by
// round-off (about 3e-7). bf16 keeps 8 significant bits (a step of 2^-8 = 4e-3
// relative): each rank's part of the hidden states' gradient is rounded to
// bf16 before the all-reduce adds them, where the dense matmul rounds once, and
// autograd adds repeated ids' embedding gradients in bf16 where
// EmbeddingWeightGrad adds in float32; so the two sides differ by about one
// step (5e-3 seen), and 2e-2 leaves room for a few.
INSTANTIATE_TEST_SUITE_P(
    Cases, VocabPassesTest,
    ::testing::Values(PassCase{1, 11, torch::kFloat32, 1e-5, "p1_fp32"},
                      PassCase{2, 11, torch::kFloat32, 1e-5, "p2_fp32"},
                      PassCase{3, 11, torch::kFloat32, 1e-5, "p3_fp32"},
                      PassCase{4, 5, torch::kFloat32, 1e-5, "p4_padding_rank_fp32"},
                      PassCase{1, 11, torch::kBFloat16, 2e-2, "p1_bf16"},
                      PassCase{2, 11, torch::kBFloat16, 2e-2, "p2_bf16"},
                      PassCase{3, 11, torch::kBFloat16, 2e-2, "p3_bf16"},
                      PassCase{4, 5, torch::kBFloat16, 2e-2, "p4_padding_rank_bf16"}),
    [](const ::testing::TestParamInfo<PassCase>& info) { return info.param.name; });

// The comparison has teeth: each planted mistake moves the loss or a gradient
// far past the tolerance. (p = 1 has nothing to rescale, so p >= 2 here.)
TEST(VocabPassesFaultTest, PlantedFaultsFailTheComparison) {
  for (const PassCase& c : {PassCase{3, 11, torch::kFloat32, 1e-5, "p3"},
                            PassCase{4, 5, torch::kFloat32, 1e-5, "p4_padding_rank"}}) {
    SCOPED_TRACE(c.name);
    EXPECT_GT(OutputLayerDiffs(c, Fault::kNoRescale).loss, 1e-2) << "sums not rescaled";
    const Diffs local_max = OutputLayerDiffs(c, Fault::kLocalMax);
    EXPECT_GT(local_max.Worst(), 1e-2) << "local max";
    EXPECT_FALSE(local_max.ranks_agree) << "each rank's own max must differ between ranks";
    EXPECT_GT(OutputLayerDiffs(c, Fault::kShiftedRange).Worst(), 1e-2) << "shifted range";
    EXPECT_GT(EmbeddingDiff(c, Fault::kShiftedRange), 1e-2) << "shifted embedding range";
    const internal::PlantedFault previous =
        internal::PlantFault(internal::PlantedFault::kVocabPartialNotRescaled);
    const double not_rescaled = OutputLayerDiffs(c, Fault::kNone).grad_hidden_one_barrier;
    internal::PlantFault(previous);
    EXPECT_GT(not_rescaled, 1e-2) << "one-barrier partial not rescaled";
  }
}

// Runs `f`, which must throw c10::Error whose message holds every `want`.
template <typename Fn>
void ExpectRefused(Fn f, std::initializer_list<const char*> want) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    for (const char* w : want) EXPECT_NE(what.find(w), std::string::npos) << w << " in " << what;
  }
}

TEST(VocabPassesRefusesTest, BadShapesAreNamed) {
  const torch::Tensor targets = torch::zeros({2, 3}, torch::kLong);
  const VocabRange range{0, 4};
  ExpectRefused(
      [&] {
        OutputS(torch::zeros({2, 3, 5}), torch::zeros({4, 4}), targets, 8, range);
      },
      {"hidden states of shape [2, 3, 5]", "weight of shape [4, 4]"});
  ExpectRefused(
      [&] {
        OutputS(torch::zeros({2, 3, 4}), torch::zeros({3, 4}), targets, 8, range);
      },
      {"weight of shape [3, 4]", "rows [0, 4)"});
  ExpectRefused(
      [&] {
        OutputS(torch::zeros({2, 4, 4}), torch::zeros({4, 4}), targets, 8, range);
      },
      {"targets of shape [2, 3]", "[2, 4, 4]"});
  ExpectRefused(
      [&] {
        CombineOutputStats(torch::zeros({2, 6, 2}), targets);
      },
      {"shape [2, 6, 2]", "[p, N, 3]", "N = 6"});
  ExpectRefused(
      [&] {
        CombineOutputStats(torch::zeros({2, 5, 3}), targets);
      },
      {"shape [2, 5, 3]", "N = 6"});
  ExpectRefused(
      [&] {
        EmbeddingWeightGrad(targets, torch::zeros({2, 3, 5}), torch::zeros({4, 4}), range);
      },
      {"output gradient of shape [2, 3, 5]", "ids of shape [2, 3]"});
  ExpectRefused(
      [&] {
        OutputS(torch::zeros({2, 3, 4}), torch::zeros({4, 4}), targets + 9, 8, range);
      },
      {"target id 9 is outside [0, 8)"});
}

}  // namespace
}  // namespace tensor_parallel
}  // namespace pp
