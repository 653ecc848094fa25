#include "common/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pp {
namespace {

const char* Kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

absl::Status ErrnoError(int err, absl::string_view what, const std::string& path,
                        absl::string_view action) {
  const std::string message =
      absl::StrCat("cannot ", action, " ", what, " '", path, "': ", std::strerror(err));
  return err == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
}

}  // namespace

absl::StatusOr<int> OpenRegularFile(absl::string_view what, const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoError(errno, what, path, "open");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(err, what, path, "stat");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' is ", Kind(st.st_mode),
                     "; give a regular file (a FIFO or device would block or never end)"));
  }
  // Regular files ignore O_NONBLOCK, but the caller gets a plain descriptor.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

absl::StatusOr<std::string> ReadRegularFile(absl::string_view what, const std::string& path) {
  absl::StatusOr<int> fd = OpenRegularFile(what, path);
  if (!fd.ok()) return fd.status();
  std::string data;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(*fd, buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(*fd);
      return ErrnoError(err, what, path, "read");
    }
    data.append(buffer, static_cast<size_t>(n));
  }
  ::close(*fd);
  return data;
}

}  // namespace pp
