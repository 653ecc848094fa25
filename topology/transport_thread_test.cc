#include "topology/transport_thread.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "topology/process_group.h"

namespace pp {
namespace {

using ::testing::HasSubstr;

pid_t CurrentThreadId() { return static_cast<pid_t>(syscall(SYS_gettid)); }

void WaitForId(const std::atomic<pid_t>& id) {
  while (id.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// A thread blocked in epoll_wait until Release(), the way Gloo's loop waits.
class EpollWaiter {
 public:
  EpollWaiter() : epoll_fd_(epoll_create1(0)), event_fd_(eventfd(0, 0)) {
    epoll_event event{};
    event.events = EPOLLIN;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &event);
    thread_ = std::thread([this] {
      id_ = CurrentThreadId();
      epoll_event ready{};
      while (epoll_wait(epoll_fd_, &ready, 1, -1) < 1) {
      }
    });
    WaitForId(id_);
  }
  ~EpollWaiter() {
    const uint64_t one = 1;
    EXPECT_EQ(write(event_fd_, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
    thread_.join();
    close(event_fd_);
    close(epoll_fd_);
  }
  pid_t id() const { return id_; }

 private:
  int epoll_fd_;
  int event_fd_;
  std::atomic<pid_t> id_{0};
  std::thread thread_;
};

// A thread blocked on a condition variable (a futex, not epoll).
class ConditionWaiter {
 public:
  ConditionWaiter() {
    thread_ = std::thread([this] {
      id_ = CurrentThreadId();
      std::unique_lock<std::mutex> lock(mutex_);
      released_cv_.wait(lock, [this] { return released_; });
    });
    WaitForId(id_);
  }
  ~ConditionWaiter() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      released_ = true;
    }
    released_cv_.notify_all();
    thread_.join();
  }
  pid_t id() const { return id_; }

 private:
  std::mutex mutex_;
  std::condition_variable released_cv_;
  bool released_ = false;
  std::atomic<pid_t> id_{0};
  std::thread thread_;
};

TEST(TransportThreadTest, NiceOutsideZeroToNineteenIsRefusedNamingTheValue) {
  EXPECT_TRUE(CheckTransportThreadNice(0).ok());
  EXPECT_TRUE(CheckTransportThreadNice(19).ok());
  for (int bad : {-1, 20}) {
    const absl::Status status = CheckTransportThreadNice(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("transport_thread_nice = " + std::to_string(bad)));
    EXPECT_THAT(std::string(status.message()), HasSubstr("[0, 19]"));
  }
  EXPECT_EQ(NiceNewEpollThreads({}, 20, std::chrono::milliseconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TransportThreadTest, ListsTheCallingThread) {
  const std::vector<pid_t> ids = ThreadIdsOfThisProcess();
  EXPECT_TRUE(std::binary_search(ids.begin(), ids.end(), CurrentThreadId()));
}

TEST(TransportThreadTest, NicesOnlyTheNewThreadThatWaitsInEpoll) {
  const int own_nice = ThreadNice(CurrentThreadId()).value();
  ConditionWaiter old_epoll_free;
  const std::vector<pid_t> before = ThreadIdsOfThisProcess();
  ConditionWaiter futex_waiter;
  EpollWaiter epoll_waiter;
  EXPECT_FALSE(ThreadWaitsInEpoll(futex_waiter.id()));

  const absl::StatusOr<int> changed =
      NiceNewEpollThreads(before, std::min(own_nice + 7, 19), std::chrono::seconds(5));
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(*changed, 1);
  EXPECT_TRUE(ThreadWaitsInEpoll(epoll_waiter.id()));
  EXPECT_EQ(ThreadNice(epoll_waiter.id()).value(), std::min(own_nice + 7, 19));
  EXPECT_EQ(ThreadNice(futex_waiter.id()).value(), own_nice);
  EXPECT_EQ(ThreadNice(old_epoll_free.id()).value(), own_nice);
  EXPECT_EQ(ThreadNice(CurrentThreadId()).value(), own_nice);
}

TEST(TransportThreadTest, NoNewEpollThreadChangesNothingWithinPatience) {
  const std::vector<pid_t> before = ThreadIdsOfThisProcess();
  ConditionWaiter futex_waiter;
  const absl::StatusOr<int> changed = NiceNewEpollThreads(before, 5, std::chrono::milliseconds(20));
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(*changed, 0);
}

TEST(TransportThreadTest, GlooDeviceGetsItsLoopThreadNiced) {
  const int own_nice = ThreadNice(CurrentThreadId()).value();
  const int nice = std::min(own_nice + 5, 19);
  const std::vector<pid_t> before = ThreadIdsOfThisProcess();
  auto device = MakeGlooDevice("127.0.0.1", nice);
  ASSERT_TRUE(device.ok()) << device.status();
  int niced_epoll_threads = 0;
  for (pid_t tid : ThreadIdsOfThisProcess()) {
    if (std::binary_search(before.begin(), before.end(), tid)) {
      EXPECT_EQ(ThreadNice(tid).value(), own_nice) << "thread " << tid << " existed before";
      continue;
    }
    if (ThreadNice(tid).value() == nice) {
      EXPECT_TRUE(ThreadWaitsInEpoll(tid)) << "thread " << tid;
      ++niced_epoll_threads;
    }
  }
  EXPECT_EQ(niced_epoll_threads, 1);

  const auto refused = MakeGlooDevice("127.0.0.1", 20);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pp
