#include "models/data/corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include <sys/stat.h>

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

absl::StatusOr<CorpusListing> ListCorpusFiles(const std::string& dir, int64_t max_entries) {
  CorpusListing listing;
  // Folders by (device, inode): a link back to an ancestor (or a sibling
  // already walked) is a folder seen before.
  std::set<std::pair<dev_t, ino_t>> seen_folders;
  std::vector<fs::path> pending = {fs::path(dir)};
  int64_t entries = 0;
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) seen_folders.insert({st.st_dev, st.st_ino});
  while (!pending.empty()) {
    const fs::path folder = std::move(pending.back());
    pending.pop_back();
    std::error_code ec;
    fs::directory_iterator it(folder, fs::directory_options::skip_permission_denied, ec);
    for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
      if (++entries > max_entries) {
        return absl::InvalidArgumentError(absl::StrCat(
            "'", dir, "' holds more than ", max_entries,
            " entries (files and folders, following links); pass a smaller folder or a file"));
      }
      const fs::path& path = it->path();
      if (::stat(path.c_str(), &st) != 0) continue;  // a dangling link
      if (S_ISDIR(st.st_mode)) {
        if (seen_folders.insert({st.st_dev, st.st_ino}).second) {
          pending.push_back(path);
        } else {
          ++listing.repeated_folders;
        }
      } else if (S_ISREG(st.st_mode)) {
        listing.files.push_back(path.string());
      }
    }
    // An unreadable folder below the top is skipped, as before.
    if (ec && folder == fs::path(dir)) {
      return absl::InternalError(absl::StrCat("listing '", dir, "': ", ec.message()));
    }
  }
  std::sort(listing.files.begin(), listing.files.end());
  return listing;
}

absl::StatusOr<Corpus> LoadCorpus(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("corpus path '", path, "' does not exist; pass --data=<text file or folder>"));
  }
  std::vector<fs::path> candidates;
  if (fs::is_directory(path, ec)) {
    absl::StatusOr<CorpusListing> listing = ListCorpusFiles(path);
    if (!listing.ok()) return listing.status();
    candidates.assign(listing->files.begin(), listing->files.end());
  } else {
    candidates.push_back(path);
  }

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

std::vector<std::string> SplitParagraphs(const std::string& text) {
  std::vector<std::string> paragraphs;
  std::string current;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    end = end == std::string::npos ? text.size() : end + 1;
    const std::string line = text.substr(at, end - at);
    at = end;
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) {
      if (!current.empty()) paragraphs.push_back(std::move(current));
      current.clear();
    } else {
      current += line;
    }
  }
  if (!current.empty()) paragraphs.push_back(std::move(current));
  return paragraphs;
}

}  // namespace pp
