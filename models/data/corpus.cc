#include "models/data/corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pp {
namespace {

namespace fs = std::filesystem;

bool LooksBinary(const std::string& contents) {
  const size_t n = std::min<size_t>(contents.size(), 4096);
  return contents.find('\0') < n;
}

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat("cannot open ", path.string()));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

absl::StatusOr<Corpus> LoadCorpus(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("corpus path '", path, "' does not exist; pass --data=<text file or folder>"));
  }
  std::vector<fs::path> candidates;
  if (fs::is_directory(path, ec)) {
    auto it = fs::recursive_directory_iterator(path,
                                               fs::directory_options::follow_directory_symlink |
                                                   fs::directory_options::skip_permission_denied,
                                               ec);
    for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (fs::is_regular_file(it->path(), ec)) candidates.push_back(it->path());
    }
    if (ec) return absl::InternalError(absl::StrCat("listing '", path, "': ", ec.message()));
  } else {
    candidates.push_back(path);
  }
  std::sort(candidates.begin(), candidates.end());

  Corpus corpus;
  std::set<fs::path> seen;  // canonical paths: GPL -> GPL-3 is read once
  for (const fs::path& file : candidates) {
    fs::path canonical = fs::weakly_canonical(file, ec);
    if (ec) canonical = file;
    if (!seen.insert(canonical).second) continue;
    absl::StatusOr<std::string> contents = ReadFile(file);
    if (!contents.ok() || contents->empty() || LooksBinary(*contents)) continue;
    corpus.files.push_back(file.string());
    corpus.text += *contents;
    corpus.text += "\n\n";
  }
  if (corpus.files.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("corpus path '", path, "' holds no readable, non-empty text file"));
  }
  return corpus;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> SplitTrainEval(std::vector<int64_t> ids,
                                                                     double eval_fraction) {
  const auto eval_size = static_cast<size_t>(static_cast<double>(ids.size()) * eval_fraction);
  std::vector<int64_t> eval(ids.end() - eval_size, ids.end());
  ids.resize(ids.size() - eval_size);
  return {std::move(ids), std::move(eval)};
}

}  // namespace pp
