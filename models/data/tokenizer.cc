#include "models/data/tokenizer.h"

#include "absl/strings/str_cat.h"

namespace pp {

std::vector<int64_t> ByteTokenizer::Encode(std::string_view text) {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string ByteTokenizer::Decode(const std::vector<int64_t>& ids) {
  std::string text;
  text.reserve(ids.size());
  for (int64_t id : ids) {
    if (id >= 0 && id < kNumBytes) {
      text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else if (id == kPad) {
      text += "[PAD]";
    } else if (id == kMask) {
      text += "[MASK]";
    } else if (id == kCls) {
      text += "[CLS]";
    } else if (id == kSep) {
      text += "[SEP]";
    } else {
      absl::StrAppend(&text, "[UNK:", id, "]");
    }
  }
  return text;
}

}  // namespace pp
