#include "pipeline/runtime/p2p_wire.h"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pp {
namespace {

std::vector<int64_t> Control(std::vector<int64_t> head, int64_t id = -1) {
  head.resize(kControlWords, 0);
  head[kIdWord] = id;
  return head;
}

// Decodes `words` as a header and expects DataLoss whose message has `what`.
void ExpectBadHeader(const std::vector<int64_t>& words, const std::string& what) {
  absl::StatusOr<std::vector<TensorMeta>> layout = DecodeHeader(words);
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(layout.status().message().find(what), std::string::npos) << layout.status();
}

constexpr int64_t kFloat = static_cast<int64_t>(c10::ScalarType::Float);

TEST(P2PWireTest, ControlRoundTripsEveryKind) {
  const std::vector<TensorMeta> small = {{torch::kFloat, {2, 3}, true}, {torch::kLong, {}, false}};
  auto inline_message = DecodeControl(EncodeControl(&small, 7));
  ASSERT_TRUE(inline_message.ok()) << inline_message.status();
  EXPECT_EQ(inline_message->kind, ControlKind::kInlineHeader);
  EXPECT_EQ(inline_message->layout, small);
  EXPECT_EQ(inline_message->message_id, 7);

  auto same = DecodeControl(EncodeControl(nullptr, -1));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->kind, ControlKind::kSameHeader);
  EXPECT_EQ(same->message_id, -1);

  // 20 tensors of rank 2 need 1 + 20 * 5 words: more than fit inline.
  const std::vector<TensorMeta> many(20, TensorMeta{torch::kFloat, {4, 4}, false});
  auto follows = DecodeControl(EncodeControl(&many, 3));
  ASSERT_TRUE(follows.ok());
  EXPECT_EQ(follows->kind, ControlKind::kHeaderFollows);
  EXPECT_EQ(follows->header_length, static_cast<int64_t>(EncodeHeader(many).size()));
  auto header = DecodeHeader(EncodeHeader(many));
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(*header, many);
}

TEST(P2PWireTest, StaticShapesFlagRoundTripsAndUnknownFlagsAreRefused) {
  const std::vector<TensorMeta> small = {{torch::kFloat, {2, 3}, true}};
  for (bool flag : {false, true}) {
    auto m = DecodeControl(EncodeControl(&small, 4, flag));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->static_shapes, flag);
    EXPECT_EQ(m->layout, small);
    EXPECT_EQ(m->message_id, 4);
  }
  std::vector<int64_t> words = EncodeControl(nullptr, -1, true);
  EXPECT_EQ(words[kFlagsWord], kStaticShapesFlag);
  words[kFlagsWord] = 6;
  auto bad = DecodeControl(words);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("bad p2p control flags 6"), std::string::npos)
      << bad.status();
}

TEST(P2PWireTest, BadControlMessagesAreNamed) {
  EXPECT_EQ(DecodeControl({1, 2, 3}).status().code(), absl::StatusCode::kDataLoss);
  auto unknown = DecodeControl(Control({5}));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("bad p2p control word 5"), std::string::npos);
  for (int64_t length : {int64_t{0}, int64_t{-3}, kMaxHeaderWords + 1}) {
    auto bad = DecodeControl(Control({2, length}));
    ASSERT_FALSE(bad.ok()) << length;
    EXPECT_NE(bad.status().message().find("bad p2p header length"), std::string::npos);
  }
  // An inline header is decoded (and checked) with the control message.
  auto bad_inline = DecodeControl(Control({1, 1, 99, 0, 0}));
  ASSERT_FALSE(bad_inline.ok());
  EXPECT_NE(bad_inline.status().message().find("dtype code 99"), std::string::npos);
}

// Each of these was accepted by the decoder before it was split out and
// fuzzed, and then threw in the receiver (torch::empty on the decoded layout,
// outside any catch: the rank died with std::terminate) or asked for an
// impossible allocation.
TEST(P2PWireTest, HeadersTheReceiverCouldNotAllocateAreRefused) {
  const int64_t undefined = static_cast<int64_t>(c10::ScalarType::Undefined);
  const int64_t qint8 = static_cast<int64_t>(c10::ScalarType::QInt8);
  ExpectBadHeader({1, undefined, 0, 1, 4}, "dtype code");
  ExpectBadHeader({1, qint8, 0, 1, 4}, "dtype code");
  ExpectBadHeader({1, kFloat, 0, 2, 3, -1}, "negative dimension -1");
  // numel * 4 bytes overflows int64 (and any memory).
  ExpectBadHeader({1, kFloat, 0, 3, 1 << 30, 1 << 30, 1 << 30}, "bytes");
  // Zero dims do not hide the overflow of the others' strides.
  ExpectBadHeader({1, kFloat, 0, 3, 0, int64_t{1} << 40, int64_t{1} << 40}, "bytes");
  ExpectBadHeader({1, kFloat, 7, 1, 4}, "requires_grad word 7");
  // A count no header of this length can hold (it used to size nothing but
  // the loop; now it is refused before anything is reserved).
  ExpectBadHeader({int64_t{1} << 62, kFloat, 0, 0}, "claims");
  ExpectBadHeader({1, kFloat, 0, 65, 1}, "bad rank 65");
  ExpectBadHeader({1, kFloat, 0}, "claims 1 tensors in 3 words");
  ExpectBadHeader({2, kFloat, 0, 2, 5, 5, kFloat, 0}, "truncated at tensor 1");
  ExpectBadHeader({-1}, "negative tensor count");
}

TEST(P2PWireTest, EveryWireDtypeAllocatesAndRoundTrips) {
  int checked = 0;
  for (int code = 0; code < static_cast<int>(c10::ScalarType::NumOptions); ++code) {
    const auto dtype = static_cast<c10::ScalarType>(code);
    if (!IsWireDtype(dtype)) continue;
    const std::vector<TensorMeta> layout = {{dtype, {0, 3}, false}, {dtype, {2, 1}, false}};
    auto decoded = DecodeHeader(EncodeHeader(layout));
    ASSERT_TRUE(decoded.ok()) << c10::toString(dtype) << ": " << decoded.status();
    EXPECT_EQ(*decoded, layout);
    for (const TensorMeta& meta : *decoded) {
      EXPECT_NO_THROW(torch::empty(meta.shape, torch::dtype(meta.dtype))) << c10::toString(dtype);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 12);
}

}  // namespace
}  // namespace pp
