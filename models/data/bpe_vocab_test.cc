// BpeVocab on a hand-written byte-level tokenizer.json: GPT-2's byte map,
// decoding (spaces are "Ġ", newlines "Ċ", special tokens verbatim), greedy
// encoding and the errors. The real tokenizer's decode is compared in
// token_tool_test.
#include "models/data/bpe_vocab.h"

#include <sys/stat.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace pp {
namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// "Ġ" is U+0120 (byte ' '), "Ċ" U+010A (byte '\n').
constexpr char kTokenizer[] = R"({
  "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": true}],
  "model": {"type": "BPE", "vocab": {
    "<|endoftext|>": 0, "a": 1, "b": 2, "Ġ": 3, "Ċ": 4, "ab": 5, "Ġab": 6, "Ã©": 7}}
})";

TEST(BpeVocabTest, ByteMapIsGpt2s) {
  const std::vector<int> map = ByteToCodePoint();
  EXPECT_EQ(map['a'], 'a');
  EXPECT_EQ(map[' '], 0x120);
  EXPECT_EQ(map['\n'], 0x10A);
  EXPECT_EQ(map[0], 0x100);
  EXPECT_EQ(map[0xAD], 0x143);  // soft hyphen: the last remapped byte
  EXPECT_EQ(map[0xE9], 0xE9);
}

TEST(BpeVocabTest, DecodesAndEncodes) {
  absl::StatusOr<BpeVocab> vocab = BpeVocab::Load(WriteFile("tok.json", kTokenizer));
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->size(), 8);
  EXPECT_EQ(vocab->Decode({5, 6, 4, 7, 0}), "ab ab\n\xC3\xA9<|endoftext|>");
  EXPECT_EQ(vocab->Decode({9}), "<?9>");
  EXPECT_EQ(vocab->Encode("ab abba\n"), (std::vector<int64_t>{5, 6, 2, 1, 4}));
  EXPECT_EQ(vocab->Decode(vocab->Encode("ab abba\n")), "ab abba\n");
}

TEST(BpeVocabTest, ErrorsNameTheFile) {
  EXPECT_NE(BpeVocab::Load("/nonexistent/tok.json").status().message().find("/nonexistent"),
            std::string::npos);
  EXPECT_NE(BpeVocab::Load(WriteFile("bad.json", "{")).status().message().find("is not JSON"),
            std::string::npos);
  const std::string wordpiece = WriteFile("wp.json", R"({"model": {"type": "WordPiece"}})");
  EXPECT_NE(BpeVocab::Load(wordpiece).status().message().find("model.type must be \"BPE\""),
            std::string::npos);
  // U+4E00 is no byte of the byte-level alphabet.
  const std::string cjk =
      WriteFile("cjk.json", R"({"model": {"type": "BPE", "vocab": {"一": 0}}})");
  EXPECT_NE(BpeVocab::Load(cjk).status().message().find("outside the byte-level alphabet"),
            std::string::npos);
}

// Issue #42 classes 3 and 4: an id of 3e9 was a bad_alloc, an id or content of
// the wrong JSON type an uncaught exception, and a FIFO a hang. Each is
// refused naming the file and the token.
TEST(BpeVocabTest, RefusesIdsOutOfRangeWrongTypesAndFifos) {
  auto refusal = [](const std::string& name, const std::string& text) {
    return std::string(BpeVocab::Load(WriteFile(name, text)).status().message());
  };
  EXPECT_NE(refusal("huge.json", R"({"model": {"type": "BPE", "vocab": {"a": 3000000000}}})")
                .find("token 'a' has id 3000000000; ids must be integers in [0, 16777216)"),
            std::string::npos);
  EXPECT_NE(refusal("neg.json", R"({"model": {"type": "BPE", "vocab": {"a": -1}}})")
                .find("token 'a' has id -1"),
            std::string::npos);
  EXPECT_NE(refusal("real.json", R"({"model": {"type": "BPE", "vocab": {"a": 1.5}}})")
                .find("token 'a' has id 1.5"),
            std::string::npos);
  EXPECT_NE(refusal("added_id.json", R"({"added_tokens": [{"id": "x", "content": "<s>"}],
                                         "model": {"type": "BPE", "vocab": {"a": 0}}})")
                .find("token '<s>' has id \"x\""),
            std::string::npos);
  EXPECT_NE(refusal("added_big.json", R"({"added_tokens": [{"id": 3e9, "content": "<s>"}],
                                          "model": {"type": "BPE", "vocab": {"a": 0}}})")
                .find("token '<s>' has id"),
            std::string::npos);
  EXPECT_NE(refusal("added_content.json", R"({"added_tokens": [{"id": 1, "content": 5}],
                                              "model": {"type": "BPE", "vocab": {"a": 0}}})")
                .find("is not a string"),
            std::string::npos);
  const std::string fifo = testing::TempDir() + "/tok_fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(std::string(BpeVocab::Load(fifo).status().message()).find("is a FIFO"),
            std::string::npos);
}

}  // namespace
}  // namespace pp
