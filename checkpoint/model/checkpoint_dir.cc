#include "checkpoint/model/checkpoint_dir.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <system_error>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "google/protobuf/text_format.h"

namespace pp {
namespace {

namespace fs = std::filesystem;
using checkpoint::FileInfo;
using checkpoint::Manifest;

constexpr char kTempPrefix[] = ".tmp-";
constexpr char kOldPrefix[] = ".old-";
constexpr char kPartPrefix[] = "part-rank_";
constexpr char kStepPrefix[] = "step_";

// Step of a directory name "step_N", or -1.
int64_t StepOfName(const std::string& name) {
  absl::string_view rest(name);
  if (!absl::ConsumePrefix(&rest, kStepPrefix)) return -1;
  int64_t step = -1;
  if (!absl::SimpleAtoi(rest, &step) || step < 0) return -1;
  return step;
}

// The manifest's last line: a CRC32C of every byte above it. A text-format
// comment, so protobuf's parser (and a person) reads past it.
constexpr char kChecksumLinePrefix[] = "# manifest crc32c: ";

std::string WithChecksumLine(const std::string& text) {
  return absl::StrCat(
      text, absl::StrFormat("%s%08x\n", kChecksumLinePrefix, Crc32c(text.data(), text.size(), 0)));
}

// OK when `text` ends with a checksum line that matches the text above it,
// or has none (manifests of pipe before the line existed). DataLoss naming
// `path` otherwise.
absl::Status CheckChecksumLine(const std::string& path, const std::string& text) {
  size_t at = text.rfind(kChecksumLinePrefix);
  if (at == std::string::npos) return absl::OkStatus();
  if (at != 0 && text[at - 1] != '\n') return absl::OkStatus();
  absl::string_view hex = absl::StripAsciiWhitespace(
      absl::string_view(text).substr(at + std::strlen(kChecksumLinePrefix)));
  uint32_t want = 0;
  if (hex.size() != 8 || !absl::SimpleHexAtoi(hex, &want)) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", path,
                                            " has a malformed checksum line '", hex,
                                            "': it was edited or truncated after it was written"));
  }
  const uint32_t got = Crc32c(text.data(), at, 0);
  if (got == want) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat(
      "checkpoint manifest %s was edited after it was written (its text has CRC32C %08x, its "
      "last line says %08x): refusing to trust it (a changed step or file list would resume "
      "wrongly). Restore it, or resume from another checkpoint",
      path, got, want));
}

absl::StatusOr<std::string> ReadLatest(const std::string& root) {
  std::string path = (fs::path(root) / kLatestFileName).string();
  PP_ASSIGN_OR_RETURN(std::string name, ReadWholeFile(path));
  name = std::string(absl::StripAsciiWhitespace(name));
  if (StepOfName(name) < 0) {
    return absl::DataLossError(absl::StrCat(
        path, " should hold a checkpoint directory name like step_00000100, found '", name, "'"));
  }
  return name;
}

// Size and CRC32C of the file at `path`, read in 1 MiB pieces.
absl::Status CheckFileDigest(const std::string& path, const FileInfo& expected) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("checkpoint file ", path));
  std::vector<char> buffer(1 << 20);
  uint32_t crc = 0;
  int64_t size = 0;
  while (true) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat("reading checkpoint file ", path));
    }
    if (n == 0) break;
    crc = Crc32c(buffer.data(), static_cast<size_t>(n), crc);
    size += n;
  }
  ::close(fd);
  if (size != expected.size_bytes()) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " has ", size,
                                            " bytes, the manifest says ", expected.size_bytes(),
                                            " (truncated or replaced)"));
  }
  if (crc != expected.crc32c()) {
    return absl::DataLossError(
        absl::StrFormat("checkpoint file %s has CRC32C %08x, the manifest says %08x (corrupted)",
                        path, crc, expected.crc32c()));
  }
  return absl::OkStatus();
}

// True when another open descriptor holds an flock on the directory `dir`.
bool TempDirInUse(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

// Every step_N entry of `root` (complete or not), newest first.
std::vector<std::pair<int64_t, std::string>> StepEntries(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (auto it = fs::directory_iterator(root, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const int64_t step = StepOfName(name);
    if (step >= 0) found.emplace_back(step, name);
  }
  std::sort(found.rbegin(), found.rend());
  return found;
}

}  // namespace

std::string CheckpointName(int64_t step) { return absl::StrFormat("%s%08d", kStepPrefix, step); }

absl::StatusOr<Manifest> ReadManifest(const std::string& dir) {
  std::string path = (fs::path(dir) / kManifestFileName).string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", dir, " does not exist"));
  }
  absl::StatusOr<std::string> bytes = ReadWholeFile(path);
  if (!bytes.ok()) {
    if (absl::IsNotFound(bytes.status())) {
      return absl::NotFoundError(absl::StrCat(dir, " is not a checkpoint: it has no ",
                                              kManifestFileName, " (and no '", kLatestFileName,
                                              "' file naming one)"));
    }
    return bytes.status();
  }
  Manifest manifest;
  if (!google::protobuf::TextFormat::ParseFromString(*bytes, &manifest)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint manifest ", path, " is not a valid text-format pp.checkpoint.Manifest"));
  }
  if (manifest.magic() != kCheckpointMagic) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint manifest ", path, " has magic '",
                                                   manifest.magic(), "', expected '",
                                                   kCheckpointMagic, "': not a pipe checkpoint"));
  }
  if (manifest.format_version() > kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint manifest ", path, " has format_version ", manifest.format_version(),
        ", newer than this build reads (", kCheckpointFormatVersion, "); use a newer pipe"));
  }
  if (manifest.format_version() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint manifest ", path,
                                                   " has format_version ",
                                                   manifest.format_version(), ", expected 1.."));
  }
  PP_RETURN_IF_ERROR(CheckChecksumLine(path, *bytes));
  return manifest;
}

absl::StatusOr<std::string> ResolveCheckpointDir(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint path ", path, " is not a directory"));
  }
  if (fs::exists(fs::path(path) / kManifestFileName, ec)) return path;
  if (fs::exists(fs::path(path) / kLatestFileName, ec)) {
    PP_ASSIGN_OR_RETURN(std::string name, ReadLatest(path));
    std::string dir = (fs::path(path) / name).string();
    if (!fs::exists(fs::path(dir) / kManifestFileName, ec)) {
      return absl::NotFoundError(absl::StrCat((fs::path(path) / kLatestFileName).string(),
                                              " names ", name, " but ", dir,
                                              " is not a complete checkpoint"));
    }
    return dir;
  }
  return absl::NotFoundError(absl::StrCat(path, " is not a checkpoint: it has neither ",
                                          kManifestFileName, " nor a '", kLatestFileName,
                                          "' file"));
}

absl::StatusOr<std::vector<std::string>> ListCheckpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  fs::directory_iterator it(root, ec);
  if (ec)
    return absl::NotFoundError(
        absl::StrCat("cannot list checkpoint root ", root, ": ", ec.message()));
  for (const fs::directory_entry& entry : it) {
    std::string name = entry.path().filename().string();
    int64_t step = StepOfName(name);
    if (step < 0 || !entry.is_directory()) continue;
    if (!fs::exists(entry.path() / kManifestFileName, ec)) continue;
    found.emplace_back(step, name);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> names;
  for (auto& f : found) names.push_back(std::move(f.second));
  return names;
}

absl::Status VerifyCheckpointFiles(const std::string& dir) {
  PP_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(dir));
  for (const FileInfo& f : manifest.files()) {
    if (f.path().empty() || f.path().find('/') != std::string::npos || f.path() == "..") {
      return absl::DataLossError(absl::StrCat("checkpoint manifest in ", dir,
                                              " lists a file named '", f.path(),
                                              "'; file names are plain names inside it"));
    }
    PP_RETURN_IF_ERROR(CheckFileDigest((fs::path(dir) / f.path()).string(), f));
  }
  return absl::OkStatus();
}

absl::StatusOr<ResumeChoice> ChooseResumeCheckpoint(const std::string& root) {
  std::error_code ec;
  const fs::path latest_path = fs::path(root) / kLatestFileName;
  const bool has_latest = fs::exists(latest_path, ec) || fs::is_symlink(latest_path, ec);
  const std::vector<std::pair<int64_t, std::string>> entries = StepEntries(root);
  if (!has_latest && entries.empty()) return ResumeChoice{};
  // Why `latest` cannot be used.
  std::string latest_problem;
  if (!has_latest) {
    latest_problem = absl::StrCat(latest_path.string(), " is missing");
  } else {
    absl::StatusOr<std::string> name = ReadLatest(root);
    if (!name.ok()) {
      latest_problem = std::string(name.status().message());
    } else {
      const std::string dir = (fs::path(root) / *name).string();
      // Every file, not just the manifest: a bit flipped in a tensor file
      // would fail the load, and a restart would fail the same way forever
      // while an older checkpoint verifies (issue #42).
      const absl::Status verified = VerifyCheckpointFiles(dir);
      if (verified.ok()) return ResumeChoice{dir, ""};
      latest_problem = absl::StrCat(latest_path.string(), " names ", *name,
                                    ", which is unusable: ", verified.message());
    }
  }
  std::vector<std::string> skipped;
  for (const auto& [step, name] : entries) {
    const std::string dir = (fs::path(root) / name).string();
    absl::Status verified = VerifyCheckpointFiles(dir);
    if (verified.ok()) {
      std::string warning = absl::StrCat(latest_problem, "; resuming from ", dir,
                                         ", the newest checkpoint whose files all verify");
      if (!skipped.empty())
        absl::StrAppend(&warning, " (skipped: ", absl::StrJoin(skipped, "; "), ")");
      return ResumeChoice{dir, warning};
    }
    skipped.push_back(absl::StrCat(name, ": ", verified.message()));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint dir ", root, " holds no usable checkpoint to resume from: ", latest_problem,
      skipped.empty() ? "" : absl::StrCat("; ", absl::StrJoin(skipped, "; ")),
      ". Refusing to start over there (its saves would replace and prune what is there): "
      "repair or move the directory, or choose another checkpoint dir"));
}

absl::Status CheckCheckpointOwner(const std::string& dir, const Manifest& manifest,
                                  const std::string& owner, bool allow_other_owner) {
  if (owner.empty() || manifest.owner().empty() || manifest.owner() == owner || allow_other_owner) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint ", dir, " was written by run '", manifest.owner(), "', not by this run ('", owner,
      "'): two runs share this checkpoint dir. Refusing to continue from another run's "
      "checkpoint; give each run its own checkpoint dir, or allow it explicitly "
      "(CheckpointPolicy.resume_other_runs; train_gpt and train_bert: "
      "--set=checkpoint.resume_other_runs=true)"));
}

absl::Status CheckRootHoldsNoCheckpoints(const std::string& root) {
  std::error_code ec;
  const bool has_latest = fs::exists(fs::path(root) / kLatestFileName, ec);
  const std::vector<std::pair<int64_t, std::string>> entries = StepEntries(root);
  if (!has_latest && entries.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint dir ", root, " already holds ",
      entries.empty()
          ? std::string("a 'latest' file")
          : absl::StrCat(entries.size(), " checkpoint(s), the newest ", entries.front().second),
      " from another run; a fresh run saving there would replace and prune them. Continue it "
      "with resume=auto (--resume=auto), or save elsewhere (checkpoint.dir, output_dir or name)"));
}

absl::Status PruneCheckpoints(const std::string& root, int keep_last) {
  std::error_code ec;
  // Leftovers of interrupted saves; a temporary folder another save holds
  // (an flock on the directory, PrepareTempCheckpointDir's `hold`) is in use.
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, kTempPrefix) && TempDirInUse(entry.path().string())) continue;
    if (absl::StartsWith(name, kTempPrefix) || absl::StartsWith(name, kOldPrefix)) {
      PP_RETURN_IF_ERROR(RemoveTree(entry.path().string()));
    }
  }
  if (keep_last <= 0) return absl::OkStatus();
  PP_ASSIGN_OR_RETURN(std::vector<std::string> names, ListCheckpoints(root));
  absl::StatusOr<std::string> latest = ReadLatest(root);
  int excess = static_cast<int>(names.size()) - keep_last;
  for (int i = 0; i < excess; ++i) {
    if (latest.ok() && names[i] == *latest) continue;
    PP_RETURN_IF_ERROR(RemoveTree((fs::path(root) / names[i]).string()));
  }
  return SyncFile(root);
}

std::string TempCheckpointDir(const std::string& root, const std::string& name,
                              const std::string& writer) {
  return (fs::path(root) /
          absl::StrCat(kTempPrefix, name, writer.empty() ? "" : absl::StrCat("-", writer)))
      .string();
}

absl::StatusOr<std::string> PrepareTempCheckpointDir(const std::string& root,
                                                     const std::string& name,
                                                     const std::string& writer, int* hold) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("cannot create checkpoint root ", root, ": ", ec.message()));
  std::string tmp = TempCheckpointDir(root, name, writer);
  PP_RETURN_IF_ERROR(RemoveTree(tmp));
  fs::create_directory(tmp, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", ec.message()));
  if (hold != nullptr) {
    *hold = ::open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*hold < 0 || ::flock(*hold, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (*hold >= 0) ::close(*hold);
      *hold = -1;
      return ErrnoStatus(err, absl::StrCat("cannot hold ", tmp));
    }
  }
  return tmp;
}

absl::Status WritePartialManifest(const std::string& tmp_dir, int rank,
                                  const std::vector<FileInfo>& files) {
  Manifest part;
  for (const FileInfo& f : files) *part.add_files() = f;
  std::string text;
  google::protobuf::TextFormat::PrintToString(part, &text);
  std::string path =
      (fs::path(tmp_dir) / absl::StrFormat("%s%05d.textproto", kPartPrefix, rank)).string();
  return WriteFileSynced(path, text);
}

absl::StatusOr<std::string> CommitCheckpoint(const std::string& root, const std::string& name,
                                             Manifest header, int keep_last,
                                             const std::string& writer) {
  std::string tmp = TempCheckpointDir(root, name, writer);
  header.clear_files();
  header.set_magic(kCheckpointMagic);
  header.set_format_version(kCheckpointFormatVersion);
  // Merge the parts in rank order so the manifest is deterministic.
  std::vector<fs::path> parts;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(tmp, ec)) {
    if (absl::StartsWith(entry.path().filename().string(), kPartPrefix))
      parts.push_back(entry.path());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", tmp, ": ", ec.message()));
  std::sort(parts.begin(), parts.end());
  std::map<std::string, int> writer_of;
  std::vector<FileInfo> files;
  for (const fs::path& part_path : parts) {
    PP_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(part_path.string()));
    Manifest part;
    if (!google::protobuf::TextFormat::ParseFromString(bytes, &part)) {
      return absl::DataLossError(
          absl::StrCat("partial manifest ", part_path.string(), " does not parse"));
    }
    for (const FileInfo& f : part.files()) {
      auto [it, inserted] = writer_of.emplace(f.path(), f.writer_rank());
      if (!inserted) {
        return absl::InternalError(absl::StrCat("checkpoint file ", f.path(),
                                                " was written by both rank ", it->second,
                                                " and rank ", f.writer_rank()));
      }
      files.push_back(f);
    }
  }
  std::sort(files.begin(), files.end(), [](const FileInfo& a, const FileInfo& b) {
    if (a.kind() != b.kind()) return a.kind() < b.kind();
    if (a.layer() != b.layer()) return a.layer() < b.layer();
    return a.path() < b.path();
  });
  for (FileInfo& f : files) *header.add_files() = std::move(f);
  std::string text;
  google::protobuf::TextFormat::PrintToString(header, &text);
  std::string manifest_path = (fs::path(tmp) / kManifestFileName).string();
  PP_RETURN_IF_ERROR(WriteFileSynced(manifest_path, WithChecksumLine(text)));
  for (const fs::path& part_path : parts) fs::remove(part_path, ec);
  PP_RETURN_IF_ERROR(SyncFile(tmp));

  std::string final_dir = (fs::path(root) / name).string();
  if (fs::exists(final_dir, ec) || fs::is_symlink(final_dir, ec)) {
    // A checkpoint of this step already exists (a resumed run reaching a step
    // an earlier attempt saved after the one it resumed from): keep it under
    // another name rather than delete what this process did not write.
    std::string kept;
    for (int k = 1;; ++k) {
      kept = absl::StrCat(final_dir, ".replaced-", k);
      if (!fs::exists(kept, ec) && !fs::is_symlink(kept, ec)) break;
    }
    if (::rename(final_dir.c_str(), kept.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("cannot move ", final_dir, " aside to ", kept));
    }
    LOG(WARNING) << "checkpoint " << final_dir << " already existed; kept it as " << kept
                 << " (never deleted) and saved the new one in its place";
  }
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot rename ", tmp, " to ", final_dir));
  }
  PP_RETURN_IF_ERROR(SyncFile(root));
  PP_RETURN_IF_ERROR(WriteFileDurably((fs::path(root) / kLatestFileName).string(), name + "\n"));
  PP_RETURN_IF_ERROR(PruneCheckpoints(root, keep_last));
  return final_dir;
}

}  // namespace pp
