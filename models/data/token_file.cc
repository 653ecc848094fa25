#include "models/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pp {
namespace {

constexpr char kMagic[] = "MMIDIDX\0\0";  // 9 bytes
constexpr int64_t kMagicSize = 9;

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// Little-endian integer of `bytes` bytes at p (portable on any host).
uint64_t ReadLe(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The bytes of a whole small file (the .idx: metadata, not tokens).
absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

absl::StatusOr<TokenFormat> ParseTokenFormat(absl::string_view name) {
  if (name == "flat") return TokenFormat::kFlat;
  if (name == "megatron") return TokenFormat::kMegatron;
  return absl::InvalidArgumentError(
      absl::StrCat("token format \"", name, "\" is not one of: flat, megatron"));
}

TokenFile::~TokenFile() {
  if (data_ != nullptr) munmap(const_cast<unsigned char*>(data_), mapped_bytes_);
}

int64_t TokenFile::Token(int64_t i) const {
  const unsigned char* p = data_ + static_cast<size_t>(i) * bytes_per_token_;
  const uint64_t raw = ReadLe(p, bytes_per_token_);
  if (!is_signed_ || bytes_per_token_ == 8) return static_cast<int64_t>(raw);
  // Sign-extend int8/int16/int32.
  const int shift = 64 - 8 * bytes_per_token_;
  return static_cast<int64_t>(raw << shift) >> shift;
}

absl::Status TokenFile::CheckVocabulary(int64_t vocab_size) const {
  for (int64_t i = 0; i < num_tokens_; ++i) {
    const int64_t id = Token(i);
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": token ", i, " (byte offset ", i * bytes_per_token_, ") is ", id,
                       ", outside the model's vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

// Maps `path` read-only into `file` after checking its size is a whole number
// of tokens.
namespace {

absl::Status MapTokens(const std::string& path, int bytes_per_token, const unsigned char** data,
                       size_t* mapped, int64_t* num_tokens) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open token file ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size % bytes_per_token != 0) {
    close(fd);
    return Bad(path, absl::StrCat("size ", size, " bytes is not a multiple of the token size (",
                                  bytes_per_token, " bytes): truncated, or the wrong dtype"));
  }
  if (size == 0) {
    close(fd);
    return Bad(path, "is empty");
  }
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);  // the mapping keeps the file open
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot mmap ", path, ": ", std::strerror(errno)));
  }
  *data = static_cast<const unsigned char*>(p);
  *mapped = size;
  *num_tokens = static_cast<int64_t>(size / bytes_per_token);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const TokenFile>> TokenFile::OpenFlat(const std::string& path,
                                                                     int bytes_per_token) {
  if (bytes_per_token != 2 && bytes_per_token != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flat token files hold uint16 or uint32 ids (2 or 4 bytes); got ", bytes_per_token));
  }
  std::shared_ptr<TokenFile> file(new TokenFile());
  file->path_ = path;
  file->bytes_per_token_ = bytes_per_token;
  if (absl::Status s =
          MapTokens(path, bytes_per_token, &file->data_, &file->mapped_bytes_, &file->num_tokens_);
      !s.ok()) {
    return s;
  }
  file->document_starts_ = {0, file->num_tokens_};
  return file;
}

absl::StatusOr<std::shared_ptr<const TokenFile>> TokenFile::OpenMegatron(std::string prefix) {
  if (absl::EndsWith(prefix, ".bin") || absl::EndsWith(prefix, ".idx")) {
    prefix.resize(prefix.size() - 4);
  }
  const std::string idx_path = prefix + ".idx";
  const std::string bin_path = prefix + ".bin";
  absl::StatusOr<std::string> idx = ReadAll(idx_path);
  if (!idx.ok()) return idx.status();
  const auto* p = reinterpret_cast<const unsigned char*>(idx->data());
  const auto size = static_cast<int64_t>(idx->size());
  constexpr int64_t kHeader = kMagicSize + 8 + 1 + 8 + 8;
  if (size < kMagicSize || std::memcmp(p, kMagic, kMagicSize) != 0) {
    return Bad(idx_path,
               "wrong magic: not a Megatron indexed dataset index (expected \"MMIDIDX\\0\\0\")");
  }
  if (size < kHeader) {
    return Bad(idx_path, absl::StrCat("truncated header: ", size, " bytes, need ", kHeader));
  }
  const uint64_t version = ReadLe(p + kMagicSize, 8);
  if (version != 1) return Bad(idx_path, absl::StrCat("version ", version, " (only 1 is known)"));
  const int code = p[kMagicSize + 8];
  int bytes = 0;
  bool is_signed = false;
  switch (code) {
    case 1:
      bytes = 1;
      break;  // uint8
    case 2:
      bytes = 1;
      is_signed = true;
      break;  // int8
    case 3:
      bytes = 2;
      is_signed = true;
      break;  // int16
    case 4:
      bytes = 4;
      is_signed = true;
      break;  // int32
    case 5:
      bytes = 8;
      is_signed = true;
      break;  // int64
    case 8:
      bytes = 2;
      break;  // uint16
    default:
      return Bad(idx_path,
                 absl::StrCat("dtype code ", code, " is not an integer token type (1-5 or 8)"));
  }
  const uint64_t sequences = ReadLe(p + kMagicSize + 9, 8);
  const uint64_t doc_entries = ReadLe(p + kMagicSize + 17, 8);
  // Guard the multiplications below against absurd counts of a corrupt file.
  if (sequences > static_cast<uint64_t>(size) || doc_entries > static_cast<uint64_t>(size)) {
    return Bad(idx_path, absl::StrCat("sequence count ", sequences, " or document count ",
                                      doc_entries, " exceeds the file size ", size));
  }
  const auto s = static_cast<int64_t>(sequences);
  const auto d = static_cast<int64_t>(doc_entries);
  const int64_t expected = kHeader + 4 * s + 8 * s + 8 * d;
  if (size != expected && size != expected + s) {
    return Bad(idx_path, absl::StrCat("size ", size, " bytes does not match its counts (", s,
                                      " sequences, ", d, " document entries: ", expected,
                                      " bytes, or ", expected + s, " with sequence modes)"));
  }
  std::shared_ptr<TokenFile> file(new TokenFile());
  file->path_ = bin_path;
  file->bytes_per_token_ = bytes;
  file->is_signed_ = is_signed;
  if (absl::Status st =
          MapTokens(bin_path, bytes, &file->data_, &file->mapped_bytes_, &file->num_tokens_);
      !st.ok()) {
    return st;
  }
  const unsigned char* lengths = p + kHeader;
  const unsigned char* pointers = lengths + 4 * s;
  const unsigned char* docs = pointers + 8 * s;
  // Sequence i starts at token seq_start[i]; they must be back to back.
  std::vector<int64_t> seq_start(s + 1, 0);
  for (int64_t i = 0; i < s; ++i) {
    const auto length = static_cast<int32_t>(ReadLe(lengths + 4 * i, 4));
    const auto pointer = static_cast<int64_t>(ReadLe(pointers + 8 * i, 8));
    if (length < 0) return Bad(idx_path, absl::StrCat("sequence ", i, " has length ", length));
    if (pointer != seq_start[i] * bytes) {
      return Bad(idx_path, absl::StrCat("sequence ", i, " points at byte ", pointer,
                                        " of the .bin; the lengths before it end at byte ",
                                        seq_start[i] * bytes, " (sequences must be contiguous)"));
    }
    seq_start[i + 1] = seq_start[i] + length;
  }
  if (seq_start[s] != file->num_tokens_) {
    return Bad(idx_path,
               absl::StrCat("sequence lengths sum to ", seq_start[s], " tokens but ", bin_path,
                            " holds ", file->num_tokens_, " (the .idx does not match its .bin)"));
  }
  if (d < 1) return Bad(idx_path, "no document indices (need at least the leading 0)");
  int64_t previous = -1;
  for (int64_t j = 0; j < d; ++j) {
    const auto seq = static_cast<int64_t>(ReadLe(docs + 8 * j, 8));
    if (seq < 0 || seq > s || seq < previous || (j == 0 && seq != 0)) {
      return Bad(idx_path,
                 absl::StrCat("document index ", j, " is ", seq,
                              "; document indices must rise from 0 to the sequence count ", s));
    }
    file->document_starts_.push_back(seq_start[seq]);
    previous = seq;
  }
  if (previous != s) {
    return Bad(idx_path, absl::StrCat("the last document index is ", previous,
                                      ", not the sequence count ", s));
  }
  return file;
}

}  // namespace pp
