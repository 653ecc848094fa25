// The LLaMA-style decoder as a registered model (models/registry.h): its
// config message (llama_config.proto, `model { [pp.llama] { ... } }`),
// validation, layer specs, loss, pre-tokenized data (data.source "tokens",
// models/data/token_data.h) with every token id checked against the
// vocabulary before launch, and sampling decoded with the run's
// tokenizer.json (models/data/bpe_vocab.h says why C++ decodes).
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/field_checks.h"
#include "common/status_macros.h"
#include "models/data/bpe_vocab.h"
#include "models/data/packed_data.h"
#include "models/data/token_data.h"
#include "models/data/token_file.h"
#include "models/gpt/pipeline_sampler.h"
#include "models/gpt/sample.h"
#include "models/llama/llama.h"
#include "models/llama/llama_config.pb.h"
#include "models/llama/llama_hf.h"
#include "models/registry.h"

namespace pp {
namespace {

absl::Status ValidateLlama(const LlamaModelConfig& c, const ModelRun& run) {
  PP_RETURN_IF_ERROR(CheckIntField("llama.context_length", c.context_length(), 1, 65536));
  PP_RETURN_IF_ERROR(CheckIntField("llama.width", c.width(), 1, 65536));
  PP_RETURN_IF_ERROR(CheckIntField("llama.num_heads", c.num_heads(), 1,
                                   std::max<int64_t>(1, c.width()), "at most width"));
  PP_RETURN_IF_ERROR(CheckIntField("llama.num_kv_heads", c.num_kv_heads(), 1,
                                   std::max<int64_t>(1, c.num_heads()), "at most num_heads"));
  PP_RETURN_IF_ERROR(CheckIntField("llama.num_layers", c.num_layers(), 1, 100000));
  PP_RETURN_IF_ERROR(CheckIntField("llama.intermediate_size", c.intermediate_size(), 1, 1 << 20));
  // uint32 token files hold ids up to 2^32 - 1; the embedding must fit memory long before.
  PP_RETURN_IF_ERROR(CheckIntField("llama.vocab_size", c.vocab_size(), 1, int64_t{1} << 24));
  PP_RETURN_IF_ERROR(CheckRealField("llama.dropout", c.dropout(), '[', 0, 1, ')'));
  // Divisibility (num_kv_heads | num_heads, even head width), rope_theta, norm_eps.
  PP_RETURN_IF_ERROR(ValidateLlamaModelConfig(c));
  PP_RETURN_IF_ERROR(ValidateLlamaParallelism(c, run.tp, run.sequence_parallel));
  return CheckBlocksPerPart(run, c.num_layers(), "llama.num_layers");
}

// llama.tokenizer: relative paths are taken from the workspace under `bazel
// run` (as the driver takes data.path), else from the working directory.
std::string TokenizerPath(const LlamaModelConfig& c) {
  const std::filesystem::path path(c.tokenizer());
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (path.empty() || path.is_absolute() || workspace == nullptr) return c.tokenizer();
  return (std::filesystem::path(workspace) / path).string();
}

absl::StatusOr<TokenDataOptions> TokenOptions(const LlamaModelConfig& c, const ModelRun& run,
                                              TokenSplit split) {
  if (run.data_source != "tokens") {
    return absl::InvalidArgumentError(absl::StrCat(
        "model 'llama' reads pre-tokenized data (data.source \"tokens\"), not data.source '",
        run.data_source, "'; make token files with tools/data/make_llama_data.sh"));
  }
  PP_ASSIGN_OR_RETURN(TokenFormat format, ParseTokenFormat(run.data_format));
  if (run.data_dtype != "uint16" && run.data_dtype != "uint32") {
    return absl::InvalidArgumentError(
        absl::StrCat("data.dtype '", run.data_dtype, "' is unknown; valid: uint16, uint32"));
  }
  return TokenDataOptions{.path = run.data_path,
                          .format = format,
                          .flat_bytes_per_token = run.data_dtype == "uint16" ? 2 : 4,
                          .vocab_size = c.vocab_size(),
                          .seq_len = c.context_length(),
                          .micro_batch_size = run.micro_batch_size,
                          .num_microbatches = run.num_microbatches,
                          .dp_rank = 0,
                          .dp_size = run.dp,
                          // Eval draws its own windows (seed + 1), as GPT's does.
                          .seed = split == TokenSplit::kTrain ? run.seed : run.seed + 1,
                          .eval_fraction = run.eval_fraction,
                          .split = split,
                          .document_aware = run.document_aware};
}

// data.packing: the split's documents packed into rows of context_length.
absl::StatusOr<std::unique_ptr<PackedBatchSource>> PackedTokens(const LlamaModelConfig& c,
                                                                const ModelRun& run,
                                                                TokenSplit split) {
  PP_ASSIGN_OR_RETURN(TokenDataOptions file, TokenOptions(c, run, split));
  PackingOptions o;
  o.seq_len = c.context_length();
  o.micro_batch_size = run.micro_batch_size;
  o.num_microbatches = run.num_microbatches;
  o.dp_size = run.dp;
  o.seed = file.seed;
  o.cost_linear_tokens = 6 * c.width();
  o.length_multiple = run.sequence_parallel ? run.tp : 1;
  PP_RETURN_IF_ERROR(ApplyPackingMode(run.packing, run.packing_balance, o));
  PP_RETURN_IF_ERROR(ApplyPackingOrder(run.packing_order, o));
  return PackTokenFile(file, run.eos_token, o);
}

// Before launch: the files' layout, every token id below llama.vocab_size
// (naming the file and offset), a window in each split, and a tokenizer whose
// vocabulary fits the model's.
absl::Status CheckLlamaData(const LlamaModelConfig& c, const ModelRun& run) {
  if (run.packing != "none") {
    // Packing reads and checks the files itself (and finds the documents).
    for (TokenSplit split : {TokenSplit::kTrain, TokenSplit::kEval}) {
      if (split == TokenSplit::kEval && run.eval_fraction == 0) continue;
      if (absl::StatusOr<std::unique_ptr<PackedBatchSource>> packed = PackedTokens(c, run, split);
          !packed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.path (llama.vocab_size ", c.vocab_size(), ", data.packing '",
                         run.packing, "'): ", packed.status().message()));
      }
    }
    return absl::OkStatus();
  }
  PP_ASSIGN_OR_RETURN(TokenDataOptions train, TokenOptions(c, run, TokenSplit::kTrain));
  if (absl::Status s = ValidateTokenData(train); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.path (llama.vocab_size ", c.vocab_size(), "): ", s.message()));
  }
  if (run.eval_fraction > 0) {
    PP_ASSIGN_OR_RETURN(TokenDataOptions eval, TokenOptions(c, run, TokenSplit::kEval));
    if (absl::Status s = ValidateTokenData(eval); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("data.eval_fraction (", run.eval_fraction,
                                                     "): ", s.message(), "; or set it to 0"));
    }
  }
  if (c.tokenizer().empty()) return absl::OkStatus();
  PP_ASSIGN_OR_RETURN(BpeVocab vocab, BpeVocab::Load(TokenizerPath(c)));
  if (vocab.size() > c.vocab_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama.tokenizer ", TokenizerPath(c), " has ", vocab.size(),
                     " tokens, more than llama.vocab_size (", c.vocab_size(),
                     "); set vocab_size >= ", vocab.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelData> PackedLlamaData(const LlamaModelConfig& c, const ModelRun& run) {
  ModelData data;
  PP_ASSIGN_OR_RETURN(std::unique_ptr<PackedBatchSource> train,
                      PackedTokens(c, run, TokenSplit::kTrain));
  data.description = absl::StrFormat(
      "tokens %s (%s, vocabulary %d%s), documents packed (%s, %s): %d micro-batches per epoch",
      run.data_path, run.data_format, c.vocab_size(), train->has_loss_mask() ? ", loss mask" : "",
      run.packing, run.packing_balance, train->microbatches_per_epoch());
  data.tokens_per_step = run.dp * run.num_microbatches * run.micro_batch_size * c.context_length();
  if (train->options().order_by_cost) {
    data.microbatch_costs = [source = train.get()](int64_t step, int64_t dp_rank) {
      return source->ReplicaCosts(step, dp_rank);
    };
  }
  data.train = std::move(train);
  if (run.eval_fraction > 0) {
    PP_ASSIGN_OR_RETURN(data.eval, PackedTokens(c, run, TokenSplit::kEval));
  }
  return data;
}

absl::StatusOr<ModelData> LlamaData(const LlamaModelConfig& c, const ModelRun& run) {
  if (run.packing != "none") return PackedLlamaData(c, run);
  PP_ASSIGN_OR_RETURN(TokenDataOptions train_options, TokenOptions(c, run, TokenSplit::kTrain));
  PP_ASSIGN_OR_RETURN(TokenBatchSource train, TokenBatchSource::Create(train_options));
  ModelData data;
  data.description = absl::StrFormat("tokens %s (%s, %d tokens, %d documents, vocabulary %d%s)",
                                     run.data_path, run.data_format, train.file().num_tokens(),
                                     train.file().document_starts().size() - 1, c.vocab_size(),
                                     train.has_loss_mask() ? ", loss mask" : "");
  data.tokens_per_step = run.dp * run.num_microbatches * run.micro_batch_size * c.context_length();
  data.train = std::make_unique<TokenBatchSource>(std::move(train));
  if (run.eval_fraction > 0) {
    PP_ASSIGN_OR_RETURN(TokenDataOptions eval_options, TokenOptions(c, run, TokenSplit::kEval));
    PP_ASSIGN_OR_RETURN(TokenBatchSource eval, TokenBatchSource::Create(eval_options));
    data.eval = std::make_unique<TokenBatchSource>(std::move(eval));
  }
  return data;
}

// Tokens from the prompt (or from <|endoftext|>, id 0, when it is empty),
// each a forward-only pass of the pipeline; decoded with the tokenizer's
// vocabulary, or printed as ids without one.
class LlamaSampler : public ModelSampler {
 public:
  explicit LlamaSampler(const LlamaModelConfig& c) : config_(c) {}

  LossFn WrapLoss(LossFn loss) override { return sampler_.WrapLoss(std::move(loss)); }

  absl::StatusOr<std::string> Sample(const SampleRequest& request, Trainer& trainer,
                                     ParallelGrid& grid,
                                     std::chrono::milliseconds timeout) override {
    std::optional<BpeVocab> vocab;
    if (!config_.tokenizer().empty()) {
      PP_ASSIGN_OR_RETURN(vocab, BpeVocab::Load(TokenizerPath(config_)));
    }
    std::vector<int64_t> prompt =
        vocab.has_value() ? vocab->Encode(request.prompt) : std::vector<int64_t>{};
    if (prompt.empty()) prompt.push_back(0);
    const SampleOptions so{.num_tokens = request.num_tokens,
                           .top_k = request.top_k,
                           .temperature = request.temperature,
                           .seed = request.seed,
                           .max_token_id = vocab.has_value()
                                               ? std::min(vocab->size(), config_.vocab_size())
                                               : config_.vocab_size()};
    PP_ASSIGN_OR_RETURN(std::vector<int64_t> tokens,
                        Generate(prompt, config_.context_length(), so,
                                 sampler_.LogitsFn(&trainer, &grid, config_.vocab_size(), timeout,
                                                   request.sequence_multiple)));
    if (vocab.has_value()) return vocab->Decode(tokens);
    return absl::StrCat("token ids (no llama.tokenizer to decode them): ",
                        absl::StrJoin(tokens, " "));
  }

 private:
  LlamaModelConfig config_;
  PipelineSampler sampler_;
};

}  // namespace

PP_REGISTER_MODEL(
    LlamaModelConfig, llama,
    {
        .name = "llama",
        .description = "LLaMA-style decoder (RMSNorm, RoPE, SwiGLU, GQA) over token files",
        .default_partition_method = "type:LlamaBlock",
        .data_sources = {"tokens"},
        .validate = ValidateLlama,
        .specs = MakeLlamaSpecs,
        .loss = LlamaLoss,
        // Tensor parallelism: heads, kv heads, the SwiGLU and the vocabulary
        // split; the loss from this rank's vocabulary columns.
        .tensor_parallel_loss = [](const LlamaModelConfig& c,
                                   const ModelParallelGroup& group) -> LossFn {
          return
              [vocab = c.vocab_size(), group](const Activations& outputs, const MicroBatch& batch) {
                return LlamaParallelLoss(outputs, batch, vocab, group);
              };
        },
        // Vocabulary parallelism: the token table and the head (one table
        // when tied) split over the pipeline's ranks.
        .vocabulary_split = MakeLlamaVocabularySplit,
        .data = LlamaData,
        .check_data = CheckLlamaData,
        .sampler = [](const LlamaModelConfig& c) -> std::unique_ptr<ModelSampler> {
          return std::make_unique<LlamaSampler>(c);
        },
        // SwiGLU's three width x intermediate matrices as GPT's two of width x
        // (mlp_ratio x width), for the memory estimate.
        .memory =
            [](const LlamaModelConfig& c) {
              const int64_t ratio = std::max<int64_t>(
                  1, (3 * c.intermediate_size() + 2 * c.width() - 1) / (2 * c.width()));
              return TransformerMemory({.context_length = c.context_length(),
                                        .width = c.width(),
                                        .num_heads = c.num_heads(),
                                        .num_layers = c.num_layers(),
                                        .mlp_ratio = ratio,
                                        .vocab_size = c.vocab_size(),
                                        .tied_embeddings = c.tie_embeddings()});
            },
        // hf_convert import --model=llama, and export (llama_hf.h). An
        // import's overrides are every shape field.
        .hf = {.model_types = {"llama"},
               .import_folder = ImportLlamaHf,
               .export_checkpoint = ExportLlamaCheckpoint},
    });

}  // namespace pp
