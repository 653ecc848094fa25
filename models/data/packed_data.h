// Packed micro-batches (docs/packed_sequences.md): whole documents, or pieces
// of documents longer than a row, packed into rows of at most seq_len input
// tokens, up to micro_batch_size rows per micro-batch. Each document attends
// only to itself and its positions restart at 0 (the micro-batch's
// "position_ids" and "document_ids", models/packed_sequence.h), and the loss
// is per token over the global batch ("loss_mask" and global_loss_tokens,
// pipeline/runtime/micro_batch_source.h): the pipeline's gradient is the
// unpipelined run's whatever the split of tokens over micro-batches and ranks.
//
// Packing, once at Create, deterministic from the seed alone:
//   1. pieces: a document of L tokens makes L - 1 predictions; one longer than
//      a row (L > seq_len + 1) is cut into pieces of seq_len + 1 tokens that
//      overlap by one, so every prediction is made exactly once (each piece
//      then attends within itself and its positions restart);
//   2. the pieces in an order drawn from the seed (SplitMix64 Fisher-Yates:
//      the same on every platform);
//   3. balance kTokens: each piece goes to the first row of the open
//      micro-batch with room, else a new micro-batch opens (equal tokens,
//      unequal work); kCost: the pieces, most expensive first, each to the
//      cheapest micro-batch so far with a row that fits it, over as many
//      micro-batches as kTokens makes (WLB-LLM's balancing: attention's cost
//      grows with each document's length squared, so equal-token micro-batches
//      are unequal work).
// Epoch e visits every packed micro-batch once, in an order drawn from
// (seed, e); step s takes global micro-batches [s G, (s + 1) G), G = dp_size x
// num_microbatches, data-parallel rank r the r-th m of them (as every
// ShardedBatchSource), or with order_by_cost the step's G sorted heaviest
// first and dealt round-robin to the ranks. A micro-batch is [rows it uses, its longest row rounded
// up to length_multiple]: shapes vary from micro-batch to micro-batch, so
// runs need p2p's dynamic shapes. The batches depend only on (data, seed,
// options but dp_rank), not on pp, dp or tp, and a run resumed at step k sees
// what the interrupted run would have: there is no epoch state to save.
#ifndef MODELS_DATA_PACKED_DATA_H_
#define MODELS_DATA_PACKED_DATA_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/data/sharded_batch_source.h"
#include "models/data/token_data.h"

namespace pp {

enum class PackingBalance { kTokens, kCost };

struct PackingOptions {
  int64_t seq_len = 128;         // a row's capacity in input tokens (<= the model's context)
  int64_t micro_batch_size = 1;  // rows per micro-batch, at most
  int64_t num_microbatches = 4;
  int64_t dp_rank = 0;
  int64_t dp_size = 1;
  uint64_t seed = 1234;
  PackingBalance balance = PackingBalance::kTokens;
  // The estimated cost of a piece of L input tokens: L * (cost_linear_tokens
  // + L): a transformer layer's linear layers cost about 24 width^2 per token
  // and attention 4 width L, so 6 width here.
  int64_t cost_linear_tokens = 768;
  // Every micro-batch's length is a multiple of this (sequence parallelism
  // splits the sequence over the tensor-parallel ranks).
  int64_t length_multiple = 1;
  int64_t pad_token = 0;  // padding's input and label (never trained)
  // Within each step, the global batch's micro-batches sorted by estimated
  // cost, heaviest first, dealt round-robin to the data-parallel ranks: each
  // rank's micro-batch j is then among the step's j-th heaviest (the ranks'
  // loads even, and a schedule can be synthesised for the cost profile of
  // micro-batch indices: --schedule=auto). false: the epoch's order.
  bool order_by_cost = false;
  // Pieces a row holds at most; 0: as many as fit. 1 with length_multiple =
  // seq_len is padding every document to the context (the baseline packing
  // is measured against).
  int64_t pieces_per_row = 0;
};

// A document: `length` tokens from offset `start` of the corpus.
struct DocumentSpan {
  int64_t start = 0;
  int64_t length = 0;
  bool operator==(const DocumentSpan& o) const { return start == o.start && length == o.length; }
};

// What a packer reads. `token` and `trained` must be thread-safe.
struct PackingCorpus {
  std::string name;  // for errors: the file, or "documents"
  std::function<int64_t(int64_t offset)> token;
  // Whether the label at `offset` (the token predicted there) is trained: a
  // fine-tuning set's loss mask (prompts untrained); null: every label.
  std::function<bool(int64_t offset)> trained;
  std::vector<DocumentSpan> documents;
};

// Immutable after construction but for a cache of epoch orders (locked);
// thread-safe.
class PackedBatchSource : public ShardedBatchSource {
 public:
  // InvalidArgument for a size that is not positive, dp_rank outside
  // [0, dp_size), or a corpus with no trained prediction.
  static absl::StatusOr<std::unique_ptr<PackedBatchSource>> Create(PackingCorpus corpus,
                                                                   PackingOptions options);
  // In-memory documents (tests, small sets): offsets run over the
  // concatenation; `trained` (optional) is per token of each document.
  static absl::StatusOr<std::unique_ptr<PackedBatchSource>> FromDocuments(
      std::vector<std::vector<int64_t>> documents, PackingOptions options,
      std::vector<std::vector<bool>> trained = {});

  // input_ids, labels, position_ids, document_ids [rows, time] int64 and
  // loss_mask [rows, time] float (1 = trained).
  MicroBatch AtGlobalIndex(int64_t step, int64_t index) const override;
  int64_t GlobalLossTokens(int64_t step) const override;

  // Packed micro-batches per epoch.
  int64_t microbatches_per_epoch() const { return static_cast<int64_t>(packed_.size()); }
  // The pieces of global micro-batch `index` of `step`, row by row.
  std::vector<std::vector<DocumentSpan>> Layout(int64_t step, int64_t index) const;
  // Its estimated cost (PackingOptions::cost_linear_tokens) and trained tokens.
  double Cost(int64_t step, int64_t index) const;
  // The estimated costs of data-parallel rank `dp_rank`'s micro-batches of
  // `step`, in order.
  std::vector<double> ReplicaCosts(int64_t step, int64_t dp_rank) const;
  int64_t TrainedTokens(int64_t step, int64_t index) const;
  const PackingOptions& options() const { return options_; }
  // Whether the corpus marks which labels train (a loss mask).
  bool has_loss_mask() const { return static_cast<bool>(corpus_.trained); }

 private:
  struct Packed {
    std::vector<std::vector<int64_t>> rows;  // piece indices
    std::vector<int64_t> fill;               // input tokens per row
    int64_t trained = 0;
    double cost = 0;
  };
  PackedBatchSource(PackingCorpus corpus, PackingOptions options, std::vector<DocumentSpan> pieces,
                    std::vector<int64_t> piece_trained, std::vector<Packed> packed)
      : ShardedBatchSource(options.dp_rank, options.dp_size, options.num_microbatches),
        corpus_(std::move(corpus)),
        options_(options),
        pieces_(std::move(pieces)),
        piece_trained_(std::move(piece_trained)),
        packed_(std::move(packed)) {}

  // The packed micro-batch global index `index` of `step` visits.
  const Packed& At(int64_t step, int64_t index) const;
  // The packed micro-batch of the epoch order's global micro-batch `g`.
  const Packed& InEpochOrder(int64_t g) const;

  PackingCorpus corpus_;
  PackingOptions options_;
  std::vector<DocumentSpan> pieces_;
  std::vector<int64_t> piece_trained_;
  std::vector<Packed> packed_;
  mutable std::mutex mu_;
  mutable std::map<int64_t, std::vector<int64_t>> epoch_orders_;  // the last few epochs
};

// data.packing `mode` ("documents", or "padded": one piece per row, every
// row padded to seq_len) and data.packing_balance `balance` ("tokens",
// "cost") applied to `options`, whose sizes the caller sets first.
// InvalidArgument naming the value and the valid ones.
absl::Status ApplyPackingMode(const std::string& mode, const std::string& balance,
                              PackingOptions& options);
// data.packing_order `order` ("seed", "cost": PackingOptions::order_by_cost).
absl::Status ApplyPackingOrder(const std::string& order, PackingOptions& options);

// A token file's split (TokenDataOptions: path, format, vocabulary check,
// eval_fraction and split) as documents for packing: Megatron files by their
// document index, flat files cut after every `eos_token` (tools/data ends
// each document with <|endoftext|>, id 0). `options` sizes come from the
// caller; file.seq_len and the window options are unused.
absl::StatusOr<std::unique_ptr<PackedBatchSource>> PackTokenFile(const TokenDataOptions& file,
                                                                 int64_t eos_token,
                                                                 PackingOptions options);

}  // namespace pp

#endif  // MODELS_DATA_PACKED_DATA_H_
