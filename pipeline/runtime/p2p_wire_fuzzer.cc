// Fuzz target: what a p2p receiver decodes from its peer's words
// (pipeline/runtime/p2p_wire.h). The first byte picks the decoder (even:
// DecodeControl on a 64-word control message, odd: DecodeHeader); the rest
// are words, one signed byte each (small values are what matter: dtype
// codes, ranks, counts), or 0x7f followed by 8 bytes for a full int64.
// Beyond "no crash": a decoded layout re-encodes to what was read and decodes
// to itself, and every decoded tensor that is small enough is allocated for
// real (a layout LibTorch cannot allocate would throw in the receiver).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include <torch/torch.h>

#include "pipeline/runtime/p2p_wire.h"

namespace {

std::vector<int64_t> Words(const uint8_t* data, size_t size) {
  std::vector<int64_t> words;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0x7f && i + 8 < size) {
      int64_t w;
      std::memcpy(&w, data + i + 1, 8);
      words.push_back(w);
      i += 8;
    } else {
      words.push_back(static_cast<int8_t>(data[i]));
    }
  }
  return words;
}

void CheckLayout(const std::vector<pp::TensorMeta>& layout) {
  auto again = pp::DecodeHeader(pp::EncodeHeader(layout));
  if (!again.ok() || *again != layout) std::abort();
  for (const pp::TensorMeta& meta : layout) {
    if (!pp::IsWireDtype(meta.dtype)) std::abort();
    int64_t numel = 1;
    for (int64_t d : meta.shape) {
      if (d < 0) std::abort();
      numel = d == 0 ? 0 : (numel > (int64_t{1} << 20) / d ? (int64_t{1} << 21) : numel * d);
    }
    if (numel > (int64_t{1} << 20)) continue;  // decoded, but too big to allocate here
    try {
      torch::Tensor t = torch::empty(meta.shape, torch::dtype(meta.dtype));
      if (t.numel() != numel) std::abort();
    } catch (const std::exception&) {
      std::abort();  // the receiver's TakeBuffer would throw on this layout
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::vector<int64_t> words = Words(data + 1, size - 1);
  if ((data[0] & 1) == 0) {
    words.resize(pp::kControlWords, 0);
    absl::StatusOr<pp::ControlMessage> m = pp::DecodeControl(words);
    if (!m.ok()) return 0;
    if (m->message_id != words[pp::kIdWord]) std::abort();
    if (m->static_shapes != (words[pp::kFlagsWord] == pp::kStaticShapesFlag)) std::abort();
    if (m->kind == pp::ControlKind::kInlineHeader) {
      CheckLayout(m->layout);
      auto again =
          pp::DecodeControl(pp::EncodeControl(&m->layout, m->message_id, m->static_shapes));
      if (!again.ok() || again->layout != m->layout || again->message_id != m->message_id ||
          again->static_shapes != m->static_shapes) {
        std::abort();
      }
    } else if (m->kind == pp::ControlKind::kHeaderFollows) {
      if (m->header_length < 1 || m->header_length > pp::kMaxHeaderWords) std::abort();
    }
    return 0;
  }
  absl::StatusOr<std::vector<pp::TensorMeta>> layout = pp::DecodeHeader(words);
  if (!layout.ok()) return 0;
  // What was read is exactly a prefix of the input.
  const std::vector<int64_t> encoded = pp::EncodeHeader(*layout);
  if (encoded.size() > words.size() || !std::equal(encoded.begin(), encoded.end(), words.begin())) {
    std::abort();
  }
  CheckLayout(*layout);
  return 0;
}
