// The reference GPT as a registered model (models/registry.h): its config
// message (gpt_config.proto, `model { [pp.gpt] { ... } }`), validation,
// layer specs, loss, byte-level LM data from a corpus or the synthetic peer
// data, and sampling through the pipeline at the end of a run.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "models/data/corpus.h"
#include "models/data/lm_data.h"
#include "models/data/packed_data.h"
#include "models/data/synthetic_lm_data.h"
#include "models/data/tokenizer.h"
#include "models/gpt/gpt.h"
#include "models/gpt/gpt_config.pb.h"
#include "models/gpt/gpt_hf.h"
#include "models/gpt/pipeline_sampler.h"
#include "models/gpt/sample.h"
#include "models/registry.h"

namespace pp {
namespace {

absl::Status ValidateGpt(const GptModelConfig& c, const ModelRun& run) {
  // The data is byte-tokenized: every id it holds needs a row.
  PP_RETURN_IF_ERROR(CheckTransformerFields(
      "gpt", c,
      {.min_vocab_size = ByteTokenizer::kVocabSize,
       .vocab_size_why = "each of the byte tokenizer's 260 ids needs a row"}));
  PP_RETURN_IF_ERROR(ValidateGptModelConfig(c));
  PP_RETURN_IF_ERROR(ValidateGptParallelism(c, run.tp, run.sequence_parallel));
  return CheckBlocksPerPart(run, c.num_layers(), "gpt.num_layers");
}

LmDataOptions LmOptions(const GptModelConfig& c, const ModelRun& run, uint64_t seed) {
  return {.seq_len = c.context_length(),
          .micro_batch_size = run.micro_batch_size,
          .num_microbatches = run.num_microbatches,
          .dp_rank = 0,
          .dp_size = run.dp,
          .seed = seed};
}

// data.source synthetic: the peer benchmark's arithmetic progressions.
absl::StatusOr<ModelData> SyntheticData(const GptModelConfig& c, const ModelRun& run) {
  SyntheticLmOptions o;
  o.lm = LmOptions(c, run, run.seed);
  ModelData data;
  PP_ASSIGN_OR_RETURN(SyntheticLmBatchSource train, SyntheticLmBatchSource::Create(o));
  data.tokens_per_step = train.global_tokens_per_step();
  data.train = std::make_unique<SyntheticLmBatchSource>(std::move(train));
  o.lm.seed = run.seed + 1;
  PP_ASSIGN_OR_RETURN(SyntheticLmBatchSource eval, SyntheticLmBatchSource::Create(o));
  data.eval = std::make_unique<SyntheticLmBatchSource>(std::move(eval));
  data.description = "synthetic data (arithmetic progressions of byte tokens)";
  return data;
}

// data.packing: the text's paragraphs as byte documents, packed.
absl::StatusOr<std::unique_ptr<PackedBatchSource>> PackedParagraphs(const GptModelConfig& c,
                                                                    const ModelRun& run,
                                                                    const std::string& text,
                                                                    uint64_t seed) {
  std::vector<std::vector<int64_t>> documents;
  for (const std::string& paragraph : SplitParagraphs(text)) {
    documents.push_back(ByteTokenizer::Encode(paragraph));
  }
  PackingOptions o;
  o.seq_len = c.context_length();
  o.micro_batch_size = run.micro_batch_size;
  o.num_microbatches = run.num_microbatches;
  o.dp_size = run.dp;
  o.seed = seed;
  o.cost_linear_tokens = 6 * c.width();
  o.length_multiple = run.sequence_parallel ? run.tp : 1;
  PP_RETURN_IF_ERROR(ApplyPackingMode(run.packing, run.packing_balance, o));
  PP_RETURN_IF_ERROR(ApplyPackingOrder(run.packing_order, o));
  return PackedBatchSource::FromDocuments(std::move(documents), o);
}

absl::StatusOr<ModelData> PackedCorpusData(const GptModelConfig& c, const ModelRun& run,
                                           const Corpus& corpus, const std::string& train_text,
                                           const std::string& eval_text) {
  ModelData data;
  PP_ASSIGN_OR_RETURN(std::unique_ptr<PackedBatchSource> train,
                      PackedParagraphs(c, run, train_text, run.seed));
  data.description = absl::StrFormat(
      "corpus %s (%d files, %d bytes), paragraphs packed (%s, %s): %d micro-batches per epoch",
      run.data_path, corpus.files.size(), corpus.text.size(), run.packing, run.packing_balance,
      train->microbatches_per_epoch());
  data.tokens_per_step = run.dp * run.num_microbatches * run.micro_batch_size * c.context_length();
  if (train->options().order_by_cost) {
    data.microbatch_costs = [source = train.get()](int64_t step, int64_t dp_rank) {
      return source->ReplicaCosts(step, dp_rank);
    };
  }
  data.train = std::move(train);
  absl::StatusOr<std::unique_ptr<PackedBatchSource>> eval =
      PackedParagraphs(c, run, eval_text, run.seed + 1);
  if (eval.ok()) data.eval = *std::move(eval);
  return data;
}

// Next-byte prediction over the corpus; its tail (eval_fraction) held out.
absl::StatusOr<ModelData> GptData(const GptModelConfig& c, const ModelRun& run) {
  if (run.data_source == "synthetic") return SyntheticData(c, run);
  PP_ASSIGN_OR_RETURN(Corpus corpus, LoadCorpus(run.data_path));
  const size_t eval_bytes = static_cast<size_t>(corpus.text.size() * run.eval_fraction);
  const std::string train_text = corpus.text.substr(0, corpus.text.size() - eval_bytes);
  const std::string eval_text = corpus.text.substr(corpus.text.size() - eval_bytes);
  if (run.packing != "none") return PackedCorpusData(c, run, corpus, train_text, eval_text);
  ModelData data;
  data.description = absl::StrFormat("corpus %s (%d files, %d bytes)", run.data_path,
                                     corpus.files.size(), corpus.text.size());
  PP_ASSIGN_OR_RETURN(LmBatchSource train, LmBatchSource::Create(ByteTokenizer::Encode(train_text),
                                                                 LmOptions(c, run, run.seed)));
  data.tokens_per_step = train.global_tokens_per_step();
  data.train = std::make_unique<LmBatchSource>(std::move(train));
  absl::StatusOr<LmBatchSource> eval =
      LmBatchSource::Create(ByteTokenizer::Encode(eval_text), LmOptions(c, run, run.seed + 1));
  if (eval.ok()) data.eval = std::make_unique<LmBatchSource>(*std::move(eval));
  return data;
}

// Bytes from the prompt, each a forward-only pass of the pipeline.
class GptSampler : public ModelSampler {
 public:
  explicit GptSampler(const GptModelConfig& config) : config_(config) {}

  LossFn WrapLoss(LossFn loss) override { return sampler_.WrapLoss(std::move(loss)); }

  absl::StatusOr<std::string> Sample(const SampleRequest& request, Trainer& trainer,
                                     ParallelGrid& grid,
                                     std::chrono::milliseconds timeout) override {
    SampleOptions so{.num_tokens = request.num_tokens,
                     .top_k = request.top_k,
                     .temperature = request.temperature,
                     .seed = request.seed,
                     .max_token_id = ByteTokenizer::kNumBytes};
    PP_ASSIGN_OR_RETURN(
        std::vector<int64_t> tokens,
        Generate(ByteTokenizer::Encode(request.prompt), config_.context_length(), so,
                 sampler_.LogitsFn(&trainer, &grid, config_.vocab_size(), timeout,
                                   request.sequence_multiple)));
    return ByteTokenizer::Decode(tokens);
  }

 private:
  GptModelConfig config_;
  PipelineSampler sampler_;
};

}  // namespace

PP_REGISTER_MODEL(GptModelConfig, gpt,
                  {
                      .name = "gpt",
                      .description = "byte-level GPT (tied embedding / LM head), samples text",
                      .default_partition_method = "type:TransformerBlock",
                      .data_sources = {"corpus", "synthetic"},
                      .validate = ValidateGpt,
                      .specs = MakeGptSpecs,
                      .loss = GptLoss,
                      // Tensor parallelism: the head's logits are split by
                      // vocabulary; the loss never gathers them.
                      .tensor_parallel_loss = [](const GptModelConfig& c,
                                                 const ModelParallelGroup& group) -> LossFn {
                        return [vocab = c.vocab_size(), group](const Activations& outputs,
                                                               const MicroBatch& batch) {
                          return GptParallelLoss(outputs, batch, vocab, group);
                        };
                      },
                      // Vocabulary parallelism: the tied table split over
                      // the pipeline's ranks.
                      .vocabulary_split = MakeGptVocabularySplit,
                      .data = GptData,
                      .sampler = [](const GptModelConfig& c) -> std::unique_ptr<ModelSampler> {
                        return std::make_unique<GptSampler>(c);
                      },
                      .memory =
                          [](const GptModelConfig& c) {
                            return TransformerMemory({.context_length = c.context_length(),
                                                      .width = c.width(),
                                                      .num_heads = c.num_heads(),
                                                      .num_layers = c.num_layers(),
                                                      .mlp_ratio = c.mlp_ratio(),
                                                      .vocab_size = c.vocab_size()});
                          },
                      // hf_convert import --model=gpt2 (or gpt), and export
                      // (gpt_hf.h). An import's overrides are the fields the
                      // folder decides: the shape and the vocabulary.
                      .hf = {.model_types = {"gpt2"},
                             .import_folder = ImportGpt2Hf,
                             .export_checkpoint = ExportGptCheckpoint},
                  });

}  // namespace pp
