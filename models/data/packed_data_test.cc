#include "models/data/packed_data.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "models/packed_sequence.h"
#include "pipeline/runtime/micro_batch_source.h"

namespace pp {
namespace {

// Document d holds tokens 1000 d + 1, 1000 d + 2, ... (a token names its
// document and place), lengths drawn from a long tail.
std::vector<std::vector<int64_t>> Documents(int count, uint64_t seed) {
  std::vector<std::vector<int64_t>> docs;
  uint64_t x = seed;
  for (int d = 0; d < count; ++d) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const int64_t r = static_cast<int64_t>((x >> 33) % 100);
    const int64_t length = r < 70 ? 2 + r % 9 : (r < 95 ? 12 + r : 150 + 3 * r);
    std::vector<int64_t> doc;
    for (int64_t i = 0; i < length; ++i) doc.push_back(1000 * d + i + 1);
    docs.push_back(doc);
  }
  return docs;
}

PackingOptions Options() {
  PackingOptions o;
  o.seq_len = 32;
  o.micro_batch_size = 2;
  o.num_microbatches = 3;
  o.seed = 9;
  return o;
}

std::unique_ptr<PackedBatchSource> Make(const std::vector<std::vector<int64_t>>& docs,
                                        const PackingOptions& o,
                                        std::vector<std::vector<bool>> trained = {}) {
  absl::StatusOr<std::unique_ptr<PackedBatchSource>> s =
      PackedBatchSource::FromDocuments(docs, o, std::move(trained));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// An epoch makes every prediction of every document exactly once: a pair
// (input token, label token) of consecutive tokens of one document.
TEST(PackedDataTest, AnEpochMakesEveryPredictionOnce) {
  const auto docs = Documents(60, 3);
  auto source = Make(docs, Options());
  ASSERT_NE(source, nullptr);
  const int64_t global = 3;
  std::multiset<std::pair<int64_t, int64_t>> seen;
  for (int64_t g = 0; g < source->microbatches_per_epoch(); ++g) {
    MicroBatch b = source->AtGlobalIndex(g / global, g % global);
    const torch::Tensor& in = b.Get("input_ids");
    const torch::Tensor& out = b.Get("labels");
    const torch::Tensor& mask = b.Get(kLossMaskKey);
    for (int64_t r = 0; r < in.size(0); ++r) {
      for (int64_t t = 0; t < in.size(1); ++t) {
        if (mask[r][t].item<float>() == 0) continue;
        seen.insert({in[r][t].item<int64_t>(), out[r][t].item<int64_t>()});
      }
    }
  }
  std::multiset<std::pair<int64_t, int64_t>> want;
  for (const auto& d : docs) {
    for (size_t i = 0; i + 1 < d.size(); ++i) want.insert({d[i], d[i + 1]});
  }
  EXPECT_EQ(seen, want);
}

// Within a row each document's positions count from 0, document ids change
// exactly where a document starts, labels are the next token of the same
// document, padding is untrained, rows hold at most seq_len tokens and the
// length is a multiple of length_multiple.
TEST(PackedDataTest, RowsCarryPositionsDocumentsAndMask) {
  PackingOptions o = Options();
  o.length_multiple = 4;
  auto source = Make(Documents(40, 5), o);
  ASSERT_NE(source, nullptr);
  for (int64_t step = 0; step < 8; ++step) {
    for (int64_t i = 0; i < 3; ++i) {
      MicroBatch b = source->AtGlobalIndex(step, i);
      const torch::Tensor in = b.Get("input_ids");
      const torch::Tensor out = b.Get("labels");
      const torch::Tensor pos = b.Get(kPositionIdsKey);
      const torch::Tensor doc = b.Get(kDocumentIdsKey);
      const torch::Tensor mask = b.Get(kLossMaskKey);
      ASSERT_LE(in.size(0), o.micro_batch_size);
      ASSERT_LE(in.size(1), o.seq_len);
      ASSERT_EQ(in.size(1) % 4, 0);
      for (int64_t r = 0; r < in.size(0); ++r) {
        for (int64_t t = 0; t < in.size(1); ++t) {
          const int64_t token = in[r][t].item<int64_t>();
          if (doc[r][t].item<int64_t>() < 0) {  // padding
            EXPECT_EQ(mask[r][t].item<float>(), 0);
            continue;
          }
          EXPECT_EQ(mask[r][t].item<float>(), 1);
          EXPECT_EQ(out[r][t].item<int64_t>(), token + 1) << "label: the next token";
          const bool starts = t == 0 || doc[r][t].item<int64_t>() != doc[r][t - 1].item<int64_t>();
          if (starts) {
            EXPECT_EQ(pos[r][t].item<int64_t>(), 0);
          } else {
            EXPECT_EQ(pos[r][t].item<int64_t>(), pos[r][t - 1].item<int64_t>() + 1);
            EXPECT_EQ(token, in[r][t - 1].item<int64_t>() + 1);
          }
        }
      }
    }
  }
}

// The global batch depends on the seed and the global batch size, not on
// how it is split over data-parallel ranks; a new seed packs differently.
TEST(PackedDataTest, SameGlobalBatchesForEveryDataParallelSplit) {
  const auto docs = Documents(50, 7);
  PackingOptions one = Options();
  one.num_microbatches = 4;
  PackingOptions two = Options();
  two.num_microbatches = 2;
  two.dp_size = 2;
  two.dp_rank = 1;
  auto a = Make(docs, one);
  auto b = Make(docs, two);
  ASSERT_TRUE(a && b);
  for (int64_t step = 0; step < 6; ++step) {
    EXPECT_EQ(a->GlobalLossTokens(step), b->GlobalLossTokens(step));
    for (int64_t i = 0; i < 4; ++i) {
      MicroBatch x = a->AtGlobalIndex(step, i);
      MicroBatch y = b->AtGlobalIndex(step, i);
      EXPECT_EQ(x.id, y.id);
      for (const auto& [name, t] : x.tensors) EXPECT_TRUE(torch::equal(t, y.Get(name))) << name;
    }
    // Rank 1's own micro-batch j is global index 2 + j.
    EXPECT_TRUE(torch::equal(b->Batch(step, 0).Get("input_ids"),
                             a->AtGlobalIndex(step, 2).Get("input_ids")));
  }
  PackingOptions other = one;
  other.seed = 10;
  auto c = Make(docs, other);
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c->Layout(0, 0), a->Layout(0, 0));
}

// global_loss_tokens: the trained tokens of the step's dp x m micro-batches,
// what Get hands the runtime with every micro-batch.
TEST(PackedDataTest, GlobalLossTokensSumTheStep) {
  PackingOptions o = Options();
  o.dp_size = 2;
  auto source = Make(Documents(30, 11), o);
  ASSERT_NE(source, nullptr);
  for (int64_t step = 0; step < 5; ++step) {
    int64_t sum = 0;
    for (int64_t i = 0; i < 6; ++i) {
      sum += static_cast<int64_t>(
          source->AtGlobalIndex(step, i).Get(kLossMaskKey).sum().item<double>());
      EXPECT_EQ(source->TrainedTokens(step, i),
                static_cast<int64_t>(
                    source->AtGlobalIndex(step, i).Get(kLossMaskKey).sum().item<double>()));
    }
    EXPECT_EQ(source->GlobalLossTokens(step), sum);
    absl::StatusOr<MicroBatchData> d = source->Get(step, 5);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->global_loss_tokens, sum);
  }
}

// Fine-tuning masks: only labels marked trained count, a document with none
// is not packed at all.
TEST(PackedDataTest, LossMaskFromTheData) {
  std::vector<std::vector<int64_t>> docs = {{1, 2, 3, 4, 5}, {11, 12, 13}, {21, 22, 23, 24}};
  // Prompt: the first two tokens of each document; document 1 is all prompt.
  std::vector<std::vector<bool>> trained = {
      {false, false, true, true, true}, {false, false, false}, {false, false, true, true}};
  PackingOptions o = Options();
  o.num_microbatches = 1;
  o.micro_batch_size = 1;
  o.seq_len = 16;
  auto source = Make(docs, o, trained);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->microbatches_per_epoch(), 1);
  MicroBatch b = source->AtGlobalIndex(0, 0);
  const torch::Tensor labels = b.Get("labels");
  const torch::Tensor mask = b.Get(kLossMaskKey);
  std::set<int64_t> trained_labels;
  for (int64_t t = 0; t < labels.size(1); ++t) {
    if (mask[0][t].item<float>() > 0) trained_labels.insert(labels[0][t].item<int64_t>());
  }
  EXPECT_EQ(trained_labels, (std::set<int64_t>{3, 4, 5, 23, 24}));
  EXPECT_EQ(labels.size(1), 4 + 3) << "document 1 (no trained label) is dropped";
  EXPECT_EQ(source->GlobalLossTokens(0), 5);
}

// A document longer than a row is cut into pieces of seq_len + 1 tokens
// that overlap by one token, each its own attention span.
TEST(PackedDataTest, LongDocumentsAreCutIntoOverlappingPieces) {
  std::vector<int64_t> doc;
  for (int64_t i = 1; i <= 20; ++i) doc.push_back(i);
  PackingOptions o = Options();
  o.seq_len = 8;
  o.micro_batch_size = 1;
  o.num_microbatches = 1;
  auto source = Make({doc}, o);
  ASSERT_NE(source, nullptr);
  std::vector<DocumentSpan> pieces;
  for (int64_t g = 0; g < source->microbatches_per_epoch(); ++g) {
    for (const auto& row : source->Layout(g, 0)) {
      pieces.insert(pieces.end(), row.begin(), row.end());
    }
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const DocumentSpan& a, const DocumentSpan& b) { return a.start < b.start; });
  EXPECT_EQ(pieces, (std::vector<DocumentSpan>{{0, 9}, {8, 9}, {16, 4}}));
}

// Cost balancing (PackingBalance::kCost) narrows the spread of estimated
// cost over micro-batches against equal-token packing, on the same pieces.
TEST(PackedDataTest, CostBalancingNarrowsTheCostSpread) {
  const auto docs = Documents(300, 13);
  PackingOptions o = Options();
  o.seq_len = 512;
  o.micro_batch_size = 1;
  o.cost_linear_tokens = 32;
  auto spread = [&](PackingBalance balance) {
    PackingOptions p = o;
    p.balance = balance;
    auto source = Make(docs, p);
    double lo = 1e300, hi = 0;
    for (int64_t g = 0; g < source->microbatches_per_epoch(); ++g) {
      const double c = source->Cost(g / 3, g % 3);
      lo = std::min(lo, c);
      hi = std::max(hi, c);
    }
    return hi / lo;
  };
  const double tokens = spread(PackingBalance::kTokens);
  const double cost = spread(PackingBalance::kCost);
  EXPECT_LT(cost, tokens / 2) << "max/min cost: " << cost << " balanced vs " << tokens;
}

// The padded baseline (data.packing "padded"): one document per row, every
// row as long as the context.
TEST(PackedDataTest, PaddedModeHoldsOneDocumentPerFullRow) {
  PackingOptions o = Options();
  ASSERT_TRUE(ApplyPackingMode("padded", "tokens", o).ok());
  auto source = Make(Documents(40, 5), o);
  ASSERT_NE(source, nullptr);
  for (int64_t i = 0; i < 3; ++i) {
    for (const auto& row : source->Layout(0, i)) EXPECT_EQ(row.size(), 1u);
    EXPECT_EQ(source->AtGlobalIndex(0, i).Get("input_ids").size(1), o.seq_len);
  }
  absl::Status bad = ApplyPackingMode("packed", "tokens", o);
  EXPECT_NE(bad.message().find("data.packing 'packed'"), std::string::npos) << bad;
  bad = ApplyPackingMode("documents", "flops", o);
  EXPECT_NE(bad.message().find("data.packing_balance 'flops'"), std::string::npos) << bad;
}

// order_by_cost: the step's micro-batches are the same set, sorted
// heaviest first and dealt round-robin to the ranks: every rank's costs fall
// with the index, and rank 0's j-th is at least rank 1's j-th.
TEST(PackedDataTest, OrderByCostSortsEachStepAndDealsToRanks) {
  const auto docs = Documents(120, 17);
  PackingOptions o = Options();
  o.dp_size = 2;
  o.num_microbatches = 4;
  auto plain = Make(docs, o);
  o.order_by_cost = true;
  auto sorted = Make(docs, o);
  ASSERT_TRUE(plain && sorted);
  for (int64_t step = 0; step < 5; ++step) {
    std::multiset<double> a, b;
    for (int64_t i = 0; i < 8; ++i) {
      a.insert(plain->Cost(step, i));
      b.insert(sorted->Cost(step, i));
    }
    EXPECT_EQ(a, b);
    EXPECT_EQ(plain->GlobalLossTokens(step), sorted->GlobalLossTokens(step));
    const std::vector<double> r0 = sorted->ReplicaCosts(step, 0);
    const std::vector<double> r1 = sorted->ReplicaCosts(step, 1);
    for (size_t j = 0; j < r0.size(); ++j) {
      EXPECT_GE(r0[j], r1[j]);
      if (j > 0) {
        EXPECT_LE(r0[j], r1[j - 1]);
      }
    }
  }
}

TEST(PackedDataTest, BadInputIsNamed) {
  PackingOptions o = Options();
  o.seq_len = 0;
  absl::StatusOr<std::unique_ptr<PackedBatchSource>> s =
      PackedBatchSource::FromDocuments({{1, 2, 3}}, o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("seq_len (0)"), std::string::npos) << s.status();
  s = PackedBatchSource::FromDocuments({{1}, {}}, Options());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("no document with a trained prediction"), std::string::npos)
      << s.status();
  s = PackedBatchSource::FromDocuments({{1, 2}}, Options(), {{true}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("1 mask entries"), std::string::npos) << s.status();
}

void WriteTokens(const std::string& path, const std::vector<int64_t>& tokens) {
  std::string bytes;
  for (int64_t t : tokens) {
    bytes.push_back(static_cast<char>(t & 0xff));
    bytes.push_back(static_cast<char>((t >> 8) & 0xff));
  }
  std::ofstream(path, std::ios::binary) << bytes;
}

// A flat token file is cut after every end-of-text token: each document ends
// with it (its last prediction is the document's end) and none attends
// across it.
TEST(PackedDataTest, FlatFilesSplitAfterTheEndOfTextToken) {
  const std::string path = absl::StrCat(testing::TempDir(), "/packed_flat.bin");
  WriteTokens(path, {5, 6, 7, 0, 8, 9, 0, 10, 11, 12, 13, 0});
  TokenDataOptions file;
  file.path = path;
  file.vocab_size = 20;
  PackingOptions o = Options();
  o.num_microbatches = 1;
  o.micro_batch_size = 4;
  absl::StatusOr<std::unique_ptr<PackedBatchSource>> source = PackTokenFile(file, 0, o);
  ASSERT_TRUE(source.ok()) << source.status();
  std::vector<DocumentSpan> pieces;
  for (const auto& row : (*source)->Layout(0, 0))
    pieces.insert(pieces.end(), row.begin(), row.end());
  std::sort(pieces.begin(), pieces.end(),
            [](const DocumentSpan& a, const DocumentSpan& b) { return a.start < b.start; });
  EXPECT_EQ(pieces, (std::vector<DocumentSpan>{{0, 4}, {4, 3}, {7, 5}}));
  EXPECT_EQ((*source)->GlobalLossTokens(0), 3 + 2 + 4);
  // A loss mask beside the file (fine-tuning data): only its labels train.
  std::ofstream(path + ".loss_mask", std::ios::binary)
      << std::string("\0\0\1\1\0\1\1\0\0\1\1\1", 12);
  absl::StatusOr<std::unique_ptr<PackedBatchSource>> masked = PackTokenFile(file, 0, o);
  ASSERT_TRUE(masked.ok()) << masked.status();
  EXPECT_EQ((*masked)->GlobalLossTokens(0), 2 + 2 + 3);  // labels 1-3, 5-6, 8-11
  std::remove((path + ".loss_mask").c_str());
  absl::StatusOr<std::unique_ptr<PackedBatchSource>> bad = PackTokenFile(file, 20, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("data.eos_token (20)"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace pp
