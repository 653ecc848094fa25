// The reference BERT as a registered model (models/registry.h): its config
// message (bert_config.proto, `model { [pp.bert] { ... } }`), validation,
// layer specs, masked-LM loss and data from a corpus.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/field_checks.h"
#include "common/status_macros.h"
#include "models/bert/bert.h"
#include "models/bert/bert_config.pb.h"
#include "models/data/corpus.h"
#include "models/data/mlm_data.h"
#include "models/data/tokenizer.h"
#include "models/registry.h"

namespace pp {
namespace {

absl::Status ValidateBert(const BertModelConfig& c, const ModelRun& run) {
  // A masked-LM sample is [CLS] A [SEP] B [SEP] (models/data/mlm_data.h); a
  // shorter context failed in every worker after launch. The data is
  // byte-tokenized: every id it holds needs a row.
  PP_RETURN_IF_ERROR(CheckTransformerFields(
      "bert", c,
      {.min_context_length = 8,
       .context_length_why = "[CLS] A [SEP] B [SEP] samples need 8",
       .min_vocab_size = ByteTokenizer::kVocabSize,
       .vocab_size_why = "each of the byte tokenizer's 260 ids needs a row"}));
  PP_RETURN_IF_ERROR(CheckRealField("bert.mask_prob", c.mask_prob(), '(', 0, 1, ']'));
  PP_RETURN_IF_ERROR(ValidateBertModelConfig(c));
  PP_RETURN_IF_ERROR(ValidateBertParallelism(c, run.tp, run.sequence_parallel));
  return CheckBlocksPerPart(run, c.num_layers(), "bert.num_layers");
}

MlmDataOptions MlmOptions(const BertModelConfig& c, const ModelRun& run, uint64_t seed) {
  return {.seq_len = c.context_length(),
          .micro_batch_size = run.micro_batch_size,
          .num_microbatches = run.num_microbatches,
          .dp_rank = 0,
          .dp_size = run.dp,
          .seed = seed,
          .mask_prob = c.mask_prob()};
}

// Masked bytes of the corpus; its tail (eval_fraction) held out.
absl::StatusOr<ModelData> BertData(const BertModelConfig& c, const ModelRun& run) {
  PP_ASSIGN_OR_RETURN(Corpus corpus, LoadCorpus(run.data_path));
  const size_t eval_bytes = static_cast<size_t>(corpus.text.size() * run.eval_fraction);
  const std::string train_text = corpus.text.substr(0, corpus.text.size() - eval_bytes);
  const std::string eval_text = corpus.text.substr(corpus.text.size() - eval_bytes);
  ModelData data;
  data.description = absl::StrFormat("corpus %s (%d files, %d bytes)", run.data_path,
                                     corpus.files.size(), corpus.text.size());
  PP_ASSIGN_OR_RETURN(MlmBatchSource train,
                      MlmBatchSource::Create(train_text, MlmOptions(c, run, run.seed)));
  data.train = std::make_unique<MlmBatchSource>(std::move(train));
  absl::StatusOr<MlmBatchSource> eval =
      MlmBatchSource::Create(eval_text, MlmOptions(c, run, run.seed + 1));
  if (eval.ok()) data.eval = std::make_unique<MlmBatchSource>(*std::move(eval));
  data.tokens_per_step = run.dp * run.num_microbatches * run.micro_batch_size * c.context_length();
  return data;
}

}  // namespace

PP_REGISTER_MODEL(BertModelConfig, bert,
                  {
                      .name = "bert",
                      .description = "byte-level BERT, masked LM (padding-masked encoder)",
                      .default_partition_method = "type:TransformerBlock",
                      .validate = ValidateBert,
                      .specs = MakeBertSpecs,
                      .loss = BertMlmLoss,
                      // Tensor parallelism: the decoder's logits are split by
                      // vocabulary; the loss never gathers them.
                      .tensor_parallel_loss = [](const BertModelConfig& c,
                                                 const ModelParallelGroup& group) -> LossFn {
                        return [vocab = c.vocab_size(), group](const Activations& outputs,
                                                               const MicroBatch& batch) {
                          return BertParallelLoss(outputs, batch, vocab, group);
                        };
                      },
                      .data = BertData,
                      .memory =
                          [](const BertModelConfig& c) {
                            return TransformerMemory({.context_length = c.context_length(),
                                                      .width = c.width(),
                                                      .num_heads = c.num_heads(),
                                                      .num_layers = c.num_layers(),
                                                      .mlp_ratio = c.mlp_ratio(),
                                                      .vocab_size = c.vocab_size()});
                          },
                  });

}  // namespace pp
