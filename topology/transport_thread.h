// The priority of Gloo's transport thread (parallelism.transport_thread_nice).
//
// Gloo's TCP transport runs one event-loop thread per device. Its loop waits in
// a level-triggered epoll_wait and, on a readable socket, only try-locks the
// socket's pair: when a compute thread holds that lock (posting a send or a
// receive on the same pair), the loop returns at once and epoll reports the same
// socket again, so the thread spins in the kernel until the lock is free. With
// the ranks' compute threads already using every core (2 ranks on 2 cores), the
// spinning thread takes CPU from the very thread that holds the lock: measured
// on the overhead GPT (docs/performance.md), each rank's loop thread used about
// as much CPU in system time as 2/3 of its compute thread. A higher nice value
// for the loop thread lets it run only when its rank's compute thread waits,
// which is when it has work to do.
//
// The loop thread is not ours (Gloo starts it in its device's constructor), so
// it is found the way `top -H` would: the threads of this process that did not
// exist before the device was made and that now wait in epoll.
#ifndef TOPOLOGY_TRANSPORT_THREAD_H_
#define TOPOLOGY_TRANSPORT_THREAD_H_

#include <sys/types.h>

#include <chrono>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pp {

// Nice values a transport thread may be given (raising priority, i.e. a
// negative value, needs privileges a worker should not have).
inline constexpr int kMinTransportThreadNice = 0;
inline constexpr int kMaxTransportThreadNice = 19;

// InvalidArgument naming `nice` and the valid range unless it is in
// [kMinTransportThreadNice, kMaxTransportThreadNice].
absl::Status CheckTransportThreadNice(int nice);

// The ids of this process's threads (/proc/self/task), ascending.
std::vector<pid_t> ThreadIdsOfThisProcess();

// Whether thread `tid` of this process is blocked in epoll_wait or epoll_pwait
// now (/proc/self/task/<tid>/syscall).
bool ThreadWaitsInEpoll(pid_t tid);

// The nice value of thread `tid` of this process.
absl::StatusOr<int> ThreadNice(pid_t tid);

// Gives `nice` to every thread of this process that is not in `before` and
// waits in epoll within `patience` (a new thread may not have reached its loop
// yet). Returns how many threads it changed (0 when none got there: the caller
// says so). Errors: `nice` out of range, or setpriority failing (naming the
// thread and errno).
absl::StatusOr<int> NiceNewEpollThreads(const std::vector<pid_t>& before, int nice,
                                        std::chrono::milliseconds patience);

}  // namespace pp

#endif  // TOPOLOGY_TRANSPORT_THREAD_H_
