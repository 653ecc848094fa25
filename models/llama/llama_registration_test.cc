// The "llama" registration as the driver sees it (through the registry):
// validation naming bad fields, the before-launch data checks (a token id at
// or above llama.vocab_size names the file and offset, a data source it does
// not read, a tokenizer larger than the vocabulary), and its token data
// source resuming exactly mid-epoch: a source made afresh at step k (what a
// restarted run does) serves the batches an uninterrupted one serves.
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "models/llama/llama_config.pb.h"
#include "models/registry.h"

namespace pp {
namespace {

#define EXPECT_HAS(status, text) \
  EXPECT_NE((status).message().find(text), std::string::npos) << (status).message()

constexpr int64_t kTokens = 6000;

// A flat uint16 file of kTokens ids below `vocab` (a fixed pseudo-random walk).
std::string WriteTokens(const std::string& name, int64_t vocab, int64_t bad_at = -1) {
  const std::string path = absl::StrCat(testing::TempDir(), "/", name);
  std::ofstream out(path, std::ios::binary);
  uint32_t x = 12345;
  for (int64_t i = 0; i < kTokens; ++i) {
    x = x * 1664525u + 1013904223u;
    const auto id = static_cast<uint16_t>(i == bad_at ? vocab : (x >> 8) % vocab);
    out.put(static_cast<char>(id & 0xFF)).put(static_cast<char>(id >> 8));
  }
  return path;
}

const ModelInfo& Llama() {
  const ModelInfo* info = FindModel("llama");
  EXPECT_NE(info, nullptr);
  return *info;
}

LlamaModelConfig Small() {
  LlamaModelConfig c;
  c.set_context_length(16);
  c.set_width(32);
  c.set_num_heads(4);
  c.set_num_kv_heads(2);
  c.set_num_layers(2);
  c.set_intermediate_size(48);
  c.set_vocab_size(300);
  return c;
}

ModelRun TokenRun(const std::string& path) {
  return ModelRun{.micro_batch_size = 2,
                  .num_microbatches = 3,
                  .dp = 2,
                  .pp = 2,
                  .seed = 7,
                  .data_source = "tokens",
                  .data_path = path,
                  .eval_fraction = 0.1};
}

TEST(LlamaRegistrationTest, IsRegisteredWithItsExtension) {
  const ModelInfo& info = Llama();
  EXPECT_EQ(info.extension_number, llama.number());
  EXPECT_EQ(info.default_partition_method, "type:LlamaBlock");
  absl::StatusOr<std::vector<LayerSpec>> specs = info.specs(Small());
  ASSERT_TRUE(specs.ok()) << specs.status();
  EXPECT_EQ(specs->size(), 2u + 3u);  // embedding, 2 blocks, norm, head
}

TEST(LlamaRegistrationTest, ValidationNamesTheBadField) {
  const ModelRun run = TokenRun("unused");
  EXPECT_TRUE(Llama().validate(Small(), run).ok());
  LlamaModelConfig c = Small();
  c.set_num_kv_heads(3);
  EXPECT_HAS(Llama().validate(c, run), "llama.num_kv_heads (3) must divide llama.num_heads (4)");
  c = Small();
  c.set_num_kv_heads(8);
  EXPECT_HAS(Llama().validate(c, run), "llama.num_kv_heads");
  c = Small();
  c.set_width(36);  // head width 9: rotary needs pairs
  EXPECT_HAS(Llama().validate(c, run), "must be even");
  c = Small();
  c.set_rope_theta(0.5);
  EXPECT_HAS(Llama().validate(c, run), "llama.rope_theta (0.5)");
  c = Small();
  c.set_vocab_size(0);
  EXPECT_HAS(Llama().validate(c, run), "llama.vocab_size (0)");
  ModelRun deep = run;
  deep.pp = 4;
  deep.chunks = 2;
  EXPECT_HAS(Llama().validate(Small(), deep), "only 2 blocks (llama.num_layers)");
  // Tensor parallelism: declared, and what must divide is named.
  EXPECT_TRUE(Llama().tensor_parallel_loss != nullptr);
  ModelRun tp = run;
  tp.tp = 2;
  c = Small();
  c.set_num_kv_heads(1);  // one kv head, held by both ranks
  EXPECT_TRUE(Llama().validate(c, tp).ok()) << Llama().validate(c, tp);
  c.set_num_heads(6);
  c.set_num_kv_heads(3);
  c.set_width(48);
  tp.tp = 2;
  EXPECT_HAS(Llama().validate(c, tp),
             "llama.num_kv_heads (3) must be a multiple of parallelism.tp (2), each rank holding "
             "an equal share, or divide it");
  tp.tp = 8;
  EXPECT_HAS(Llama().validate(Small(), tp),
             "llama.num_heads (4) must be a multiple of parallelism.tp (8)");
  tp.tp = 2;
  tp.sequence_parallel = true;
  EXPECT_TRUE(Llama().validate(Small(), tp).ok());
  c = Small();
  c.set_context_length(7);
  EXPECT_HAS(Llama().validate(c, tp),
             "llama.context_length (7) must be a multiple of parallelism.tp (2)");
}

TEST(LlamaRegistrationTest, DataIsCheckedBeforeLaunch) {
  const std::string good = WriteTokens("good.bin", 300);
  EXPECT_TRUE(Llama().check_data(Small(), TokenRun(good)).ok())
      << Llama().check_data(Small(), TokenRun(good));
  // Token 4321 is 300 = llama.vocab_size: the file and its byte offset named.
  const std::string bad = WriteTokens("bad.bin", 300, 4321);
  absl::Status s = Llama().check_data(Small(), TokenRun(bad));
  EXPECT_HAS(s, "llama.vocab_size 300");
  EXPECT_HAS(s, absl::StrCat(bad, ": token 4321 (byte offset 8642) is 300"));
  ModelRun corpus = TokenRun(good);
  corpus.data_source = "corpus";
  EXPECT_HAS(Llama().check_data(Small(), corpus), "data.source \"tokens\"");
  EXPECT_HAS(Llama().data(Small(), corpus).status(), "not data.source 'corpus'");
  ModelRun megatron = TokenRun(good);
  megatron.data_format = "megatron";
  EXPECT_HAS(Llama().check_data(Small(), megatron), ".idx");
  ModelRun odd = TokenRun(good);
  odd.data_dtype = "uint8";
  EXPECT_HAS(Llama().check_data(Small(), odd), "data.dtype 'uint8'");
  // An eval split too short for one window.
  ModelRun tiny_eval = TokenRun(good);
  tiny_eval.eval_fraction = 0.001;
  EXPECT_HAS(Llama().check_data(Small(), tiny_eval), "data.eval_fraction (0.001)");
  // A tokenizer with more tokens than the model's vocabulary.
  const std::string tokenizer = absl::StrCat(testing::TempDir(), "/tokenizer.json");
  std::ofstream(tokenizer) << R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 400}}})";
  LlamaModelConfig with_tokenizer = Small();
  with_tokenizer.set_tokenizer(tokenizer);
  EXPECT_HAS(Llama().check_data(with_tokenizer, TokenRun(good)),
             "has 401 tokens, more than llama.vocab_size (300)");
}

// Every micro-batch of `steps` (global indices), flattened to their tensors.
std::vector<torch::Tensor> Batches(MicroBatchSource& source, int64_t first, int64_t last,
                                   int64_t per_step) {
  std::vector<torch::Tensor> out;
  for (int64_t step = first; step < last; ++step) {
    for (int64_t i = 0; i < per_step; ++i) {
      absl::StatusOr<MicroBatchData> b = source.Get(step, i);
      EXPECT_TRUE(b.ok()) << b.status();
      if (!b.ok()) continue;
      out.push_back(b->batch.Get("input_ids"));
      out.push_back(b->batch.Get("labels"));
    }
  }
  return out;
}

TEST(LlamaRegistrationTest, TokenDataResumesExactlyMidEpoch) {
  const std::string path = WriteTokens("resume.bin", 300);
  const ModelRun run = TokenRun(path);
  absl::StatusOr<ModelData> whole = Llama().data(Small(), run);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_NE(whole->eval, nullptr);
  EXPECT_EQ(whole->tokens_per_step, 2 * 3 * 2 * 16);
  // 12 windows a step out of ~5400: an epoch is ~450 steps, so steps 0-39
  // stop and resume well inside the first one.
  const int64_t per_step = run.dp * run.num_microbatches;
  const std::vector<torch::Tensor> uninterrupted = Batches(*whole->train, 0, 40, per_step);
  // "Kill" after step 17: the run ends, a new process makes its data afresh
  // and continues at step 17.
  absl::StatusOr<ModelData> resumed = Llama().data(Small(), run);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  const std::vector<torch::Tensor> after = Batches(*resumed->train, 17, 40, per_step);
  ASSERT_EQ(after.size(), uninterrupted.size() - 17 * per_step * 2);
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_TRUE(torch::equal(after[i], uninterrupted[17 * per_step * 2 + i])) << i;
  }
  // Labels are inputs shifted by one, and the steps differ from each other.
  EXPECT_TRUE(torch::equal(uninterrupted[0].slice(1, 1), uninterrupted[1].slice(1, 0, -1)));
  EXPECT_FALSE(torch::equal(uninterrupted[0], uninterrupted[2 * per_step]));
  // Eval windows come from the held-out tail: none equals a train window's start.
  absl::StatusOr<MicroBatchData> eval = whole->eval->Get(0, 0);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->batch.Get("input_ids").sizes(), (std::vector<int64_t>{2, 16}));
}

}  // namespace
}  // namespace pp
