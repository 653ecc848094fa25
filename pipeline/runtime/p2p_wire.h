// The p2p wire format's pure half: a payload's layout (TensorMeta) as int64
// header words, and the fixed-size control message that precedes every
// dynamic-shape activation message (the protocol: pipeline/runtime/p2p.h).
// Decoding is what a receiver does with words a peer sent, so it trusts
// nothing: a corrupt or hostile message is DataLoss naming the bad word, never
// a crash, an overflow or a buffer the runtime cannot allocate. No process
// group, no tensors: fuzzed by //pipeline/runtime:p2p_wire_fuzzer.
#ifndef PIPELINE_RUNTIME_P2P_WIRE_H_
#define PIPELINE_RUNTIME_P2P_WIRE_H_

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "absl/status/statusor.h"

namespace pp {

// Layout of one tensor of a payload.
struct TensorMeta {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  bool requires_grad = false;

  bool operator==(const TensorMeta& o) const {
    return dtype == o.dtype && shape == o.shape && requires_grad == o.requires_grad;
  }
  bool operator!=(const TensorMeta& o) const { return !(*this == o); }
  std::string DebugString() const;
};

// What a header may describe: at most this many dimensions per tensor, and
// at most this many bytes per tensor (1 TiB: far above any activation, far
// below where numel * element size overflows int64).
inline constexpr int kMaxWireDims = 64;
inline constexpr int64_t kMaxWireTensorBytes = int64_t{1} << 40;

// Whether p2p carries tensors of `dtype`: the plain numeric types and bool
// (not quantized, not Undefined, nothing LibTorch cannot allocate as is).
bool IsWireDtype(c10::ScalarType dtype);

// header = [count, then per tensor: dtype, requires_grad (0/1), ndim, dims...]
std::vector<int64_t> EncodeHeader(const std::vector<TensorMeta>& layout);
// Inverse of EncodeHeader; words after the last tensor are ignored (an inline
// header is padded with zeros). DataLoss for a negative count, a truncated
// header, a dtype IsWireDtype refuses, a rank outside [0, kMaxWireDims], a
// negative dimension or a tensor over kMaxWireTensorBytes.
absl::StatusOr<std::vector<TensorMeta>> DecodeHeader(const std::vector<int64_t>& words);

// The control message: kControlWords int64 words.
//   word 0 = kind; kInlineHeader: words 1 .. kFlagsWord - 1 hold the header;
//   kHeaderFollows: word 1 = the length of the header message that follows;
//   word kFlagsWord = flags: bit 0 set = the sender uses static shapes (after
//   this message its channel sends payloads only; p2p.h); other bits 0;
//   word kIdWord (the last) = the message id (-1: none).
inline constexpr int kControlWords = 64;
inline constexpr int kIdWord = kControlWords - 1;
inline constexpr int kFlagsWord = kIdWord - 1;
inline constexpr int kMaxInlineHeaderWords = kFlagsWord - 1;
inline constexpr int64_t kStaticShapesFlag = 1;
// A separate header is at most this long (2^20 words: 8 MiB).
inline constexpr int64_t kMaxHeaderWords = int64_t{1} << 20;

enum class ControlKind : int64_t {
  kSameHeader = 0,     // the layout of the last message on this channel
  kInlineHeader = 1,   // a new layout, inline
  kHeaderFollows = 2,  // a new layout, in the next message
};

struct ControlMessage {
  ControlKind kind = ControlKind::kSameHeader;
  std::vector<TensorMeta> layout;  // kInlineHeader: decoded already
  int64_t header_length = 0;       // kHeaderFollows: words in the next message
  int64_t message_id = -1;
  bool static_shapes = false;  // kStaticShapesFlag
};

// The control words for `layout` (nullptr: kSameHeader). A header of more
// than kMaxInlineHeaderWords words goes as kHeaderFollows: send
// EncodeHeader(*layout) next.
std::vector<int64_t> EncodeControl(const std::vector<TensorMeta>* layout, int64_t message_id,
                                   bool static_shapes = false);

// Decodes a control message. DataLoss naming the problem for a wrong word
// count, an unknown kind, unknown flags, a bad header length or a bad inline
// header.
absl::StatusOr<ControlMessage> DecodeControl(const std::vector<int64_t>& words);

}  // namespace pp

#endif  // PIPELINE_RUNTIME_P2P_WIRE_H_
