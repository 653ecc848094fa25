// Packed variable-length documents (models/data/packed_data.h) through the
// pipeline: GPT and LLaMA trained on micro-batches of whole documents (each
// attending only to itself, positions restarting, the loss per token over the
// global batch) equal ToSequential() trained on the same micro-batches.
// A covering set, not the product: GPT under every registered training
// schedule at pp 2 (two chunks where the schedule takes them), at dp 2 with
// 1F1B and ZB-V, at tp 2 with sequence parallelism; LLaMA (rotary positions
// per document, grouped-query attention) with 1F1B, interleaved 1F1B at dp 2
// and ZB-V; vocabulary parallelism (GPT under zbv_vocab at dp 2, LLaMA under
// 1f1b_vocab). The teeth: a document that attends across its boundary, GPT's
// positions that do not restart, and the loss as a mean of micro-batch means
// (also through the vocabulary passes) each move the result out of the bound.
#include <gtest/gtest.h>

#include <cctype>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "models/config_testing.h"
#include "models/data/packed_data.h"
#include "models/gpt/gpt.h"
#include "models/llama/llama.h"
#include "models/packed_sequence.h"
#include "pipeline/runtime/equivalence_testing.h"
#include "pipeline/schedule/schedules/registry.h"

namespace pp {
namespace {

using testing_runtime::CompareResults;
using testing_runtime::RunConfig;
using testing_runtime::RunResult;
using testing_runtime::TrainPipeline;
using testing_runtime::TrainSequential;

constexpr double kRtol = 1e-5;
constexpr int64_t kContext = 16;

// Byte documents of 2 to 23 tokens cut from a text at lengths drawn from a
// fixed generator: rows hold several documents, some documents two rows.
std::vector<std::vector<int64_t>> Documents() {
  std::string text;
  for (int i = 0; i < 40; ++i) {
    text += absl::StrCat("Stage ", i % 7, " sends activations to stage ", (i + 1) % 7,
                         ". Bubbles waste time! ");
  }
  std::vector<std::vector<int64_t>> docs;
  uint64_t x = 17;
  size_t at = 0;
  while (at < text.size()) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const size_t length = 2 + (x >> 33) % 22;
    const std::string piece = text.substr(at, length);
    docs.emplace_back(piece.begin(), piece.end());
    at += length;
  }
  return docs;
}

// A source with one side input removed (the teeth).
class WithoutKey : public MicroBatchSource {
 public:
  WithoutKey(std::unique_ptr<MicroBatchSource> inner, std::string key)
      : inner_(std::move(inner)), key_(std::move(key)) {}
  absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) override {
    absl::StatusOr<MicroBatchData> d = inner_->Get(step, index);
    if (d.ok()) d->batch.tensors.erase(key_);
    return d;
  }

 private:
  std::unique_ptr<MicroBatchSource> inner_;
  std::string key_;
};

void UsePacked(RunConfig& c, int64_t length_multiple = 1, const std::string& drop = "") {
  const int dp = c.dp, m = c.microbatches;
  c.source = [dp, m, length_multiple, drop]() -> std::unique_ptr<MicroBatchSource> {
    PackingOptions o;
    o.seq_len = kContext;
    o.micro_batch_size = 2;
    o.num_microbatches = m;
    o.dp_size = dp;
    o.seed = 5;
    o.length_multiple = length_multiple;
    std::unique_ptr<MicroBatchSource> source = *PackedBatchSource::FromDocuments(Documents(), o);
    if (drop.empty()) return source;
    return std::make_unique<WithoutKey>(std::move(source), drop);
  };
}

GptModelConfig PackedGpt() {
  GptModelConfig c =
      ParseModelConfig<GptModelConfig>("vocab_size: 260 width: 16 num_heads: 2 num_layers: 4");
  c.set_context_length(kContext);
  return c;
}

LlamaModelConfig PackedLlama() {
  LlamaModelConfig c = ParseModelConfig<LlamaModelConfig>(
      "vocab_size: 260 width: 16 num_heads: 4 num_kv_heads: 2 num_layers: 4 "
      "intermediate_size: 24 rope_theta: 500.0 tie_embeddings: true");
  c.set_context_length(kContext);
  return c;
}

void UseGpt(RunConfig& c) {
  c.specs = [] { return *MakeGptSpecs(PackedGpt()); };
  c.loss = GptLoss;
  c.partition_method = "type:TransformerBlock";
  UsePacked(c);
}

void UseLlama(RunConfig& c) {
  c.specs = [] { return *MakeLlamaSpecs(PackedLlama()); };
  c.loss = LlamaLoss;
  c.partition_method = "type:LlamaBlock";
  UsePacked(c);
}

// The model under vocabulary parallelism, SGD with momentum as the
// vocabulary suite trains it (the head input's gradient is a sum of every
// rank's share; SGD keeps that round-off linear).
RunConfig Vocab(RunConfig c, bool llama) {
  llama ? UseLlama(c) : UseGpt(c);
  c.vocabulary = [llama] {
    return llama ? *MakeLlamaVocabularySplit(PackedLlama()) : *MakeGptVocabularySplit(PackedGpt());
  };
  c.optimizer.name = "sgd";
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.9;
  c.optimizer.weight_decay = 0;
  return c;
}

bool TakesTwoChunks(const std::string& schedule) {
  ScheduleOptions o;
  o.num_stages = 2;
  o.num_microbatches = 4;
  o.num_chunks = 2;
  return MakeSchedule(schedule, o).ok();
}

RunConfig Base(const std::string& schedule, int dp) {
  RunConfig c;
  c.schedule = schedule;
  c.pp = 2;
  c.dp = dp;
  c.chunks = TakesTwoChunks(schedule) ? 2 : 1;
  c.microbatches = 4;
  c.steps = 3;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 0.01;
  c.optimizer.weight_decay = 0.01;
  return c;
}

struct Case {
  RunConfig config;
  std::string name;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::string Name(std::string name) {
  for (char& ch : name) {
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const ScheduleInfo& info : RegisteredSchedules()) {
    RunConfig c = Base(info.name, 1);
    ScheduleOptions o;
    o.num_stages = 2;
    o.num_microbatches = 4;
    o.num_chunks = c.chunks;
    absl::StatusOr<Schedule> s = MakeSchedule(info.name, o);
    // The vocabulary schedules are covered below, with the tables split.
    if (!s.ok() || s->forward_only || s->vocab_parallel) continue;
    UseGpt(c);
    cases.push_back({c, Name(absl::StrCat("gpt_", info.name, "_pp2_dp1_v", c.chunks))});
  }
  for (const std::string schedule : {"1f1b", "zbv"}) {
    RunConfig c = Base(schedule, 2);
    UseGpt(c);
    cases.push_back({c, Name(absl::StrCat("gpt_", schedule, "_pp2_dp2_v", c.chunks))});
  }
  // tp 2 with sequence parallelism: every micro-batch's length a multiple of
  // 2. SGD, as the model equivalence test's tp cases (round-off of the
  // row-parallel sums stays round-off).
  {
    RunConfig c = Base("1f1b", 1);
    c.tp = 2;
    c.sequence_parallel = true;
    c.optimizer.name = "sgd";
    c.optimizer.lr = 0.1;
    c.optimizer.momentum = 0.9;
    c.optimizer.weight_decay = 0;
    UseGpt(c);
    UsePacked(c, /*length_multiple=*/2);
    c.parallel_loss = [](const ModelParallelGroup& group) -> LossFn {
      return [group](const Activations& outputs, const MicroBatch& batch) {
        return GptParallelLoss(outputs, batch, PackedGpt().vocab_size(), group);
      };
    };
    cases.push_back({c, "gpt_tp2_sp_1f1b_pp2_dp1_v1"});
  }
  for (const auto& [schedule, dp] :
       {std::pair<std::string, int>{"1f1b", 1}, {"interleaved_1f1b", 2}, {"zbv", 1}}) {
    RunConfig c = Base(schedule, dp);
    UseLlama(c);
    cases.push_back({c, Name(absl::StrCat("llama_", schedule, "_pp2_dp", dp, "_v", c.chunks))});
  }
  // Vocabulary parallelism (the tables split over the pipe ranks, the loss
  // per token through its passes): GPT under zbv_vocab at dp 2, LLaMA under
  // 1f1b_vocab.
  for (const bool llama : {false, true}) {
    RunConfig c = Vocab(Base(llama ? "1f1b_vocab" : "zbv_vocab", llama ? 1 : 2), llama);
    cases.push_back(
        {c, llama ? "llama_vocab_1f1b_vocab_pp2_dp1_v1" : "gpt_vocab_zbv_vocab_pp2_dp2_v2"});
  }
  return cases;
}

class PackedEquivalenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(PackedEquivalenceTest, PipelineEqualsSequential) {
  const RunConfig& config = GetParam().config;
  absl::StatusOr<RunResult> pipeline = TrainPipeline(config);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  absl::StatusOr<RunResult> sequential = TrainSequential(config);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  EXPECT_EQ(CompareResults(*sequential, *pipeline, kRtol), "");
  EXPECT_LT(pipeline->losses.back(), pipeline->losses.front());
}

INSTANTIATE_TEST_SUITE_P(Packed, PackedEquivalenceTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// Against the reference on the packed documents, the pipeline fails when a
// document attends across its boundary (no document_ids), when positions do
// not restart (no position_ids), or when the loss is the mean of micro-batch
// means; GPT and LLaMA each.
TEST(PackedTeethTest, BoundariesPositionsAndNormalisationEachMatter) {
  for (const bool llama : {false, true}) {
    RunConfig c = Base("1f1b", 2);
    llama ? UseLlama(c) : UseGpt(c);
    absl::StatusOr<RunResult> sequential = TrainSequential(c);
    ASSERT_TRUE(sequential.ok()) << sequential.status();
    absl::StatusOr<RunResult> right = TrainPipeline(c);
    ASSERT_TRUE(right.ok()) << right.status();
    EXPECT_EQ(CompareResults(*sequential, *right, kRtol), "");
    for (const std::string key : {kDocumentIdsKey, kPositionIdsKey}) {
      RunConfig wrong = c;
      UsePacked(wrong, 1, key);
      absl::StatusOr<RunResult> run = TrainPipeline(wrong);
      ASSERT_TRUE(run.ok()) << run.status();
      // Rotary embeddings depend only on the distance between query and
      // key, and the document mask keeps both in one document: for LLaMA,
      // positions that do not restart are the same model up to round-off.
      // GPT's learned positions are absolute.
      if (llama && key == kPositionIdsKey) {
        EXPECT_EQ(CompareResults(*sequential, *run, kRtol), "");
        continue;
      }
      EXPECT_NE(CompareResults(*sequential, *run, kRtol), "") << key << (llama ? " llama" : " gpt");
    }
    RunConfig means = c;
    means.loss_normalization_fault = LossNormalizationFault::kMicroBatchMean;
    absl::StatusOr<RunResult> run = TrainPipeline(means);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_NE(CompareResults(*sequential, *run, kRtol), "") << (llama ? "llama" : "gpt");
  }
}

// Under vocabulary parallelism the passes carry the per-token loss: taking
// each micro-batch's mean there instead moves the result out of the bound.
TEST(PackedTeethTest, VocabularyPassesNormalisePerToken) {
  RunConfig c = Vocab(Base("1f1b_vocab", 1), /*llama=*/false);
  absl::StatusOr<RunResult> sequential = TrainSequential(c);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  c.loss_normalization_fault = LossNormalizationFault::kMicroBatchMean;
  absl::StatusOr<RunResult> run = TrainPipeline(c);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NE(CompareResults(*sequential, *run, kRtol), "");
}

}  // namespace
}  // namespace pp
