#include "common/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/regular_file.h"
#include "common/status_macros.h"

namespace pp {

namespace fs = std::filesystem;

absl::Status ErrnoStatus(int err, absl::string_view what) {
  std::string message = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  // Out of space (or over a quota or a file-size limit): the user can fix it.
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
    return absl::ResourceExhaustedError(
        absl::StrCat(message,
                     " (free space on the checkpoint dir's file system, or save "
                     "elsewhere; the previous checkpoint and 'latest' are untouched)"));
  }
  return absl::InternalError(message);
}

absl::Status WriteFileSynced(const std::string& path, absl::string_view contents) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot create checkpoint file ", path));
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + done,
                        std::min<size_t>(contents.size() - done, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat("cannot write checkpoint file ", path));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot fsync checkpoint file ", path));
  }
  if (::close(fd) != 0) return ErrnoStatus(errno, absl::StrCat("cannot close ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  absl::StatusOr<int> opened = OpenRegularFile("checkpoint file", path);
  if (!opened.ok()) return opened.status();
  int fd = *opened;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot stat ", path));
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat("cannot read ", path));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  data.resize(done);
  return data;
}

absl::Status SyncFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", path, " to fsync it"));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoStatus(err, absl::StrCat("cannot fsync ", path));
  return absl::OkStatus();
}

absl::Status WriteFileDurably(const std::string& path, const std::string& contents) {
  std::string tmp = absl::StrCat(path, ".tmp");
  PP_RETURN_IF_ERROR(WriteFileSynced(tmp, contents));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  std::string parent = fs::path(path).parent_path().string();
  return SyncFile(parent.empty() ? "." : parent);
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  absl::StatusOr<int> opened = OpenRegularFile("checkpoint file", path);
  if (!opened.ok()) return opened.status();
  int fd = *opened;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot stat ", path));
  }
  auto file = std::shared_ptr<MappedFile>(new MappedFile());
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    // Copy-on-write: tensors that alias the mapping (zero-copy loads) may be
    // written by their user without touching the file.
    void* p = ::mmap(nullptr, file->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat("cannot map ", path));
    }
    ::madvise(p, file->size_, MADV_SEQUENTIAL);
    file->data_ = static_cast<const char*>(p);
  }
  ::close(fd);
  return std::shared_ptr<const MappedFile>(std::move(file));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
}

}  // namespace pp
