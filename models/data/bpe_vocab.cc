#include "models/data/bpe_vocab.h"

#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/regular_file.h"
#include "nlohmann/json.hpp"

namespace pp {
namespace {

absl::Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer ", path, ": ", what));
}

// The code points of a UTF-8 string; false on a malformed sequence.
bool CodePoints(const std::string& s, std::vector<int>& out) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = 0;
    int cp = 0;
    if (c < 0x80) {
      cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // a sequence cut short
    for (int k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    out.push_back(cp);
    i += n + 1;
  }
  return true;
}

}  // namespace

std::vector<int> ByteToCodePoint() {
  std::vector<int> map(256, -1);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    map[b] = printable ? b : next++;
  }
  return map;
}

absl::StatusOr<BpeVocab> BpeVocab::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadRegularFile("tokenizer", path);
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat(text.status().message(), " (tools/data/tokens.py train writes one)"));
  }
  const nlohmann::json json = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return Invalid(path, "is not JSON");
  const auto model = json.find("model");
  if (model == json.end() || !model->is_object() || model->value("type", "") != "BPE" ||
      !model->contains("vocab") || !(*model)["vocab"].is_object()) {
    return Invalid(path, "has no BPE model with a vocab (model.type must be \"BPE\")");
  }
  std::map<int, int> code_to_byte;
  const std::vector<int> to_code = ByteToCodePoint();
  for (int b = 0; b < 256; ++b) code_to_byte[to_code[b]] = b;
  std::map<int64_t, std::pair<std::string, bool>> tokens;  // id -> (string, special)
  // Ids index a table: one of 3e9 was a bad_alloc (issue #42, class 3). The
  // bound is the largest vocabulary a model takes (llama.vocab_size).
  auto id_of = [&](const std::string& token, const nlohmann::json& id) -> absl::StatusOr<int64_t> {
    if (!id.is_number_integer() || id.is_number_float() ||
        (id.is_number_unsigned() ? id.get<uint64_t>() >= uint64_t{kMaxBpeVocab}
                                 : (id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxBpeVocab))) {
      return Invalid(path, absl::StrCat("token '", token, "' has id ", id.dump(),
                                        "; ids must be integers in [0, ", kMaxBpeVocab, ")"));
    }
    return id.get<int64_t>();
  };
  for (const auto& [token, id] : (*model)["vocab"].items()) {
    absl::StatusOr<int64_t> checked = id_of(token, id);
    if (!checked.ok()) return checked.status();
    tokens[*checked] = {token, false};
  }
  if (const auto added = json.find("added_tokens"); added != json.end() && added->is_array()) {
    for (const nlohmann::json& t : *added) {
      if (!t.is_object() || !t.contains("id") || !t.contains("content")) continue;
      if (!t["content"].is_string()) {
        return Invalid(path, absl::StrCat("added token ", t.dump(),
                                          " has a content that is not "
                                          "a string"));
      }
      absl::StatusOr<int64_t> checked = id_of(t["content"].get<std::string>(), t["id"]);
      if (!checked.ok()) return checked.status();
      tokens[*checked] = {t["content"].get<std::string>(), true};
    }
  }
  if (tokens.empty()) return Invalid(path, "has an empty vocabulary");
  BpeVocab vocab;
  vocab.bytes_.resize(tokens.rbegin()->first + 1);
  for (const auto& [id, entry] : tokens) {
    const auto& [token, special] = entry;
    std::string bytes;
    if (special) {
      bytes = token;  // added tokens are stored as plain text
    } else {
      std::vector<int> cps;
      if (!CodePoints(token, cps))
        return Invalid(path, absl::StrCat("token ", id, " is not UTF-8"));
      for (int cp : cps) {
        const auto b = code_to_byte.find(cp);
        if (b == code_to_byte.end()) {
          return Invalid(path, absl::StrCat("token ", id, " ('", token, "') has code point ", cp,
                                            " outside the byte-level alphabet; not a byte-level "
                                            "BPE tokenizer"));
        }
        bytes.push_back(static_cast<char>(b->second));
      }
      vocab.ids_.emplace(bytes, id);
      vocab.longest_ = std::max(vocab.longest_, bytes.size());
    }
    vocab.bytes_[id] = std::move(bytes);
  }
  return vocab;
}

std::string BpeVocab::Decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    if (id >= 0 && id < size() && !bytes_[id].empty()) {
      out += bytes_[id];
    } else {
      absl::StrAppend(&out, "<?", id, ">");
    }
  }
  return out;
}

std::vector<int64_t> BpeVocab::Encode(absl::string_view text) const {
  std::vector<int64_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    size_t n = std::min(longest_, text.size() - i);
    for (; n > 0; --n) {
      const auto it = ids_.find(std::string(text.substr(i, n)));
      if (it != ids_.end()) {
        ids.push_back(it->second);
        break;
      }
    }
    if (n == 0) n = 1;  // a byte the vocabulary lacks (not byte-level): skipped
    i += n;
  }
  return ids;
}

}  // namespace pp
