// Byte-level tokenizer shared by GPT and BERT.
//
// Ids 0..255 are the byte values of the text, so any file (any language, any
// encoding) tokenizes losslessly and the vocabulary needs no training. BERT's
// special tokens follow the bytes. Decoding turns special tokens into readable
// markers ("[MASK]").
//
// Next: models/data/corpus.h (loading text), lm_data.h / mlm_data.h (batches).
#ifndef MODELS_DATA_TOKENIZER_H_
#define MODELS_DATA_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pp {

// Stateless; all members are static. Thread-safe.
class ByteTokenizer {
 public:
  static constexpr int64_t kNumBytes = 256;
  static constexpr int64_t kPad = 256;
  static constexpr int64_t kMask = 257;
  static constexpr int64_t kCls = 258;
  static constexpr int64_t kSep = 259;
  // Bytes plus the four special tokens.
  static constexpr int64_t kVocabSize = 260;

  static std::vector<int64_t> Encode(std::string_view text);
  // Bytes are emitted as they are; special ids as "[PAD]", "[MASK]", "[CLS]",
  // "[SEP]"; anything else as "[UNK:<id>]".
  static std::string Decode(const std::vector<int64_t>& ids);
  static bool IsSpecial(int64_t id) { return id >= kNumBytes; }
};

}  // namespace pp

#endif  // MODELS_DATA_TOKENIZER_H_
