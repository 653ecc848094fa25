// Plain file I/O (model checkpoints, saved schedules), errors as absl::Status naming the path:
// whole-file write with fsync, whole-file read, fsync of a file or directory,
// atomic replacement (temporary file, fsync, rename, fsync of the parent),
// recursive removal, and a read-only copy-on-write mapping of a file.
// Knows nothing about tensors or checkpoint layout.
#ifndef COMMON_FILE_IO_H_
#define COMMON_FILE_IO_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pp {

// `what: strerror(err)`; NotFound for ENOENT, ResourceExhausted (with what
// to do) for ENOSPC, EDQUOT and EFBIG, Internal otherwise.
absl::Status ErrnoStatus(int err, absl::string_view what);

// Creates or truncates `path`, writes `contents` and fsyncs it.
[[nodiscard]] absl::Status WriteFileSynced(const std::string& path, absl::string_view contents);

// The whole of `path`. NotFound when it does not exist.
[[nodiscard]] absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// fsync(2) of a file or directory; errors name the path.
[[nodiscard]] absl::Status SyncFile(const std::string& path);

// Writes `contents` to `path` via `<path>.tmp`, fsync and rename, then fsyncs
// the parent directory: a crash leaves either the old or the new file.
[[nodiscard]] absl::Status WriteFileDurably(const std::string& path, const std::string& contents);

// Removes `path` and everything below it; a missing path is fine.
[[nodiscard]] absl::Status RemoveTree(const std::string& path);

// A private copy-on-write mapping of a whole file: readers see the page cache
// with no copy; memory that aliases it (zero-copy tensors) may be written
// without changing the file. Unmapped when the last reference goes.
class MappedFile {
 public:
  // NotFound naming `path` when it does not exist.
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedFile() = default;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace pp

#endif  // COMMON_FILE_IO_H_
