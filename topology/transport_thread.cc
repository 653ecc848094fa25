#include "topology/transport_thread.h"

#include <dirent.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pp {
namespace {

// Syscall numbers of the epoll waits on this architecture (aarch64 has no
// plain epoll_wait).
bool IsEpollWaitSyscall(long number) {
#ifdef SYS_epoll_wait
  if (number == SYS_epoll_wait) return true;
#endif
#ifdef SYS_epoll_pwait
  if (number == SYS_epoll_pwait) return true;
#endif
#ifdef SYS_epoll_pwait2
  if (number == SYS_epoll_pwait2) return true;
#endif
  return false;
}

}  // namespace

absl::Status CheckTransportThreadNice(int nice) {
  if (nice >= kMinTransportThreadNice && nice <= kMaxTransportThreadNice) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "parallelism.transport_thread_nice = ", nice, " is out of range: give a nice value in [",
      kMinTransportThreadNice, ", ", kMaxTransportThreadNice,
      "] (0 leaves Gloo's transport thread at the worker's priority; higher runs it only when "
      "the rank's compute thread leaves a core free)"));
}

std::vector<pid_t> ThreadIdsOfThisProcess() {
  std::vector<pid_t> ids;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return ids;
  while (const dirent* entry = readdir(dir)) {
    int id = 0;
    if (absl::SimpleAtoi(entry->d_name, &id)) ids.push_back(static_cast<pid_t>(id));
  }
  closedir(dir);
  std::sort(ids.begin(), ids.end());
  return ids;
}

bool ThreadWaitsInEpoll(pid_t tid) {
  // "<number> <args...>" while blocked in a syscall, "running" or "-1 ..." else.
  std::ifstream in(absl::StrCat("/proc/self/task/", tid, "/syscall"));
  std::string first;
  if (!(in >> first)) return false;
  long number = -1;
  return absl::SimpleAtoi(first, &number) && IsEpollWaitSyscall(number);
}

absl::StatusOr<int> ThreadNice(pid_t tid) {
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  if (nice == -1 && errno != 0) {
    return absl::InternalError(
        absl::StrCat("getpriority of thread ", tid, ": ", std::strerror(errno)));
  }
  return nice;
}

absl::StatusOr<int> NiceNewEpollThreads(const std::vector<pid_t>& before, int nice,
                                        std::chrono::milliseconds patience) {
  if (absl::Status valid = CheckTransportThreadNice(nice); !valid.ok()) return valid;
  std::vector<pid_t> known = before;
  std::sort(known.begin(), known.end());
  std::vector<pid_t> fresh;
  for (pid_t tid : ThreadIdsOfThisProcess()) {
    if (!std::binary_search(known.begin(), known.end(), tid)) fresh.push_back(tid);
  }
  const auto deadline = std::chrono::steady_clock::now() + patience;
  int changed = 0;
  while (!fresh.empty()) {
    for (auto it = fresh.begin(); it != fresh.end();) {
      if (!ThreadWaitsInEpoll(*it)) {
        ++it;
        continue;
      }
      if (setpriority(PRIO_PROCESS, static_cast<id_t>(*it), nice) != 0) {
        return absl::InternalError(absl::StrCat("cannot set nice ", nice, " on thread ", *it,
                                                " (Gloo's transport): ", std::strerror(errno)));
      }
      ++changed;
      it = fresh.erase(it);
    }
    // One transport thread per device: done once one is found and the others
    // (threads started meanwhile by someone else) are given no more time.
    if (changed > 0 || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return changed;
}

}  // namespace pp
