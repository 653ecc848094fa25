#include "models/data/tokenizer.h"

#include <gtest/gtest.h>

namespace pp {
namespace {

TEST(ByteTokenizerTest, RoundTripsEveryByte) {
  std::string text;
  for (int c = 0; c < 256; ++c) text.push_back(static_cast<char>(c));
  const std::vector<int64_t> ids = ByteTokenizer::Encode(text);
  ASSERT_EQ(ids.size(), 256u);
  for (int c = 0; c < 256; ++c) EXPECT_EQ(ids[c], c);
  EXPECT_EQ(ByteTokenizer::Decode(ids), text);
}

TEST(ByteTokenizerTest, SpecialTokensFollowTheBytes) {
  EXPECT_EQ(ByteTokenizer::kVocabSize, 260);
  EXPECT_FALSE(ByteTokenizer::IsSpecial(255));
  for (int64_t id :
       {ByteTokenizer::kPad, ByteTokenizer::kMask, ByteTokenizer::kCls, ByteTokenizer::kSep}) {
    EXPECT_TRUE(ByteTokenizer::IsSpecial(id));
    EXPECT_LT(id, ByteTokenizer::kVocabSize);
  }
  EXPECT_EQ(ByteTokenizer::Decode({ByteTokenizer::kCls, 'h', 'i', ByteTokenizer::kMask,
                                   ByteTokenizer::kSep, ByteTokenizer::kPad, 999}),
            "[CLS]hi[MASK][SEP][PAD][UNK:999]");
}

}  // namespace
}  // namespace pp
