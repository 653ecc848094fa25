#include "checkpoint/model/checkpoint_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_io.h"

namespace pp {
namespace {

namespace fs = std::filesystem;

std::string Serialize(const CheckpointLockHolder& h) {
  return absl::StrCat("pid: ", h.pid, "\nhost: ", h.host, "\nrun_id: ", h.run_id,
                      "\nowner: ", h.owner, "\nsince: ", h.since, "\n");
}

// The holder a lock file names; nullopt-like (pid 0) when empty or garbled.
CheckpointLockHolder Parse(const std::string& text) {
  CheckpointLockHolder h;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(": ", 1));
    const std::string value(absl::StripAsciiWhitespace(kv.second));
    if (kv.first == "pid") {
      if (!absl::SimpleAtoi(value, &h.pid)) h.pid = 0;
    } else if (kv.first == "host") {
      h.host = value;
    } else if (kv.first == "run_id") {
      h.run_id = value;
    } else if (kv.first == "owner") {
      h.owner = value;
    } else if (kv.first == "since") {
      h.since = value;
    }
  }
  return h;
}

// The contents of the open lock file.
std::string ReadAll(int fd) {
  std::string text;
  char buffer[4096];
  off_t offset = 0;
  while (text.size() < (1 << 16)) {
    const ssize_t n = ::pread(fd, buffer, sizeof(buffer), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
    offset += n;
  }
  return text;
}

absl::Status HeldBy(const std::string& root, const std::string& path, const std::string& text) {
  const CheckpointLockHolder holder = Parse(text);
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint dir ", root, " is in use by ",
      holder.pid > 0 ? holder.ToString() : std::string("another process (the lock names nobody)"),
      ", which holds ", path,
      ": two runs saving into one checkpoint dir would mix their checkpoints. Wait for it to "
      "end, or give this run its own checkpoint dir (checkpoint.dir, output_dir or name)"));
}

absl::StatusOr<int> OpenLockFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open the checkpoint lock ", path));
  return fd;
}

}  // namespace

std::string CheckpointLockHolder::ToString() const {
  return absl::StrCat("run '", run_id, "' (owner '", owner, "', pid ", pid, " on host ", host,
                      ", since ", since, ")");
}

CheckpointLockHolder ThisProcessAsHolder(const std::string& run_id, const std::string& owner) {
  CheckpointLockHolder h;
  h.pid = ::getpid();
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) h.host = host;
  h.run_id = run_id;
  h.owner = owner;
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char when[32] = {};
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &utc);
  h.since = when;
  return h;
}

absl::StatusOr<std::unique_ptr<CheckpointDirLock>> CheckpointDirLock::Acquire(
    const std::string& root, const CheckpointLockHolder& holder) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create checkpoint dir ", root, ": ", ec.message()));
  }
  const std::string path = (fs::path(root) / kCheckpointLockFileName).string();
  absl::StatusOr<int> fd = OpenLockFile(path);
  if (!fd.ok()) return fd.status();
  if (::flock(*fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string text = ReadAll(*fd);
    ::close(*fd);
    if (err == EWOULDBLOCK) return HeldBy(root, path, text);
    return ErrnoStatus(err, absl::StrCat("cannot lock ", path));
  }
  std::unique_ptr<CheckpointDirLock> lock(new CheckpointDirLock(path, *fd));
  const CheckpointLockHolder previous = Parse(ReadAll(*fd));
  if (previous.pid > 0) {
    lock->recovered_ =
        absl::StrCat("took over the stale lock ", path, " of ", previous.ToString(),
                     ": that process no longer holds it (it ended without releasing it)");
  }
  const std::string text = Serialize(holder);
  if (::ftruncate(*fd, 0) != 0 ||
      ::pwrite(*fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    return ErrnoStatus(errno, absl::StrCat("cannot write the checkpoint lock ", path));
  }
  // The holder's name must survive a crash of this host only as long as the
  // lock would: no fsync.
  return lock;
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ < 0) return;
  // Emptied while still held, so no taker sees a half-written name.
  if (::ftruncate(fd_, 0) != 0) {
    // The lock still goes with the close; the next taker reports a stale one.
  }
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

absl::Status CheckCheckpointDirFree(const std::string& root) {
  const std::string path = (fs::path(root) / kCheckpointLockFileName).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return absl::OkStatus();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open the checkpoint lock ", path));
  // A shared lock conflicts exactly with a holder's exclusive one.
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    const int err = errno;
    const std::string text = ReadAll(fd);
    ::close(fd);
    if (err == EWOULDBLOCK) return HeldBy(root, path, text);
    return ErrnoStatus(err, absl::StrCat("cannot lock ", path));
  }
  ::flock(fd, LOCK_UN);
  ::close(fd);
  return absl::OkStatus();
}

}  // namespace pp
