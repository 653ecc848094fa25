// The vocabulary of a byte-level BPE tokenizer.json (Hugging Face
// `tokenizers`, as tools/data/tokens.py writes it), for turning generated
// token ids back into text in C++.
//
// Why C++ reads the vocabulary rather than asking the Python tool to decode:
// a run's sample is made inside the workers at the end of training, and
// decoding byte-level BPE needs only the id -> token string table and GPT-2's
// fixed byte <-> printable-character map, so the driver needs no Python
// environment at run time and prints text the moment it is generated.
// Decoding is exact (tokens.py decode gives the same bytes).
//
// Encoding is not BPE: the prompt is cut greedily into the longest tokens of
// the vocabulary (every byte is a token, so any text encodes). Real BPE would
// need the merges and GPT-2's Unicode pre-tokenizer; a prompt cut differently
// decodes to the same text and only conditions the sample slightly off the
// training distribution. Immutable after Load; thread-safe.
#ifndef MODELS_DATA_BPE_VOCAB_H_
#define MODELS_DATA_BPE_VOCAB_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pp {

// Token ids of a tokenizer.json are below this: the largest vocabulary a model
// takes (llama.vocab_size), and a table of that many strings fits memory.
inline constexpr int64_t kMaxBpeVocab = int64_t{1} << 24;

class BpeVocab {
 public:
  // Reads model.vocab (and added_tokens) of a tokenizer.json. InvalidArgument
  // naming the file for a missing file, bad JSON, a model other than BPE or
  // a token string with a character outside GPT-2's byte map.
  static absl::StatusOr<BpeVocab> Load(const std::string& path);

  // One more than the largest id.
  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  // The bytes of `ids` (ids outside the vocabulary become "<?id>").
  std::string Decode(const std::vector<int64_t>& ids) const;
  // Greedy longest-match over the vocabulary (see above).
  std::vector<int64_t> Encode(absl::string_view text) const;

 private:
  std::vector<std::string> bytes_;  // id -> bytes ("" for a gap)
  std::unordered_map<std::string, int64_t> ids_;
  size_t longest_ = 1;
};

// GPT-2's byte -> Unicode code point map (bytes_to_unicode): printable
// Latin-1 bytes map to themselves, the others to 256 + n in byte order.
std::vector<int> ByteToCodePoint();

}  // namespace pp

#endif  // MODELS_DATA_BPE_VOCAB_H_
