#include "models/data/token_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/regular_file.h"

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
  return ReadRegularFile("Megatron index", path);
}

// A token file shrunk under a run (truncated, rewritten) turns a read of its
// mapping into SIGBUS, which killed a rank without naming the cause (issue
// #42, class 11). Every mapping is registered with a message made in
// advance; the handler writes it and exits (write and _exit are
// async-signal-safe), and passes any other SIGBUS on.
struct MappedRegion {
  std::atomic<const unsigned char*> start{nullptr};
  std::atomic<size_t> size{0};
  char message[768] = {};
};
constexpr int kMaxMappedRegions = 64;
MappedRegion g_regions[kMaxMappedRegions];
struct sigaction g_previous_sigbus;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const auto* address = static_cast<const unsigned char*>(info->si_addr);
  for (MappedRegion& r : g_regions) {
    const unsigned char* start = r.start.load();
    if (start != nullptr && address >= start && address < start + r.size.load()) {
      (void)!::write(STDERR_FILENO, r.message, std::strlen(r.message));
      ::_exit(kTokenFileChangedExitCode);
    }
  }
  // Not a token file's: whatever handled SIGBUS before, or the default.
  ::sigaction(SIGBUS, &g_previous_sigbus, nullptr);
  ::raise(sig);
  (void)context;
}

// Registers [start, start + size) of `path`; the slot's index, or -1 when
// all are taken (the file then reads as before, unnamed on SIGBUS).
int RegisterMapping(const unsigned char* start, size_t size, const std::string& path) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction action = {};
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, &g_previous_sigbus);
  });
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  for (int i = 0; i < kMaxMappedRegions; ++i) {
    MappedRegion& r = g_regions[i];
    if (r.start.load() != nullptr) continue;
    const std::string message = absl::StrCat(
        "error: token file ", path, " changed while this run read it (now shorter than the ", size,
        " bytes mapped at start: truncated or rewritten); a token file must stay as it is "
        "for the whole run\n");
    std::strncpy(r.message, message.c_str(), sizeof(r.message) - 2);
    r.message[sizeof(r.message) - 2] = '\n';
    r.size.store(size);
    r.start.store(start);
    return i;
  }
  return -1;
}

void UnregisterMapping(int slot) {
  if (slot >= 0) g_regions[slot].start.store(nullptr);
}

}  // namespace

absl::StatusOr<TokenFormat> ParseTokenFormat(absl::string_view name) {
  if (name == "flat") return TokenFormat::kFlat;
  if (name == "megatron") return TokenFormat::kMegatron;
  return absl::InvalidArgumentError(
      absl::StrCat("token format \"", name, "\" is not one of: flat, megatron"));
}

TokenFile::~TokenFile() {
  UnregisterMapping(sigbus_slot_);
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
  if (!dtype_from_header_ && bytes_per_token_ == 2 && num_tokens_ >= kDtypeCheckTokens) {
    bool odd_all_zero = true;
    bool even_some_nonzero = false;
    for (int64_t i = 0; i + 1 < num_tokens_ && odd_all_zero; i += 2) {
      even_some_nonzero = even_some_nonzero || Token(i) != 0;
      odd_all_zero = Token(i + 1) == 0;
    }
    if (odd_all_zero && even_some_nonzero) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": every second token read as uint16 is 0 (", num_tokens_ / 2,
                       " of them): a file of uint32 ids read as uint16; set data.dtype to uint32"));
    }
  }
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
  absl::StatusOr<int> opened = OpenRegularFile("token file", path);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
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

// OpenMegatron's steps: read the .idx header, map the .bin, then check the
// sequences and documents the .idx lists against it.

constexpr int64_t kMegatronHeader = kMagicSize + 8 + 1 + 8 + 8;

struct MegatronHeader {
  int bytes_per_token = 0;
  bool is_signed = false;
  int64_t sequences = 0;
  int64_t documents = 0;  // document index entries
};

// The magic, version, token type and counts of the .idx `idx`, its size
// checked against the counts.
absl::StatusOr<MegatronHeader> ReadMegatronHeader(const std::string& idx_path,
                                                  const std::string& idx) {
  const auto* p = reinterpret_cast<const unsigned char*>(idx.data());
  const auto size = static_cast<int64_t>(idx.size());
  if (size < kMagicSize || std::memcmp(p, kMagic, kMagicSize) != 0) {
    return Bad(idx_path,
               "wrong magic: not a Megatron indexed dataset index (expected \"MMIDIDX\\0\\0\")");
  }
  if (size < kMegatronHeader) {
    return Bad(idx_path,
               absl::StrCat("truncated header: ", size, " bytes, need ", kMegatronHeader));
  }
  const uint64_t version = ReadLe(p + kMagicSize, 8);
  if (version != 1) return Bad(idx_path, absl::StrCat("version ", version, " (only 1 is known)"));
  MegatronHeader header;
  const int code = p[kMagicSize + 8];
  switch (code) {
    case 1:
      header.bytes_per_token = 1;
      break;  // uint8
    case 2:
      header.bytes_per_token = 1;
      header.is_signed = true;
      break;  // int8
    case 3:
      header.bytes_per_token = 2;
      header.is_signed = true;
      break;  // int16
    case 4:
      header.bytes_per_token = 4;
      header.is_signed = true;
      break;  // int32
    case 5:
      header.bytes_per_token = 8;
      header.is_signed = true;
      break;  // int64
    case 8:
      header.bytes_per_token = 2;
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
  const int64_t expected = kMegatronHeader + 4 * s + 8 * s + 8 * d;
  if (size != expected && size != expected + s) {
    return Bad(idx_path, absl::StrCat("size ", size, " bytes does not match its counts (", s,
                                      " sequences, ", d, " document entries: ", expected,
                                      " bytes, or ", expected + s, " with sequence modes)"));
  }
  header.sequences = s;
  header.documents = d;
  return header;
}

// Sequence i starts at token result[i] (result[s]: the end); they must be
// back to back and fill the .bin's `num_tokens`.
absl::StatusOr<std::vector<int64_t>> SequenceStarts(const std::string& idx_path,
                                                    const std::string& idx,
                                                    const MegatronHeader& header,
                                                    const std::string& bin_path,
                                                    int64_t num_tokens) {
  const int64_t s = header.sequences;
  const int bytes = header.bytes_per_token;
  const auto* lengths = reinterpret_cast<const unsigned char*>(idx.data()) + kMegatronHeader;
  const unsigned char* pointers = lengths + 4 * s;
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
  if (seq_start[s] != num_tokens) {
    return Bad(idx_path,
               absl::StrCat("sequence lengths sum to ", seq_start[s], " tokens but ", bin_path,
                            " holds ", num_tokens, " (the .idx does not match its .bin)"));
  }
  return seq_start;
}

// The first token of each document: the document indices (sequence numbers,
// rising from 0 to the sequence count) mapped through `seq_start`.
absl::StatusOr<std::vector<int64_t>> DocumentStarts(const std::string& idx_path,
                                                    const std::string& idx,
                                                    const MegatronHeader& header,
                                                    const std::vector<int64_t>& seq_start) {
  const int64_t s = header.sequences, d = header.documents;
  const auto* docs =
      reinterpret_cast<const unsigned char*>(idx.data()) + kMegatronHeader + 4 * s + 8 * s;
  if (d < 1) return Bad(idx_path, "no document indices (need at least the leading 0)");
  std::vector<int64_t> starts;
  int64_t previous = -1;
  for (int64_t j = 0; j < d; ++j) {
    const auto seq = static_cast<int64_t>(ReadLe(docs + 8 * j, 8));
    if (seq < 0 || seq > s || seq < previous || (j == 0 && seq != 0)) {
      return Bad(idx_path,
                 absl::StrCat("document index ", j, " is ", seq,
                              "; document indices must rise from 0 to the sequence count ", s));
    }
    starts.push_back(seq_start[seq]);
    previous = seq;
  }
  if (previous != s) {
    return Bad(idx_path, absl::StrCat("the last document index is ", previous,
                                      ", not the sequence count ", s));
  }
  return starts;
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
  file->sigbus_slot_ = RegisterMapping(file->data_, file->mapped_bytes_, path);
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
  absl::StatusOr<MegatronHeader> header = ReadMegatronHeader(idx_path, *idx);
  if (!header.ok()) return header.status();
  std::shared_ptr<TokenFile> file(new TokenFile());
  file->path_ = bin_path;
  file->bytes_per_token_ = header->bytes_per_token;
  file->is_signed_ = header->is_signed;
  file->dtype_from_header_ = true;
  if (absl::Status st = MapTokens(bin_path, header->bytes_per_token, &file->data_,
                                  &file->mapped_bytes_, &file->num_tokens_);
      !st.ok()) {
    return st;
  }
  file->sigbus_slot_ = RegisterMapping(file->data_, file->mapped_bytes_, bin_path);
  absl::StatusOr<std::vector<int64_t>> seq_start =
      SequenceStarts(idx_path, *idx, *header, bin_path, file->num_tokens_);
  if (!seq_start.ok()) return seq_start.status();
  absl::StatusOr<std::vector<int64_t>> starts = DocumentStarts(idx_path, *idx, *header, *seq_start);
  if (!starts.ok()) return starts.status();
  file->document_starts_ = *std::move(starts);
  return file;
}

}  // namespace pp
