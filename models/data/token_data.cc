#include "models/data/token_data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include <torch/torch.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "models/data/counter_rng.h"
#include "pipeline/runtime/micro_batch_source.h"

namespace pp {

absl::StatusOr<TokenBatchSource> TokenBatchSource::Create(const TokenDataOptions& o) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"seq_len", o.seq_len},
                                    {"micro_batch_size", o.micro_batch_size},
                                    {"num_microbatches", o.num_microbatches},
                                    {"dp_size", o.dp_size},
                                    {"vocab_size", o.vocab_size}}) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("token data: ", name, " (", value, ") must be positive"));
    }
  }
  if (o.dp_rank < 0 || o.dp_rank >= o.dp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("token data: dp_rank (", o.dp_rank, ") must be in [0, ", o.dp_size, ")"));
  }
  if (!(o.eval_fraction >= 0.0 && o.eval_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("token data: eval_fraction (", o.eval_fraction, ") must be in [0, 1)"));
  }
  absl::StatusOr<std::shared_ptr<const TokenFile>> file =
      o.format == TokenFormat::kFlat ? TokenFile::OpenFlat(o.path, o.flat_bytes_per_token)
                                     : TokenFile::OpenMegatron(o.path);
  if (!file.ok()) return file.status();
  if (absl::Status s = (*file)->CheckVocabulary(o.vocab_size); !s.ok()) return s;

  const int64_t n = (*file)->num_tokens();
  const int64_t cut = n - static_cast<int64_t>(static_cast<double>(n) * o.eval_fraction);
  const int64_t lo = o.split == TokenSplit::kTrain ? 0 : cut;
  const int64_t hi = o.split == TokenSplit::kTrain ? cut : n;
  std::vector<int64_t> bounds = {lo};
  if (o.document_aware) {
    for (int64_t start : (*file)->document_starts()) {
      if (start > lo && start < hi) bounds.push_back(start);
    }
  }
  bounds.push_back(hi);
  std::vector<int64_t> segment_starts;
  std::vector<int64_t> prefix = {0};
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    // A segment of L tokens holds L - seq_len windows of seq_len + 1 tokens.
    const int64_t windows = std::max<int64_t>(0, bounds[i + 1] - bounds[i] - o.seq_len);
    if (windows == 0) continue;
    segment_starts.push_back(bounds[i]);
    prefix.push_back(prefix.back() + windows);
  }
  if (prefix.back() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        (*file)->path(), ": the ", o.split == TokenSplit::kTrain ? "train" : "eval",
        " split (tokens [", lo, ", ", hi, ")", o.document_aware ? ", within documents" : "",
        ") holds no window of seq_len + 1 = ", o.seq_len + 1,
        " tokens (use more data, a shorter context or another eval_fraction)"));
  }
  absl::StatusOr<std::shared_ptr<const std::vector<uint8_t>>> mask = LoadLossMask(o, **file);
  if (!mask.ok()) return mask.status();
  return TokenBatchSource(o, *std::move(file), std::move(segment_starts), std::move(prefix),
                          *std::move(mask));
}

std::string LossMaskPath(const TokenDataOptions& options) {
  std::string base = options.path;
  if (options.format == TokenFormat::kMegatron) {
    for (const char* ext : {".bin", ".idx"}) {
      if (absl::EndsWith(base, ext)) base.resize(base.size() - 4);
    }
  }
  return base + ".loss_mask";
}

absl::StatusOr<std::shared_ptr<const std::vector<uint8_t>>> LoadLossMask(
    const TokenDataOptions& options, const TokenFile& file) {
  const std::string path = LossMaskPath(options);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::shared_ptr<const std::vector<uint8_t>>();
  std::ifstream in(path, std::ios::binary);
  auto mask = std::make_shared<std::vector<uint8_t>>((std::istreambuf_iterator<char>(in)),
                                                     std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    return absl::InvalidArgumentError(absl::StrCat("loss mask ", path, " cannot be read"));
  }
  if (static_cast<int64_t>(mask->size()) != file.num_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss mask ", path, " holds ", mask->size(), " bytes but ", file.path(), " holds ",
        file.num_tokens(), " tokens; it needs one byte (0 or 1) per token"));
  }
  for (size_t i = 0; i < mask->size(); ++i) {
    if ((*mask)[i] > 1) {
      return absl::InvalidArgumentError(absl::StrCat("loss mask ", path, ": byte ", i, " is ",
                                                     static_cast<int>((*mask)[i]),
                                                     "; every byte must be 0 or 1"));
    }
  }
  return std::shared_ptr<const std::vector<uint8_t>>(std::move(mask));
}

absl::Status ValidateTokenData(const TokenDataOptions& options) {
  return TokenBatchSource::Create(options).status();
}

int64_t TokenBatchSource::WindowStart(int64_t step, int64_t row) const {
  internal_data::CounterRng rng(options_.seed, static_cast<uint64_t>(step),
                                static_cast<uint64_t>(row));
  const auto w = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(num_windows())));
  // The segment whose window range holds w.
  const size_t segment = std::upper_bound(window_prefix_.begin(), window_prefix_.end(), w) -
                         window_prefix_.begin() - 1;
  return segment_starts_[segment] + (w - window_prefix_[segment]);
}

MicroBatch TokenBatchSource::AtGlobalIndex(int64_t step, int64_t index) const {
  const int64_t b = options_.micro_batch_size;
  const int64_t t = options_.seq_len;
  torch::Tensor inputs = torch::empty({b, t}, torch::kLong);
  torch::Tensor labels = torch::empty({b, t}, torch::kLong);
  auto in = inputs.accessor<int64_t, 2>();
  auto out = labels.accessor<int64_t, 2>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t start = WindowStart(step, index * b + i);
    for (int64_t j = 0; j < t; ++j) {
      in[i][j] = file_->Token(start + j);
      out[i][j] = file_->Token(start + j + 1);
    }
  }
  MicroBatch batch;
  batch.id = step * options_.dp_size * options_.num_microbatches + index;
  batch.tensors["input_ids"] = inputs;
  batch.tensors["labels"] = labels;
  if (loss_mask_ != nullptr) {
    torch::Tensor mask = torch::empty({b, t}, torch::kFloat);
    auto m = mask.accessor<float, 2>();
    for (int64_t i = 0; i < b; ++i) {
      const int64_t start = WindowStart(step, index * b + i);
      for (int64_t j = 0; j < t; ++j) m[i][j] = (*loss_mask_)[start + j + 1];
    }
    batch.tensors[kLossMaskKey] = mask;
  }
  return batch;
}

int64_t TokenBatchSource::GlobalLossTokens(int64_t step) const {
  if (loss_mask_ == nullptr) return 0;
  int64_t total = 0;
  const int64_t rows = options_.dp_size * options_.num_microbatches * options_.micro_batch_size;
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t start = WindowStart(step, row);
    for (int64_t j = 0; j < options_.seq_len; ++j) total += (*loss_mask_)[start + j + 1];
  }
  return total;
}

}  // namespace pp
