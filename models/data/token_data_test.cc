#include "models/data/token_data.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "models/data/token_file.h"
#include "pipeline/runtime/micro_batch_source.h"

namespace pp {
namespace {

std::string TempPath(const std::string& name) {
  return absl::StrCat(testing::TempDir(), "/", name);
}

void AppendLe(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string Encode(const std::vector<int64_t>& tokens, int bytes) {
  std::string out;
  for (int64_t t : tokens) AppendLe(out, static_cast<uint64_t>(t), bytes);
  return out;
}

// A Megatron indexed dataset written from the documented layout (token_file.h),
// one sequence per document: PREFIX.bin and PREFIX.idx.
struct Megatron {
  int code = 8;  // uint16
  int bytes = 2;
  std::vector<std::vector<int64_t>> documents;

  std::string Bin() const {
    std::string out;
    for (const auto& d : documents) out += Encode(d, bytes);
    return out;
  }
  std::string Idx() const {
    std::string out("MMIDIDX\0\0", 9);
    AppendLe(out, 1, 8);
    out.push_back(static_cast<char>(code));
    AppendLe(out, documents.size(), 8);
    AppendLe(out, documents.size() + 1, 8);
    for (const auto& d : documents) AppendLe(out, d.size(), 4);
    uint64_t pointer = 0;
    for (const auto& d : documents) {
      AppendLe(out, pointer, 8);
      pointer += d.size() * bytes;
    }
    for (size_t i = 0; i <= documents.size(); ++i) AppendLe(out, i, 8);
    return out;
  }
  std::string Write(const std::string& name) const {
    const std::string prefix = TempPath(name);
    WriteFile(prefix + ".bin", Bin());
    WriteFile(prefix + ".idx", Idx());
    return prefix;
  }
};

// Document d holds tokens 10*d .. 10*d + 9 (a window's tokens tell which
// documents it touches), lengths 3, 12, 7, 20, 2, 15.
Megatron SixDocuments() {
  Megatron m;
  for (int64_t length : {3, 12, 7, 20, 2, 15}) {
    std::vector<int64_t> doc;
    const int64_t d = static_cast<int64_t>(m.documents.size());
    for (int64_t i = 0; i < length; ++i) doc.push_back(10 * d + i % 10);
    m.documents.push_back(doc);
  }
  return m;
}

std::vector<int64_t> Ramp(int64_t n, int64_t modulo) {
  std::vector<int64_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back((i * 7919) % modulo);
  return t;
}

TokenDataOptions Flat(const std::string& path, int bytes, int64_t vocab) {
  TokenDataOptions o;
  o.path = path;
  o.format = TokenFormat::kFlat;
  o.flat_bytes_per_token = bytes;
  o.vocab_size = vocab;
  o.seq_len = 8;
  o.micro_batch_size = 2;
  o.num_microbatches = 2;
  o.seed = 5;
  return o;
}

TEST(TokenFileTest, FlatUint16AndUint32RoundTrip) {
  for (int bytes : {2, 4}) {
    const int64_t vocab = bytes == 2 ? 65535 : 100000;
    const std::vector<int64_t> tokens = Ramp(1000, vocab);
    const std::string path = TempPath(absl::StrCat("flat", bytes, ".bin"));
    WriteFile(path, Encode(tokens, bytes));
    absl::StatusOr<std::shared_ptr<const TokenFile>> file = TokenFile::OpenFlat(path, bytes);
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_EQ((*file)->num_tokens(), 1000);
    for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ((*file)->Token(i), tokens[i]) << i;
    EXPECT_EQ((*file)->document_starts(), (std::vector<int64_t>{0, 1000}));
    EXPECT_TRUE((*file)->CheckVocabulary(vocab).ok());
  }
}

TEST(TokenFileTest, FlatErrorsNameTheFileAndValue) {
  const std::string odd = TempPath("odd.bin");
  WriteFile(odd, std::string(7, '\1'));
  absl::Status s = TokenFile::OpenFlat(odd, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(odd + ": size 7 bytes is not a multiple of the token size (2"),
            std::string::npos)
      << s;
  EXPECT_EQ(TokenFile::OpenFlat(odd, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenFile::OpenFlat(TempPath("missing.bin"), 2).status().code(),
            absl::StatusCode::kNotFound);
  // A token outside the vocabulary: the file, token index and byte offset.
  std::vector<int64_t> tokens = Ramp(100, 50);
  tokens[37] = 50;
  const std::string path = TempPath("big_id.bin");
  WriteFile(path, Encode(tokens, 2));
  TokenDataOptions o = Flat(path, 2, 50);
  s = ValidateTokenData(o);
  EXPECT_EQ(s.message(), absl::StrCat(path,
                                      ": token 37 (byte offset 74) is 50, outside the model's "
                                      "vocabulary [0, 50)"));
  o.vocab_size = 51;
  EXPECT_TRUE(ValidateTokenData(o).ok());
}

// Issue #42 class 4: a FIFO as a flat token file, a Megatron .idx or .bin
// blocked the launcher forever; each is refused naming it, without waiting.
TEST(TokenFileTest, FifosAreRefusedWithoutBlocking) {
  const std::string fifo = TempPath("tokens_fifo.bin");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(TokenFile::OpenFlat(fifo, 2).status().message().find(
                "token file '" + fifo + "' is a FIFO; give a regular file"),
            std::string::npos);
  const Megatron m = SixDocuments();
  const std::string idx_fifo = TempPath("idx_fifo");
  WriteFile(idx_fifo + ".bin", m.Bin());
  ASSERT_EQ(::mkfifo((idx_fifo + ".idx").c_str(), 0600), 0);
  EXPECT_NE(TokenFile::OpenMegatron(idx_fifo).status().message().find("Megatron index '" +
                                                                      idx_fifo + ".idx' is a FIFO"),
            std::string::npos);
  const std::string bin_fifo = TempPath("bin_fifo");
  WriteFile(bin_fifo + ".idx", m.Idx());
  ASSERT_EQ(::mkfifo((bin_fifo + ".bin").c_str(), 0600), 0);
  EXPECT_NE(TokenFile::OpenMegatron(bin_fifo).status().message().find("token file '" + bin_fifo +
                                                                      ".bin' is a FIFO"),
            std::string::npos);
}

// Issue #42 class 11: uint32 ids read as uint16 trained on every second token
// being 0. Refused naming data.dtype; a uint16 file with zeros (id 0 is
// end-of-text) is not, nor a short file, nor a Megatron file (its .idx names
// its dtype).
TEST(TokenFileTest, AUint32FileReadAsUint16IsRefused) {
  const std::vector<int64_t> tokens = Ramp(200, 300);
  const std::string wide = TempPath("wide.bin");
  WriteFile(wide, Encode(tokens, 4));
  absl::StatusOr<std::shared_ptr<const TokenFile>> file = TokenFile::OpenFlat(wide, 2);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->CheckVocabulary(300).message(),
            absl::StrCat(wide,
                         ": every second token read as uint16 is 0 (200 of them): a file "
                         "of uint32 ids read as uint16; set data.dtype to uint32"));
  file = TokenFile::OpenFlat(wide, 4);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->CheckVocabulary(300).ok());
  std::vector<int64_t> with_zeros = Ramp(200, 300);
  for (size_t i = 1; i < with_zeros.size(); i += 4) with_zeros[i] = 0;
  const std::string narrow = TempPath("narrow_zeros.bin");
  WriteFile(narrow, Encode(with_zeros, 2));
  EXPECT_TRUE((*TokenFile::OpenFlat(narrow, 2))->CheckVocabulary(300).ok());
  const std::string short_wide = TempPath("short_wide.bin");
  WriteFile(short_wide, Encode(Ramp(20, 300), 4));
  EXPECT_TRUE((*TokenFile::OpenFlat(short_wide, 2))->CheckVocabulary(300).ok());
}

// Issue #42 class 11: a flat token file truncated while a run read it killed
// the rank with SIGBUS, its cause unnamed. The reader names the file and
// exits with kTokenFileChangedExitCode.
TEST(TokenFileDeathTest, AFileTruncatedUnderTheReaderIsNamed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = TempPath("shrinks.bin");
  WriteFile(path, Encode(Ramp(1 << 16, 300), 2));
  EXPECT_EXIT(
      {
        absl::StatusOr<std::shared_ptr<const TokenFile>> file = TokenFile::OpenFlat(path, 2);
        if (!file.ok()) std::abort();
        if (::truncate(path.c_str(), 0) != 0) std::abort();
        std::printf("%lld\n", static_cast<long long>((*file)->Token((1 << 16) - 1)));
      },
      testing::ExitedWithCode(kTokenFileChangedExitCode),
      "error: token file .*shrinks.bin changed while this run read it");
}

TEST(TokenFileTest, MegatronDocumentsAndDtypes) {
  Megatron m = SixDocuments();
  absl::StatusOr<std::shared_ptr<const TokenFile>> file =
      TokenFile::OpenMegatron(m.Write("six") + ".idx");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->num_tokens(), 3 + 12 + 7 + 20 + 2 + 15);
  EXPECT_EQ((*file)->document_starts(), (std::vector<int64_t>{0, 3, 15, 22, 42, 44, 59}));
  EXPECT_EQ((*file)->Token(15), 20);
  // int32 (code 4) with negative ids: read signed, and refused by the vocabulary check.
  m.code = 4;
  m.bytes = 4;
  m.documents = {{5, -1, 7}};
  file = TokenFile::OpenMegatron(m.Write("int32"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->Token(1), -1);
  EXPECT_NE((*file)->CheckVocabulary(10).message().find("token 1 (byte offset 4) is -1"),
            std::string::npos);
}

TEST(TokenFileTest, CorruptMegatronFilesGetClearErrors) {
  const Megatron m = SixDocuments();
  auto open_with = [&](const std::string& name, const std::string& bin, const std::string& idx) {
    const std::string prefix = TempPath(name);
    WriteFile(prefix + ".bin", bin);
    WriteFile(prefix + ".idx", idx);
    return std::string(TokenFile::OpenMegatron(prefix).status().message());
  };
  std::string idx = m.Idx();
  idx[0] = 'X';
  EXPECT_NE(open_with("magic", m.Bin(), idx).find("wrong magic"), std::string::npos);
  idx = m.Idx();
  idx[9] = 2;
  EXPECT_NE(open_with("version", m.Bin(), idx).find("version 2"), std::string::npos);
  idx = m.Idx();
  idx[17] = 7;  // float32
  EXPECT_NE(open_with("float", m.Bin(), idx).find("dtype code 7 is not an integer"),
            std::string::npos);
  // A truncated .idx, a .bin that lost its last token, a .bin with an odd size.
  EXPECT_NE(open_with("short_idx", m.Bin(), m.Idx().substr(0, m.Idx().size() - 8))
                .find("does not match its counts"),
            std::string::npos);
  std::string bin = m.Bin();
  EXPECT_NE(open_with("short_bin", bin.substr(0, bin.size() - 2), m.Idx())
                .find("sequence lengths sum to 59 tokens but"),
            std::string::npos);
  EXPECT_NE(open_with("odd_bin", bin.substr(0, bin.size() - 1), m.Idx())
                .find("is not a multiple of the token size"),
            std::string::npos);
  // A pointer that does not follow the lengths before it.
  idx = m.Idx();
  idx[34 + 6 * 4 + 8] += 2;  // sequence 1's pointer
  EXPECT_NE(open_with("pointer", m.Bin(), idx).find("sequence 1 points at byte 8"),
            std::string::npos);
  EXPECT_EQ(TokenFile::OpenMegatron(TempPath("nothing")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TokenDataTest, WindowsAreShiftedPairsFromTheFile) {
  const std::vector<int64_t> tokens = Ramp(500, 300);
  const std::string path = TempPath("windows.bin");
  WriteFile(path, Encode(tokens, 2));
  absl::StatusOr<TokenBatchSource> source = TokenBatchSource::Create(Flat(path, 2, 300));
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->num_windows(), 500 - 8);
  MicroBatch batch = source->Batch(3, 1);
  const torch::Tensor& in = batch.Get("input_ids");
  const torch::Tensor& labels = batch.Get("labels");
  ASSERT_EQ(in.sizes(), (std::vector<int64_t>{2, 8}));
  for (int64_t row = 0; row < 2; ++row) {
    const int64_t start = source->WindowStart(3, 2 + row);
    for (int64_t j = 0; j < 8; ++j) {
      EXPECT_EQ(in[row][j].item<int64_t>(), tokens[start + j]);
      EXPECT_EQ(labels[row][j].item<int64_t>(), tokens[start + j + 1]);
    }
  }
}

// A loss mask beside the tokens (PATH.loss_mask, one byte per token): the
// windows carry it for their labels, the global batch's trained labels are
// its sum over the step's windows, and a mask of the wrong size or with
// other bytes than 0 and 1 is refused naming the file.
TEST(TokenDataTest, LossMaskFileMarksTrainedLabels) {
  const std::vector<int64_t> tokens = Ramp(500, 300);
  const std::string path = TempPath("masked.bin");
  WriteFile(path, Encode(tokens, 2));
  TokenDataOptions o = Flat(path, 2, 300);
  EXPECT_EQ(LossMaskPath(o), path + ".loss_mask");
  std::string mask;
  for (int64_t i = 0; i < 500; ++i) mask.push_back(static_cast<char>(i % 3 == 0 ? 0 : 1));
  WriteFile(path + ".loss_mask", mask);
  absl::StatusOr<TokenBatchSource> source = TokenBatchSource::Create(o);
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_TRUE(source->has_loss_mask());
  int64_t total = 0;
  for (int64_t index = 0; index < o.num_microbatches; ++index) {
    MicroBatch batch = source->AtGlobalIndex(2, index);
    const torch::Tensor& m = batch.Get(kLossMaskKey);
    for (int64_t row = 0; row < m.size(0); ++row) {
      const int64_t start = source->WindowStart(2, index * o.micro_batch_size + row);
      for (int64_t j = 0; j < m.size(1); ++j) {
        EXPECT_EQ(m[row][j].item<float>(), (start + j + 1) % 3 == 0 ? 0.0f : 1.0f);
      }
    }
    total += static_cast<int64_t>(m.sum().item<double>());
  }
  EXPECT_EQ(source->GlobalLossTokens(2), total);
  absl::StatusOr<MicroBatchData> data = source->Get(2, 0);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->global_loss_tokens, total);

  WriteFile(path + ".loss_mask", mask.substr(0, 499));
  absl::StatusOr<TokenBatchSource> short_mask = TokenBatchSource::Create(o);
  ASSERT_FALSE(short_mask.ok());
  EXPECT_NE(short_mask.status().message().find("holds 499 bytes but"), std::string::npos)
      << short_mask.status();
  mask[7] = 2;
  WriteFile(path + ".loss_mask", mask);
  absl::StatusOr<TokenBatchSource> bad_byte = TokenBatchSource::Create(o);
  ASSERT_FALSE(bad_byte.ok());
  EXPECT_NE(bad_byte.status().message().find("byte 7 is 2"), std::string::npos)
      << bad_byte.status();
  TokenDataOptions megatron = o;
  megatron.format = TokenFormat::kMegatron;
  megatron.path = "/data/set.idx";
  EXPECT_EQ(LossMaskPath(megatron), "/data/set.loss_mask");
}

TEST(TokenDataTest, SameGlobalBatchForEveryLayoutAndExactResume) {
  const std::string path = TempPath("layout.bin");
  WriteFile(path, Encode(Ramp(3000, 1000), 4));
  TokenDataOptions one = Flat(path, 4, 1000);
  one.num_microbatches = 4;
  absl::StatusOr<TokenBatchSource> whole = TokenBatchSource::Create(one);
  ASSERT_TRUE(whole.ok()) << whole.status();
  // dp 2 x 2 micro-batches: rank r's micro-batch j is global index 2r + j.
  for (int64_t rank : {0, 1}) {
    TokenDataOptions o = one;
    o.dp_size = 2;
    o.dp_rank = rank;
    o.num_microbatches = 2;
    absl::StatusOr<TokenBatchSource> part = TokenBatchSource::Create(o);
    ASSERT_TRUE(part.ok()) << part.status();
    for (int64_t step : {0, 7}) {
      for (int64_t j = 0; j < 2; ++j) {
        EXPECT_TRUE(torch::equal(part->Batch(step, j).Get("input_ids"),
                                 whole->AtGlobalIndex(step, 2 * rank + j).Get("input_ids")));
      }
    }
  }
  // Resume: a run interrupted after step 4 opens the files again (a new
  // process would) and continues; steps 5.. equal the uninterrupted run's.
  std::vector<torch::Tensor> uninterrupted;
  for (int64_t step = 0; step < 10; ++step) {
    for (const MicroBatch& b : whole->Step(step)) uninterrupted.push_back(b.Get("labels"));
  }
  std::vector<torch::Tensor> resumed;
  {
    absl::StatusOr<TokenBatchSource> first = TokenBatchSource::Create(one);
    for (int64_t step = 0; step < 5; ++step) {
      for (const MicroBatch& b : first->Step(step)) resumed.push_back(b.Get("labels"));
    }
  }
  absl::StatusOr<TokenBatchSource> second = TokenBatchSource::Create(one);
  ASSERT_TRUE(second.ok());
  for (int64_t step = 5; step < 10; ++step) {
    for (const MicroBatch& b : second->Step(step)) resumed.push_back(b.Get("labels"));
  }
  ASSERT_EQ(resumed.size(), uninterrupted.size());
  for (size_t i = 0; i < resumed.size(); ++i)
    EXPECT_TRUE(torch::equal(resumed[i], uninterrupted[i]));
  // Another seed gives other batches (the comparison above can fail).
  TokenDataOptions other = one;
  other.seed = 6;
  EXPECT_FALSE(torch::equal(TokenBatchSource::Create(other)->Batch(0, 0).Get("labels"),
                            whole->Batch(0, 0).Get("labels")));
}

TEST(TokenDataTest, EvalSplitIsDisjointFromTrain) {
  const std::string path = TempPath("split.bin");
  WriteFile(path, Encode(Ramp(1000, 1000), 2));
  TokenDataOptions o = Flat(path, 2, 1000);
  o.eval_fraction = 0.1;
  absl::StatusOr<TokenBatchSource> train = TokenBatchSource::Create(o);
  o.split = TokenSplit::kEval;
  absl::StatusOr<TokenBatchSource> eval = TokenBatchSource::Create(o);
  ASSERT_TRUE(train.ok() && eval.ok()) << train.status() << eval.status();
  EXPECT_EQ(train->num_windows(), 900 - 8);
  EXPECT_EQ(eval->num_windows(), 100 - 8);
  for (int64_t step = 0; step < 50; ++step) {
    for (int64_t row = 0; row < 8; ++row) {
      EXPECT_LE(train->WindowStart(step, row) + 8, 899);
      EXPECT_GE(eval->WindowStart(step, row), 900);
      EXPECT_LE(eval->WindowStart(step, row) + 8, 999);
    }
  }
  o.eval_fraction = 0.005;  // 5 tokens: no window of 9
  EXPECT_NE(ValidateTokenData(o).message().find("the eval split (tokens [995, 1000)) holds no "
                                                "window of seq_len + 1 = 9 tokens"),
            std::string::npos)
      << ValidateTokenData(o);
  o.eval_fraction = 1.0;
  EXPECT_NE(ValidateTokenData(o).message().find("eval_fraction (1) must be in [0, 1)"),
            std::string::npos);
}

TEST(TokenDataTest, DocumentAwareWindowsStayInsideOneDocument) {
  const std::string prefix = SixDocuments().Write("aware");
  TokenDataOptions o;
  o.path = prefix;
  o.format = TokenFormat::kMegatron;
  o.vocab_size = 60;
  o.seq_len = 6;
  o.micro_batch_size = 4;
  o.num_microbatches = 1;
  o.document_aware = true;
  absl::StatusOr<TokenBatchSource> source = TokenBatchSource::Create(o);
  ASSERT_TRUE(source.ok()) << source.status();
  // Documents of 12, 7, 20 and 15 tokens hold 6 + 1 + 14 + 9 windows of 7.
  EXPECT_EQ(source->num_windows(), 30);
  std::set<int64_t> documents_seen;
  for (int64_t step = 0; step < 100; ++step) {
    MicroBatch b = source->Batch(step, 0);
    torch::Tensor window = torch::cat({b.Get("input_ids"), b.Get("labels").slice(1, 5)}, 1);
    for (int64_t row = 0; row < 4; ++row) {
      const int64_t doc = window[row][0].item<int64_t>() / 10;
      EXPECT_TRUE(torch::equal(window[row].div(10, "floor"), torch::full({7}, doc, torch::kLong)))
          << window[row];
      documents_seen.insert(doc);
    }
  }
  EXPECT_EQ(documents_seen, (std::set<int64_t>{1, 2, 3, 5}));
  // Without document awareness windows do cross documents.
  o.document_aware = false;
  source = TokenBatchSource::Create(o);
  EXPECT_EQ(source->num_windows(), 59 - 6);
  bool crossed = false;
  for (int64_t step = 0; step < 100 && !crossed; ++step) {
    torch::Tensor ids = source->Batch(step, 0).Get("input_ids").div(10, "floor");
    crossed = !torch::equal(ids, ids.select(1, 0).unsqueeze(1).expand_as(ids));
  }
  EXPECT_TRUE(crossed);
  EXPECT_EQ(ParseTokenFormat("megatron").value(), TokenFormat::kMegatron);
  EXPECT_EQ(ParseTokenFormat("json").status().message(),
            "token format \"json\" is not one of: flat, megatron");
}

}  // namespace
}  // namespace pp
