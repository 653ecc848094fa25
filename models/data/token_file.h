// Pre-tokenized corpora read through mmap (the file is never loaded whole):
//
//   flat      nanoGPT's train.bin: little-endian uint16 or uint32 token ids,
//             nothing else (one document).
//   megatron  Megatron-LM's indexed dataset, PREFIX.bin + PREFIX.idx. The .idx:
//               9-byte magic "MMIDIDX\0\0", uint64 version (1), uint8 dtype
//               code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16;
//               6 and 7 are floats and refused), uint64 sequence count S,
//               uint64 document-index count D, then int32 lengths[S] (tokens
//               per sequence), int64 pointers[S] (byte offset of each sequence
//               in .bin), int64 document_indices[D] (0, then the sequence index
//               ending each document; D = documents + 1), and optionally
//               int8 modes[S] (multimodal data; ignored). All little-endian.
//             Sequences must lie back to back in .bin (as Megatron's builder
//             writes them), so a document is a contiguous token range.
//
// Open* checks the layout and returns InvalidArgument naming the file and the
// bad value (wrong magic or version, a size that is not a multiple of the
// dtype, an .idx whose pointers or lengths do not match its .bin, ...);
// CheckVocabulary scans every token. Immutable after Open; thread-safe.
#ifndef MODELS_DATA_TOKEN_FILE_H_
#define MODELS_DATA_TOKEN_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pp {

enum class TokenFormat { kFlat, kMegatron };

// "flat" or "megatron"; InvalidArgument otherwise.
absl::StatusOr<TokenFormat> ParseTokenFormat(absl::string_view name);

// The exit status of a process whose token file shrank under it: a read of
// the lost part of the mapping (SIGBUS) prints the file and the cause on
// stderr and exits with this.
inline constexpr int kTokenFileChangedExitCode = 3;

class TokenFile {
 public:
  // `bytes_per_token` 2 (uint16) or 4 (uint32).
  static absl::StatusOr<std::shared_ptr<const TokenFile>> OpenFlat(const std::string& path,
                                                                   int bytes_per_token);
  // `prefix` without the extension (a path ending in .bin or .idx is accepted
  // and stripped).
  static absl::StatusOr<std::shared_ptr<const TokenFile>> OpenMegatron(std::string prefix);

  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t num_tokens() const { return num_tokens_; }
  int64_t Token(int64_t i) const;
  // Token offsets where documents start, plus num_tokens() at the end
  // (flat: {0, num_tokens()}). Documents may be empty.
  const std::vector<int64_t>& document_starts() const { return document_starts_; }
  // The token data file (the .bin).
  const std::string& path() const { return path_; }

  // InvalidArgument naming the file, the token index and its byte offset for
  // the first id outside [0, vocab_size); and, for a flat file read as
  // uint16, when every second token of at least kDtypeCheckTokens is 0 and
  // some other is not: a uint32 file's high halves (issue #42, class 11:
  // it trained on every second token being 0, with no warning).
  absl::Status CheckVocabulary(int64_t vocab_size) const;
  static constexpr int64_t kDtypeCheckTokens = 64;

 private:
  TokenFile() = default;

  std::string path_;
  const unsigned char* data_ = nullptr;  // mmap of the .bin
  size_t mapped_bytes_ = 0;
  int bytes_per_token_ = 0;
  bool is_signed_ = false;
  // Megatron's .idx names its dtype; a flat file's is the caller's guess.
  bool dtype_from_header_ = false;
  int64_t num_tokens_ = 0;
  std::vector<int64_t> document_starts_;
  // The mapping's slot in the SIGBUS handler's table (-1: none).
  int sigbus_slot_ = -1;
};

}  // namespace pp

#endif  // MODELS_DATA_TOKEN_FILE_H_
