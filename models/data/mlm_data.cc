#include "models/data/mlm_data.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/data/counter_rng.h"
#include "models/data/tokenizer.h"

namespace pp {
namespace {

bool IsSpace(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

}  // namespace

std::vector<std::string> SplitSentences(std::string_view text) {
  std::vector<std::string> sentences;
  std::string current;
  auto flush = [&] {
    while (!current.empty() && current.back() == ' ') current.pop_back();
    if (!current.empty()) sentences.push_back(std::move(current));
    current.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (IsSpace(c)) {
      // A blank line ends a sentence (headings, list items, paragraphs).
      if (c == '\n') {
        const size_t next = text.find_first_not_of(" \t\r", i + 1);
        if (next != std::string_view::npos && text[next] == '\n') {
          flush();
          i = next;
          continue;
        }
      }
      if (!current.empty() && current.back() != ' ') current.push_back(' ');
      continue;
    }
    current.push_back(c);
    if ((c == '.' || c == '!' || c == '?') && (i + 1 == text.size() || IsSpace(text[i + 1])))
      flush();
  }
  flush();
  return sentences;
}

absl::StatusOr<MlmBatchSource> MlmBatchSource::Create(std::string_view text,
                                                      MlmDataOptions options) {
  if (options.micro_batch_size <= 0 || options.num_microbatches <= 0 || options.dp_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro_batch_size (", options.micro_batch_size, "), num_microbatches (",
        options.num_microbatches, ") and dp_size (", options.dp_size, ") must all be positive"));
  }
  if (options.seq_len < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seq_len (", options.seq_len, ") must be at least 8 for [CLS] A [SEP] B [SEP] samples"));
  }
  if (options.dp_rank < 0 || options.dp_rank >= options.dp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp_rank (", options.dp_rank, ") must be in [0, ", options.dp_size, ")"));
  }
  if (!(options.mask_prob > 0.0 && options.mask_prob <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask_prob (", options.mask_prob, ") must be in (0, 1]"));
  }
  std::vector<std::string> sentences = SplitSentences(text);
  if (sentences.empty())
    return absl::InvalidArgumentError("the corpus holds no sentence for BERT samples");
  return MlmBatchSource(std::move(sentences), options);
}

void MlmBatchSource::FillRow(int64_t step, int64_t row, int64_t i, MicroBatch& batch) const {
  internal_data::CounterRng rng(options_.seed, static_cast<uint64_t>(step),
                                static_cast<uint64_t>(row));
  const int64_t t = options_.seq_len;
  const int64_t budget = t - 3;  // [CLS], two [SEP]
  const int64_t min_target = std::min<int64_t>(8, budget);
  const int64_t target = min_target + static_cast<int64_t>(rng.Below(budget - min_target + 1));

  // Consecutive sentences from a random start, up to `target` bytes.
  std::vector<std::string_view> picked;
  int64_t used = 0;
  for (size_t s = rng.Below(sentences_.size()); s < sentences_.size(); ++s) {
    std::string_view sentence = sentences_[s];
    if (picked.empty() && static_cast<int64_t>(sentence.size()) >= target) {
      picked.push_back(sentence.substr(0, target));
      break;
    }
    if (used + static_cast<int64_t>(sentence.size()) + 1 > target) break;
    used += static_cast<int64_t>(sentence.size()) + 1;
    picked.push_back(sentence);
  }
  const size_t split = picked.size() >= 2 ? 1 + rng.Below(picked.size() - 1) : picked.size();

  std::vector<int64_t> ids = {ByteTokenizer::kCls};
  std::vector<int64_t> types = {0};
  auto append_segment = [&](size_t begin, size_t end, int64_t type) {
    for (size_t k = begin; k < end; ++k) {
      if (k > begin) {
        ids.push_back(' ');
        types.push_back(type);
      }
      for (char c : picked[k]) {
        ids.push_back(static_cast<unsigned char>(c));
        types.push_back(type);
      }
    }
    ids.push_back(ByteTokenizer::kSep);
    types.push_back(type);
  };
  append_segment(0, split, 0);
  if (split < picked.size()) append_segment(split, picked.size(), 1);
  const auto length = static_cast<int64_t>(ids.size());

  // BERT masking over real, non-special positions.
  std::vector<int64_t> labels(length, kIgnoreLabel);
  std::vector<int64_t> maskable;
  for (int64_t j = 0; j < length; ++j) {
    if (!ByteTokenizer::IsSpecial(ids[j])) maskable.push_back(j);
  }
  std::vector<int64_t> selected;
  for (int64_t j : maskable) {
    if (rng.Uniform() < options_.mask_prob) selected.push_back(j);
  }
  if (selected.empty() && !maskable.empty())
    selected.push_back(maskable[rng.Below(maskable.size())]);
  for (int64_t j : selected) {
    labels[j] = ids[j];
    const double u = rng.Uniform();
    if (u < 0.8) {
      ids[j] = ByteTokenizer::kMask;
    } else if (u < 0.9) {
      ids[j] = static_cast<int64_t>(rng.Below(ByteTokenizer::kNumBytes));
    }
  }

  auto input_ids = batch.tensors["input_ids"].accessor<int64_t, 2>();
  auto token_types = batch.tensors["token_type_ids"].accessor<int64_t, 2>();
  auto mask = batch.tensors["attention_mask"].accessor<bool, 2>();
  auto out_labels = batch.tensors["labels"].accessor<int64_t, 2>();
  for (int64_t j = 0; j < t; ++j) {
    const bool real = j < length;
    input_ids[i][j] = real ? ids[j] : ByteTokenizer::kPad;
    token_types[i][j] = real ? types[j] : 0;
    mask[i][j] = real;
    out_labels[i][j] = real ? labels[j] : kIgnoreLabel;
  }
}

MicroBatch MlmBatchSource::AtGlobalIndex(int64_t step, int64_t index) const {
  const int64_t b = options_.micro_batch_size;
  const int64_t t = options_.seq_len;
  MicroBatch batch;
  batch.id = step * options_.dp_size * options_.num_microbatches + index;
  batch.tensors["input_ids"] = torch::empty({b, t}, torch::kLong);
  batch.tensors["token_type_ids"] = torch::empty({b, t}, torch::kLong);
  batch.tensors["attention_mask"] = torch::empty({b, t}, torch::kBool);
  batch.tensors["labels"] = torch::empty({b, t}, torch::kLong);
  const int64_t first_row = index * b;
  for (int64_t i = 0; i < b; ++i) FillRow(step, first_row + i, i, batch);
  return batch;
}

}  // namespace pp
