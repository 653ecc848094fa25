#include "topology/wait_work.h"

#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "topology/process_group.h"

namespace pp {
namespace {

std::string What(absl::string_view collective, absl::string_view group,
                 std::chrono::milliseconds timeout) {
  return absl::StrCat(collective, " on ", group, " (timeout ", timeout.count(), " ms)");
}

// The Status for an exception thrown while starting or waiting.
absl::Status FromException(const std::exception& e, absl::string_view collective,
                           absl::string_view group, std::chrono::milliseconds timeout) {
  std::string message = GlooExceptionMessage(e);
  message = message.substr(0, message.find('\n'));
  if (LooksLikeTimeout(message)) {
    return absl::DeadlineExceededError(
        absl::StrCat(What(collective, group, timeout),
                     " did not complete: a member rank died, hung or is out of step: ", message));
  }
  return absl::InternalError(absl::StrCat(What(collective, group, timeout), " failed: ", message));
}

}  // namespace

absl::Status WaitWork(const WorkPtr& work, absl::string_view collective, absl::string_view group,
                      std::chrono::milliseconds timeout) {
  if (!work) {
    return absl::InvalidArgumentError(
        absl::StrCat(What(collective, group, timeout), ": no work to wait on (null)"));
  }
  if (timeout.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(What(collective, group, timeout), ": the timeout must be > 0 ms"));
  }
  try {
    if (!work->wait(timeout)) {
      return absl::AbortedError(absl::StrCat(What(collective, group, timeout), " was aborted"));
    }
  } catch (const std::exception& e) {
    return FromException(e, collective, group, timeout);
  }
  return absl::OkStatus();
}

bool RecordCompletionTime(const WorkPtr& work, std::shared_ptr<std::atomic<int64_t>> latest) {
  try {
    work->getFuture()->addCallback([latest = std::move(latest)](c10::ivalue::Future&) {
      const int64_t now = SteadyClockMicros();
      int64_t seen = latest->load();
      while (seen < now && !latest->compare_exchange_weak(seen, now)) {
      }
    });
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

std::optional<int64_t> AwaitCompletionTime(const std::atomic<int64_t>& latest, int* patience_ms) {
  int64_t completed = latest.load();
  while (completed < 0 && *patience_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    --*patience_ms;
    completed = latest.load();
  }
  return completed < 0 ? std::nullopt : std::optional<int64_t>(completed);
}

int64_t SteadyClockMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::StatusOr<WorkPtr> StartWork(absl::string_view collective, absl::string_view group,
                                  std::chrono::milliseconds timeout,
                                  const std::function<WorkPtr()>& start) {
  try {
    return start();
  } catch (const std::exception& e) {
    return FromException(e, collective, group, timeout);
  }
}

absl::Status RunCollective(absl::string_view collective, absl::string_view group,
                           std::chrono::milliseconds timeout,
                           const std::function<WorkPtr()>& start) {
  absl::StatusOr<WorkPtr> work = StartWork(collective, group, timeout, start);
  if (!work.ok()) return work.status();
  return WaitWork(*work, collective, group, timeout);
}

std::string DescribeGroup(absl::string_view name, const std::vector<int>& ranks, int self) {
  constexpr int kMaxNamedPeers = 16;
  std::vector<std::string> peers;
  int unnamed = 0;
  for (int r : ranks) {
    if (r == self) continue;
    if (static_cast<int>(peers.size()) < kMaxNamedPeers) {
      peers.push_back(absl::StrCat("global rank ", r));
    } else {
      ++unnamed;
    }
  }
  std::string text = absl::StrCat(name, " [", absl::StrJoin(ranks, ","), "]");
  if (!peers.empty()) {
    absl::StrAppend(&text, " (this rank's peers: ", absl::StrJoin(peers, ", "));
    if (unnamed > 0) absl::StrAppend(&text, " and ", unnamed, " more");
    absl::StrAppend(&text, ")");
  }
  return text;
}

}  // namespace pp
