// tools/data/tokens.py (Hugging Face `tokenizers`, from the pinned torch-newest
// venv) trains a BPE tokenizer on the licence texts in
// /usr/share/common-licenses, offline, and writes the corpus in both token
// formats; the C++ reader opens both and sees the same tokens, one document
// per file, each ending with the end-of-text id.
#include <pwd.h>
#include <unistd.h>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "models/data/bpe_vocab.h"
#include "models/data/packed_data.h"
#include "models/data/token_data.h"
#include "models/data/token_file.h"

namespace pp {
namespace {

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/", path);
}

// Bazel runs tests without HOME; tools/python_env.sh keeps the venv under
// ~/.cache, shared by every run on the machine, so point it at the user's home.
void SetHomeForTheSharedVenv() {
  if (std::getenv("HOME") == nullptr) {
    if (const passwd* pw = getpwuid(getuid()); pw != nullptr) setenv("HOME", pw->pw_dir, 1);
  }
}

std::string RunCommand(const std::string& command, int* status) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *status = -1;
    return out;
  }
  std::array<char, 4096> buffer;
  while (fgets(buffer.data(), buffer.size(), pipe) != nullptr) out += buffer.data();
  *status = pclose(pipe);
  return out;
}

// "<the torch-newest venv's python> tokens.py", or "" when the venv cannot be made.
std::string ToolCommand() {
  int status = 0;
  SetHomeForTheSharedVenv();
  const std::string venv = RunCommand(Runfile("tools/python_env.sh") + " torch-newest", &status);
  if (status != 0) return "";
  return absl::StrCat(absl::StripSuffix(venv, "\n"), "/bin/python ",
                      Runfile("tools/data/tokens.py"));
}

TEST(TokenToolTest, TrainsATokenizerAndWritesBothFormats) {
  int status = 0;
  const std::string tool = ToolCommand();
  ASSERT_FALSE(tool.empty()) << "tools/python_env.sh torch-newest failed";
  const std::string dir = testing::TempDir();
  const std::string corpus = "/usr/share/common-licenses";
  std::string out =
      RunCommand(absl::StrCat(tool, " train --corpus ", corpus, " --vocab_size 2000 --out ", dir,
                              "/tokenizer.json 2>&1"),
                 &status);
  ASSERT_EQ(status, 0) << out;
  for (const char* format : {"flat", "megatron"}) {
    out = RunCommand(absl::StrCat(tool, " encode --tokenizer ", dir, "/tokenizer.json --corpus ",
                                  corpus, " --format ", format, " --out ", dir, "/", format,
                                  std::string(format) == "flat" ? ".bin" : "", " 2>&1"),
                     &status);
    ASSERT_EQ(status, 0) << out;
  }
  absl::StatusOr<std::shared_ptr<const TokenFile>> flat = TokenFile::OpenFlat(dir + "/flat.bin", 2);
  absl::StatusOr<std::shared_ptr<const TokenFile>> megatron =
      TokenFile::OpenMegatron(dir + "/megatron");
  ASSERT_TRUE(flat.ok()) << flat.status();
  ASSERT_TRUE(megatron.ok()) << megatron.status();
  ASSERT_EQ((*flat)->num_tokens(), (*megatron)->num_tokens());
  EXPECT_GT((*flat)->num_tokens(), 10000);
  for (int64_t i = 0; i < (*flat)->num_tokens(); ++i) {
    ASSERT_EQ((*flat)->Token(i), (*megatron)->Token(i)) << i;
  }
  EXPECT_TRUE((*flat)->CheckVocabulary(2000).ok());
  // One document per licence file, each ending with <|endoftext|> (id 0).
  int64_t files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(corpus)) {
    files += entry.is_regular_file();
  }
  const std::vector<int64_t>& starts = (*megatron)->document_starts();
  EXPECT_EQ(static_cast<int64_t>(starts.size()) - 1, files);
  for (size_t d = 1; d < starts.size(); ++d) EXPECT_EQ((*megatron)->Token(starts[d] - 1), 0);
  // A model with a smaller vocabulary is refused before launch.
  TokenDataOptions options;
  options.path = dir + "/megatron";
  options.format = TokenFormat::kMegatron;
  options.vocab_size = 100;
  options.seq_len = 64;
  EXPECT_NE(ValidateTokenData(options).message().find("outside the model's vocabulary [0, 100)"),
            std::string::npos);
  options.vocab_size = 2000;
  options.document_aware = true;
  EXPECT_TRUE(ValidateTokenData(options).ok());
  // The tool decodes ids back into the licence text.
  const std::string decoded =
      RunCommand(absl::StrCat(tool, " decode --tokenizer ", dir, "/tokenizer.json --ids ",
                              (*flat)->Token(0), ",", (*flat)->Token(1), ",", (*flat)->Token(2)),
                 &status);
  EXPECT_EQ(status, 0);
  EXPECT_FALSE(decoded.empty());
  // Issue #42 class 10: an id outside the vocabulary printed nothing, exit 0.
  const std::string unknown = RunCommand(
      absl::StrCat(tool, " decode --tokenizer ", dir, "/tokenizer.json --ids 5,2000 2>&1"),
      &status);
  EXPECT_NE(status, 0) << unknown;
  EXPECT_NE(unknown.find("--ids: 2000 is not a token id of " + dir +
                         "/tokenizer.json (its ids are 0 to 1999)"),
            std::string::npos)
      << unknown;
  // C++ decodes a sample with the tokenizer.json's vocabulary exactly as the
  // tool (Hugging Face's decoder) does: the first 300 tokens, end-of-text
  // included, and the ids its greedy prompt encoding picks.
  absl::StatusOr<BpeVocab> vocab = BpeVocab::Load(dir + "/tokenizer.json");
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->size(), 2000);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 300; ++i) ids.push_back((*flat)->Token(i));
  ids.push_back(0);
  const std::vector<int64_t> prompt = vocab->Encode("This License applies to any program");
  ids.insert(ids.end(), prompt.begin(), prompt.end());
  const std::string tool_text =
      RunCommand(absl::StrCat(tool, " decode --tokenizer ", dir, "/tokenizer.json --ids ",
                              absl::StrJoin(ids, ",")),
                 &status);
  ASSERT_EQ(status, 0);
  EXPECT_EQ(vocab->Decode(ids), tool_text);
  EXPECT_LT(prompt.size(), 20u);  // whole words, not bytes
}

// Fine-tuning data: `pairs` makes prompt/response pairs from the licence
// texts' paragraphs, `finetune` writes them with a loss mask, and packing
// (models/data/packed_data.h) trains exactly the responses: an epoch's
// trained labels are the mask's ones, in both formats.
TEST(TokenToolTest, FineTuningPairsCarryALossMask) {
  int status = 0;
  const std::string tool = ToolCommand();
  ASSERT_FALSE(tool.empty()) << "tools/python_env.sh torch-newest failed";
  const std::string dir = testing::TempDir() + "/finetune";
  std::filesystem::create_directories(dir);
  const std::string corpus = "/usr/share/common-licenses";
  std::string out = RunCommand(absl::StrCat(tool, " train --corpus ", corpus,
                                            " --vocab_size 1000 --out ", dir, "/tok.json 2>&1"),
                               &status);
  ASSERT_EQ(status, 0) << out;
  out = RunCommand(
      absl::StrCat(tool, " pairs --corpus ", corpus, " --out ", dir, "/pairs.jsonl 2>&1"), &status);
  ASSERT_EQ(status, 0) << out;
  for (const char* format : {"flat", "megatron"}) {
    const std::string path =
        absl::StrCat(dir, "/", format, std::string(format) == "flat" ? ".bin" : "");
    out = RunCommand(absl::StrCat(tool, " finetune --tokenizer ", dir, "/tok.json --pairs ", dir,
                                  "/pairs.jsonl --format ", format, " --out ", path, " 2>&1"),
                     &status);
    ASSERT_EQ(status, 0) << out;
    TokenDataOptions file;
    file.path = path;
    file.format = std::string(format) == "flat" ? TokenFormat::kFlat : TokenFormat::kMegatron;
    file.vocab_size = 1000;
    ASSERT_TRUE(std::filesystem::exists(LossMaskPath(file))) << LossMaskPath(file);
    PackingOptions o;
    o.seq_len = 128;
    o.micro_batch_size = 2;
    o.num_microbatches = 1;
    absl::StatusOr<std::unique_ptr<PackedBatchSource>> packed = PackTokenFile(file, 0, o);
    ASSERT_TRUE(packed.ok()) << packed.status();
    int64_t trained = 0;
    for (int64_t g = 0; g < (*packed)->microbatches_per_epoch(); ++g) {
      trained += (*packed)->TrainedTokens(g, 0);
    }
    absl::StatusOr<std::shared_ptr<const TokenFile>> tokens = file.format == TokenFormat::kFlat
                                                                  ? TokenFile::OpenFlat(path, 2)
                                                                  : TokenFile::OpenMegatron(path);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    absl::StatusOr<std::shared_ptr<const std::vector<uint8_t>>> mask = LoadLossMask(file, **tokens);
    ASSERT_TRUE(mask.ok() && *mask != nullptr) << mask.status();
    int64_t ones = 0;
    for (uint8_t b : **mask) ones += b;
    EXPECT_EQ(trained, ones) << format;
    EXPECT_LT(ones, (*tokens)->num_tokens()) << "the prompts are not trained";
  }
  // A line that is not a pair is refused, naming it.
  out = RunCommand(absl::StrCat("printf '{\"prompt\": \"a\"}\\n' > ", dir, "/bad.jsonl; ", tool,
                                " finetune --tokenizer ", dir, "/tok.json --pairs ", dir,
                                "/bad.jsonl --format flat --out ", dir, "/bad.bin 2>&1"),
                   &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("line 1: want an object with string fields"), std::string::npos) << out;
}

}  // namespace
}  // namespace pp
