#include "models/data/packed_data.h"

#include <algorithm>
#include <numeric>
#include <queue>
#include <utility>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "models/data/counter_rng.h"
#include "models/data/token_file.h"
#include "models/packed_sequence.h"
#include "pipeline/runtime/micro_batch_source.h"

namespace pp {
namespace {

// Streams of the counter RNG (index argument), apart from any step's.
constexpr uint64_t kPieceOrderStream = 0x5EED0001;
constexpr uint64_t kEpochOrderStream = 0x5EED0002;

// A Fisher-Yates permutation of [0, n) from (seed, stream, epoch).
std::vector<int64_t> Permutation(int64_t n, uint64_t seed, uint64_t epoch, uint64_t stream) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  internal_data::CounterRng rng(seed, epoch, stream);
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(order[static_cast<size_t>(i)], order[rng.Below(static_cast<uint64_t>(i) + 1)]);
  }
  return order;
}

absl::Status CheckOptions(const PackingOptions& o) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"seq_len", o.seq_len},
                                    {"micro_batch_size", o.micro_batch_size},
                                    {"num_microbatches", o.num_microbatches},
                                    {"dp_size", o.dp_size},
                                    {"length_multiple", o.length_multiple}}) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("packed data: ", name, " (", value, ") must be positive"));
    }
  }
  if (o.pieces_per_row < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "packed data: pieces_per_row (", o.pieces_per_row, ") must be >= 0 (0: no limit)"));
  }
  if (o.cost_linear_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed data: cost_linear_tokens (", o.cost_linear_tokens, ") must be >= 0"));
  }
  if (o.dp_rank < 0 || o.dp_rank >= o.dp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed data: dp_rank (", o.dp_rank, ") must be in [0, ", o.dp_size, ")"));
  }
  return absl::OkStatus();
}

// The input tokens of a piece (one fewer than its tokens).
int64_t Inputs(const DocumentSpan& piece) { return piece.length - 1; }

struct Packing {
  std::vector<std::vector<int64_t>> rows;
  std::vector<int64_t> fill;
};

// First fit over the rows of one micro-batch; false when no row has room
// and every row is in use.
bool Place(Packing& p, int64_t piece, int64_t inputs, const PackingOptions& o) {
  for (size_t r = 0; r < p.rows.size(); ++r) {
    const bool room =
        o.pieces_per_row == 0 || static_cast<int64_t>(p.rows[r].size()) < o.pieces_per_row;
    if (room && p.fill[r] + inputs <= o.seq_len) {
      p.rows[r].push_back(piece);
      p.fill[r] += inputs;
      return true;
    }
  }
  if (static_cast<int64_t>(p.rows.size()) >= o.micro_batch_size) return false;
  p.rows.push_back({piece});
  p.fill.push_back(inputs);
  return true;
}

// kTokens: in `order`, each piece into the open micro-batch, else a new one.
std::vector<Packing> PackByTokens(const std::vector<DocumentSpan>& pieces,
                                  const std::vector<int64_t>& order, const PackingOptions& o) {
  std::vector<Packing> packed(1);
  for (int64_t i : order) {
    const int64_t inputs = Inputs(pieces[static_cast<size_t>(i)]);
    if (!Place(packed.back(), i, inputs, o)) {
      packed.emplace_back();
      Place(packed.back(), i, inputs, o);
    }
  }
  return packed;
}

// kCost: as many micro-batches as kTokens makes; pieces most expensive first
// (ties in `order`), each to the cheapest micro-batch with a row that fits
// it; one that fits nowhere opens another micro-batch.
std::vector<Packing> PackByCost(const std::vector<DocumentSpan>& pieces,
                                const std::vector<int64_t>& order, const PackingOptions& o,
                                const std::function<double(const DocumentSpan&)>& cost,
                                size_t count) {
  std::vector<int64_t> by_cost = order;
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](int64_t a, int64_t b) {
    return cost(pieces[static_cast<size_t>(a)]) > cost(pieces[static_cast<size_t>(b)]);
  });
  std::vector<Packing> packed(count);
  using Entry = std::pair<double, size_t>;  // (cost so far, micro-batch)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> cheapest;
  for (size_t k = 0; k < count; ++k) cheapest.push({0.0, k});
  std::vector<Entry> full;
  for (int64_t i : by_cost) {
    const DocumentSpan& piece = pieces[static_cast<size_t>(i)];
    bool placed = false;
    full.clear();
    while (!cheapest.empty()) {
      Entry e = cheapest.top();
      cheapest.pop();
      if (Place(packed[e.second], i, Inputs(piece), o)) {
        cheapest.push({e.first + cost(piece), e.second});
        placed = true;
        break;
      }
      full.push_back(e);
    }
    for (const Entry& e : full) cheapest.push(e);
    if (!placed) {
      packed.emplace_back();
      Place(packed.back(), i, Inputs(piece), o);
      cheapest.push({cost(piece), packed.size() - 1});
    }
  }
  // A micro-batch left empty (more pieces fit elsewhere) is dropped.
  packed.erase(
      std::remove_if(packed.begin(), packed.end(), [](const Packing& p) { return p.rows.empty(); }),
      packed.end());
  return packed;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PackedBatchSource>> PackedBatchSource::Create(
    PackingCorpus corpus, PackingOptions options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  const PackingOptions& o = options;
  // 1. Pieces of at most seq_len + 1 tokens, overlapping by one; those
  // without a trained prediction are dropped (they would train nothing).
  std::vector<DocumentSpan> pieces;
  std::vector<int64_t> piece_trained;
  for (const DocumentSpan& doc : corpus.documents) {
    for (int64_t begin = 0; begin + 1 < doc.length; begin += o.seq_len) {
      const DocumentSpan piece{doc.start + begin, std::min(o.seq_len + 1, doc.length - begin)};
      int64_t trained = Inputs(piece);
      if (corpus.trained) {
        trained = 0;
        for (int64_t j = 1; j < piece.length; ++j)
          trained += corpus.trained(piece.start + j) ? 1 : 0;
      }
      if (trained == 0) continue;
      pieces.push_back(piece);
      piece_trained.push_back(trained);
    }
  }
  if (pieces.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        corpus.name, ": no document with a trained prediction to pack (", corpus.documents.size(),
        " documents; a document needs 2 tokens and a trained label)"));
  }
  // 2. The pieces' order, 3. packing.
  const std::vector<int64_t> order =
      Permutation(static_cast<int64_t>(pieces.size()), o.seed, 0, kPieceOrderStream);
  auto cost = [&o](const DocumentSpan& piece) {
    const double inputs = static_cast<double>(Inputs(piece));
    return inputs * (static_cast<double>(o.cost_linear_tokens) + inputs);
  };
  std::vector<Packing> packings = PackByTokens(pieces, order, o);
  if (o.balance == PackingBalance::kCost) {
    packings = PackByCost(pieces, order, o, cost, packings.size());
  }
  std::vector<Packed> packed;
  for (Packing& p : packings) {
    Packed k;
    k.rows = std::move(p.rows);
    k.fill = std::move(p.fill);
    for (const auto& row : k.rows) {
      for (int64_t i : row) {
        k.trained += piece_trained[static_cast<size_t>(i)];
        k.cost += cost(pieces[static_cast<size_t>(i)]);
      }
    }
    packed.push_back(std::move(k));
  }
  return std::unique_ptr<PackedBatchSource>(new PackedBatchSource(
      std::move(corpus), options, std::move(pieces), std::move(piece_trained), std::move(packed)));
}

absl::StatusOr<std::unique_ptr<PackedBatchSource>> PackedBatchSource::FromDocuments(
    std::vector<std::vector<int64_t>> documents, PackingOptions options,
    std::vector<std::vector<bool>> trained) {
  if (!trained.empty() && trained.size() != documents.size()) {
    return absl::InvalidArgumentError(absl::StrCat("packed data: ", trained.size(),
                                                   " loss masks for ", documents.size(),
                                                   " documents; give one per document or none"));
  }
  auto tokens = std::make_shared<std::vector<int64_t>>();
  auto mask = std::make_shared<std::vector<bool>>();
  PackingCorpus corpus;
  corpus.name = "documents";
  for (size_t d = 0; d < documents.size(); ++d) {
    if (!trained.empty() && trained[d].size() != documents[d].size()) {
      return absl::InvalidArgumentError(absl::StrCat("packed data: document ", d, " has ",
                                                     documents[d].size(), " tokens but ",
                                                     trained[d].size(), " mask entries"));
    }
    corpus.documents.push_back(
        {static_cast<int64_t>(tokens->size()), static_cast<int64_t>(documents[d].size())});
    tokens->insert(tokens->end(), documents[d].begin(), documents[d].end());
    if (!trained.empty()) mask->insert(mask->end(), trained[d].begin(), trained[d].end());
  }
  corpus.token = [tokens](int64_t i) { return (*tokens)[static_cast<size_t>(i)]; };
  if (!trained.empty()) {
    corpus.trained = [mask](int64_t i) {
      return static_cast<bool>((*mask)[static_cast<size_t>(i)]);
    };
  }
  return Create(std::move(corpus), options);
}

const PackedBatchSource::Packed& PackedBatchSource::At(int64_t step, int64_t index) const {
  const int64_t global = options_.dp_size * options_.num_microbatches;
  if (!options_.order_by_cost) return InEpochOrder(step * global + index);
  // The step's micro-batches, heaviest first (ties: epoch order); rank r's
  // j-th is the (j dp + r)-th of them.
  std::vector<const Packed*> step_batches;
  for (int64_t i = 0; i < global; ++i) step_batches.push_back(&InEpochOrder(step * global + i));
  std::stable_sort(step_batches.begin(), step_batches.end(),
                   [](const Packed* a, const Packed* b) { return a->cost > b->cost; });
  const int64_t rank = index / options_.num_microbatches;
  const int64_t j = index % options_.num_microbatches;
  return *step_batches[static_cast<size_t>(j * options_.dp_size + rank)];
}

const PackedBatchSource::Packed& PackedBatchSource::InEpochOrder(int64_t g) const {
  const int64_t k = microbatches_per_epoch();
  const int64_t epoch = g / k;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = epoch_orders_.find(epoch);
  if (it == epoch_orders_.end()) {
    // A step spans at most a few epochs; keep the latest four.
    if (epoch_orders_.size() >= 4) epoch_orders_.erase(epoch_orders_.begin());
    it = epoch_orders_
             .emplace(epoch, Permutation(k, options_.seed, static_cast<uint64_t>(epoch),
                                         kEpochOrderStream))
             .first;
  }
  return packed_[static_cast<size_t>(it->second[static_cast<size_t>(g % k)])];
}

MicroBatch PackedBatchSource::AtGlobalIndex(int64_t step, int64_t index) const {
  const Packed& p = At(step, index);
  const int64_t rows = static_cast<int64_t>(p.rows.size());
  int64_t time = *std::max_element(p.fill.begin(), p.fill.end());
  time =
      (time + options_.length_multiple - 1) / options_.length_multiple * options_.length_multiple;
  torch::Tensor inputs = torch::full({rows, time}, options_.pad_token, torch::kLong);
  torch::Tensor labels = torch::full({rows, time}, options_.pad_token, torch::kLong);
  torch::Tensor positions = torch::zeros({rows, time}, torch::kLong);
  torch::Tensor documents = torch::full({rows, time}, -1, torch::kLong);
  torch::Tensor mask = torch::zeros({rows, time}, torch::kFloat);
  auto in = inputs.accessor<int64_t, 2>();
  auto out = labels.accessor<int64_t, 2>();
  auto pos = positions.accessor<int64_t, 2>();
  auto doc = documents.accessor<int64_t, 2>();
  auto m = mask.accessor<float, 2>();
  for (int64_t r = 0; r < rows; ++r) {
    int64_t t = 0;
    int64_t ordinal = 0;
    for (int64_t i : p.rows[static_cast<size_t>(r)]) {
      const DocumentSpan& piece = pieces_[static_cast<size_t>(i)];
      for (int64_t j = 0; j + 1 < piece.length; ++j, ++t) {
        in[r][t] = corpus_.token(piece.start + j);
        out[r][t] = corpus_.token(piece.start + j + 1);
        pos[r][t] = j;
        doc[r][t] = ordinal;
        const bool trained = !corpus_.trained || corpus_.trained(piece.start + j + 1);
        m[r][t] = trained ? 1.0f : 0.0f;
      }
      ++ordinal;
    }
  }
  MicroBatch batch;
  batch.id = step * options_.dp_size * options_.num_microbatches + index;
  batch.tensors["input_ids"] = inputs;
  batch.tensors["labels"] = labels;
  batch.tensors[kPositionIdsKey] = positions;
  batch.tensors[kDocumentIdsKey] = documents;
  batch.tensors[kLossMaskKey] = mask;
  return batch;
}

int64_t PackedBatchSource::GlobalLossTokens(int64_t step) const {
  // The step's set of micro-batches, in epoch order: the sum does not depend
  // on how order_by_cost deals them (which would sort the step per index).
  const int64_t global = options_.dp_size * options_.num_microbatches;
  int64_t total = 0;
  for (int64_t i = 0; i < global; ++i) total += InEpochOrder(step * global + i).trained;
  return total;
}

std::vector<std::vector<DocumentSpan>> PackedBatchSource::Layout(int64_t step,
                                                                 int64_t index) const {
  std::vector<std::vector<DocumentSpan>> rows;
  for (const auto& row : At(step, index).rows) {
    rows.emplace_back();
    for (int64_t i : row) rows.back().push_back(pieces_[static_cast<size_t>(i)]);
  }
  return rows;
}

double PackedBatchSource::Cost(int64_t step, int64_t index) const { return At(step, index).cost; }

std::vector<double> PackedBatchSource::ReplicaCosts(int64_t step, int64_t dp_rank) const {
  std::vector<double> costs;
  for (int64_t j = 0; j < options_.num_microbatches; ++j) {
    costs.push_back(At(step, dp_rank * options_.num_microbatches + j).cost);
  }
  return costs;
}

int64_t PackedBatchSource::TrainedTokens(int64_t step, int64_t index) const {
  return At(step, index).trained;
}

absl::Status ApplyPackingMode(const std::string& mode, const std::string& balance,
                              PackingOptions& options) {
  if (balance == "tokens") {
    options.balance = PackingBalance::kTokens;
  } else if (balance == "cost") {
    options.balance = PackingBalance::kCost;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("data.packing_balance '", balance, "' is unknown; valid: tokens, cost"));
  }
  if (mode == "padded") {
    options.pieces_per_row = 1;
    options.length_multiple = options.seq_len;
  } else if (mode != "documents") {
    return absl::InvalidArgumentError(
        absl::StrCat("data.packing '", mode, "' is not a packing; valid: documents, padded"));
  }
  return absl::OkStatus();
}

absl::Status ApplyPackingOrder(const std::string& order, PackingOptions& options) {
  if (order != "seed" && order != "cost") {
    return absl::InvalidArgumentError(
        absl::StrCat("data.packing_order '", order, "' is unknown; valid: seed, cost"));
  }
  options.order_by_cost = order == "cost";
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PackedBatchSource>> PackTokenFile(const TokenDataOptions& o,
                                                                 int64_t eos_token,
                                                                 PackingOptions options) {
  if (!(o.eval_fraction >= 0.0 && o.eval_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("token data: eval_fraction (", o.eval_fraction, ") must be in [0, 1)"));
  }
  if (o.vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("token data: vocab_size (", o.vocab_size, ") must be positive"));
  }
  if (eos_token < 0 || eos_token >= o.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("data.eos_token (", eos_token,
                                                   ") must be a token id in [0, ", o.vocab_size,
                                                   ") (the model's vocabulary)"));
  }
  absl::StatusOr<std::shared_ptr<const TokenFile>> file =
      o.format == TokenFormat::kFlat ? TokenFile::OpenFlat(o.path, o.flat_bytes_per_token)
                                     : TokenFile::OpenMegatron(o.path);
  if (!file.ok()) return file.status();
  if (absl::Status s = (*file)->CheckVocabulary(o.vocab_size); !s.ok()) return s;
  std::shared_ptr<const TokenFile> f = *file;
  const int64_t n = f->num_tokens();
  const int64_t cut = n - static_cast<int64_t>(static_cast<double>(n) * o.eval_fraction);
  const int64_t lo = o.split == TokenSplit::kTrain ? 0 : cut;
  const int64_t hi = o.split == TokenSplit::kTrain ? cut : n;
  std::vector<int64_t> bounds = {lo};
  if (o.format == TokenFormat::kMegatron) {
    for (int64_t start : f->document_starts()) {
      if (start > lo && start < hi) bounds.push_back(start);
    }
  } else {
    for (int64_t i = lo; i + 1 < hi; ++i) {
      if (f->Token(i) == eos_token) bounds.push_back(i + 1);
    }
  }
  bounds.push_back(hi);
  PackingCorpus corpus;
  corpus.name = absl::StrCat(f->path(), " (", o.split == TokenSplit::kTrain ? "train" : "eval",
                             " split, tokens [", lo, ", ", hi, "))");
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    if (bounds[i + 1] > bounds[i])
      corpus.documents.push_back({bounds[i], bounds[i + 1] - bounds[i]});
  }
  corpus.token = [f](int64_t i) { return f->Token(i); };
  absl::StatusOr<std::shared_ptr<const std::vector<uint8_t>>> mask = LoadLossMask(o, *f);
  if (!mask.ok()) return mask.status();
  if (*mask != nullptr) {
    corpus.trained = [mask = *mask](int64_t i) { return (*mask)[static_cast<size_t>(i)] != 0; };
    corpus.name += absl::StrCat(", loss mask ", LossMaskPath(o));
  }
  return PackedBatchSource::Create(std::move(corpus), options);
}

}  // namespace pp
