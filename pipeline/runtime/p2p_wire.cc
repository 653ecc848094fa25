#include "pipeline/runtime/p2p_wire.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pp {

std::string TensorMeta::DebugString() const {
  return absl::StrCat(c10::toString(dtype), "[", absl::StrJoin(shape, ","), "]",
                      requires_grad ? "(grad)" : "");
}

bool IsWireDtype(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Byte:
    case c10::ScalarType::Char:
    case c10::ScalarType::Short:
    case c10::ScalarType::Int:
    case c10::ScalarType::Long:
    case c10::ScalarType::Half:
    case c10::ScalarType::Float:
    case c10::ScalarType::Double:
    case c10::ScalarType::ComplexFloat:
    case c10::ScalarType::ComplexDouble:
    case c10::ScalarType::Bool:
    case c10::ScalarType::BFloat16:
      return true;
    default:
      return false;
  }
}

std::vector<int64_t> EncodeHeader(const std::vector<TensorMeta>& layout) {
  std::vector<int64_t> words;
  words.push_back(static_cast<int64_t>(layout.size()));
  for (const TensorMeta& meta : layout) {
    words.push_back(static_cast<int64_t>(meta.dtype));
    words.push_back(meta.requires_grad ? 1 : 0);
    words.push_back(static_cast<int64_t>(meta.shape.size()));
    words.insert(words.end(), meta.shape.begin(), meta.shape.end());
  }
  return words;
}

absl::StatusOr<std::vector<TensorMeta>> DecodeHeader(const std::vector<int64_t>& words) {
  if (words.empty() || words[0] < 0) {
    return absl::DataLossError("p2p header is empty or has a negative tensor count");
  }
  // Each tensor takes at least 3 words: a count beyond that is a lie (and
  // must not size an allocation).
  if (words[0] > static_cast<int64_t>(words.size() - 1) / 3) {
    return absl::DataLossError(
        absl::StrCat("p2p header claims ", words[0], " tensors in ", words.size(), " words"));
  }
  std::vector<TensorMeta> layout;
  layout.reserve(static_cast<size_t>(words[0]));
  size_t pos = 1;
  for (int64_t i = 0; i < words[0]; ++i) {
    if (words.size() - pos < 3) {
      return absl::DataLossError(
          absl::StrCat("p2p header truncated at tensor ", i, " of ", words[0]));
    }
    TensorMeta meta;
    const int64_t dtype = words[pos];
    if (dtype < 0 || dtype >= static_cast<int64_t>(c10::ScalarType::NumOptions) ||
        !IsWireDtype(static_cast<c10::ScalarType>(dtype))) {
      return absl::DataLossError(
          absl::StrCat("p2p header: tensor ", i, " has dtype code ", dtype,
                       ", not one p2p carries (bool, integers, floats, complex)"));
    }
    meta.dtype = static_cast<c10::ScalarType>(dtype);
    if (words[pos + 1] != 0 && words[pos + 1] != 1) {
      return absl::DataLossError(absl::StrCat("p2p header: tensor ", i, " has requires_grad word ",
                                              words[pos + 1], "; valid: 0 or 1"));
    }
    meta.requires_grad = words[pos + 1] == 1;
    const int64_t ndim = words[pos + 2];
    pos += 3;
    if (ndim < 0 || ndim > kMaxWireDims || static_cast<size_t>(ndim) > words.size() - pos) {
      return absl::DataLossError(absl::StrCat("p2p header: tensor ", i, " has bad rank ", ndim,
                                              " (valid: 0 to ", kMaxWireDims,
                                              ", within the header)"));
    }
    meta.shape.assign(words.begin() + pos, words.begin() + pos + ndim);
    pos += static_cast<size_t>(ndim);
    const int64_t element_bytes = static_cast<int64_t>(c10::elementSize(meta.dtype));
    int64_t bytes = element_bytes;
    for (int64_t d : meta.shape) {
      if (d < 0) {
        return absl::DataLossError(
            absl::StrCat("p2p header: tensor ", i, " has a negative dimension ", d));
      }
      // Zero dimensions count as 1: an empty tensor's strides are still the
      // products of the other dimensions, which must not overflow either.
      if (d == 0) continue;
      if (bytes > kMaxWireTensorBytes / d) {
        return absl::DataLossError(absl::StrCat("p2p header: tensor ", i, " ", meta.DebugString(),
                                                " is over ", kMaxWireTensorBytes, " bytes"));
      }
      bytes *= d;
    }
    layout.push_back(std::move(meta));
  }
  return layout;
}

std::vector<int64_t> EncodeControl(const std::vector<TensorMeta>* layout, int64_t message_id,
                                   bool static_shapes) {
  std::vector<int64_t> c(kControlWords, 0);
  c[0] = static_cast<int64_t>(ControlKind::kSameHeader);
  if (layout != nullptr) {
    std::vector<int64_t> words = EncodeHeader(*layout);
    if (static_cast<int>(words.size()) <= kMaxInlineHeaderWords) {
      c[0] = static_cast<int64_t>(ControlKind::kInlineHeader);
      std::copy(words.begin(), words.end(), c.begin() + 1);
    } else {
      c[0] = static_cast<int64_t>(ControlKind::kHeaderFollows);
      c[1] = static_cast<int64_t>(words.size());
    }
  }
  c[kFlagsWord] = static_shapes ? kStaticShapesFlag : 0;
  c[kIdWord] = message_id;
  return c;
}

absl::StatusOr<ControlMessage> DecodeControl(const std::vector<int64_t>& words) {
  if (words.size() != static_cast<size_t>(kControlWords)) {
    return absl::DataLossError(
        absl::StrCat("p2p control message has ", words.size(), " words; valid: ", kControlWords));
  }
  ControlMessage m;
  m.message_id = words[kIdWord];
  if ((words[kFlagsWord] & ~kStaticShapesFlag) != 0) {
    return absl::DataLossError(absl::StrCat("bad p2p control flags ", words[kFlagsWord],
                                            "; valid: 0 or ", kStaticShapesFlag,
                                            " (static shapes)"));
  }
  m.static_shapes = (words[kFlagsWord] & kStaticShapesFlag) != 0;
  switch (words[0]) {
    case static_cast<int64_t>(ControlKind::kSameHeader):
      m.kind = ControlKind::kSameHeader;
      return m;
    case static_cast<int64_t>(ControlKind::kInlineHeader): {
      m.kind = ControlKind::kInlineHeader;
      auto layout =
          DecodeHeader(std::vector<int64_t>(words.begin() + 1, words.begin() + kFlagsWord));
      if (!layout.ok()) return layout.status();
      m.layout = *std::move(layout);
      return m;
    }
    case static_cast<int64_t>(ControlKind::kHeaderFollows):
      m.kind = ControlKind::kHeaderFollows;
      m.header_length = words[1];
      if (m.header_length <= 0 || m.header_length > kMaxHeaderWords) {
        return absl::DataLossError(absl::StrCat("bad p2p header length ", m.header_length,
                                                "; valid: 1 to ", kMaxHeaderWords));
      }
      return m;
    default:
      return absl::DataLossError(absl::StrCat("bad p2p control word ", words[0],
                                              "; valid: 0 (same header), 1 (inline), 2 "
                                              "(header follows)"));
  }
}

}  // namespace pp
