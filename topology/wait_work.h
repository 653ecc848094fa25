// The one way pipe waits on a c10d collective or p2p operation: bounded by a
// timeout, every failure an absl::Status naming the operation, the group and
// the timeout.
//
//   PP_RETURN_IF_ERROR(RunCollective("all-reduce of the loss", "pipe group",
//                                    timeout, [&] { return pipe->allreduce(t); }));
//
// LibTorch 1.13's Work::wait(timeout) throws c10::Error when the timeout
// expires ("Operation timed out!") and rethrows the backend's error (Gloo's own
// timeout, a closed connection) when the operation failed; a `false` return
// means the work was aborted. A rank that died, hung or is out of step (calls
// a different collective) shows up as DeadlineExceeded on its peers.
#ifndef TOPOLOGY_WAIT_WORK_H_
#define TOPOLOGY_WAIT_WORK_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pp {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;

// Waits for `work` at most `timeout` (> 0). OK when it completed. Otherwise,
// with "<collective> on <group>" and the timeout in the message:
// DeadlineExceeded when the wait or the backend timed out, Aborted when the
// work was aborted, Internal for any other backend error (its message kept).
// A null `work` is InvalidArgument.
[[nodiscard]] absl::Status WaitWork(const WorkPtr& work, absl::string_view collective,
                                    absl::string_view group, std::chrono::milliseconds timeout);

// Starts the operation with `start` without waiting for it (an asynchronous
// collective: wait later with WaitWork); an exception thrown by `start` (bad
// tensors, a broken group) becomes the Status RunCollective would return.
[[nodiscard]] absl::StatusOr<WorkPtr> StartWork(absl::string_view collective,
                                                absl::string_view group,
                                                std::chrono::milliseconds timeout,
                                                const std::function<WorkPtr()>& start);

// Raises `latest` to the steady_clock microseconds (ActionTiming's clock) at
// which `work` completes, from the backend's thread through c10d's Work
// future, so that the time an asynchronous collective was in flight can be
// told apart from the time its reader waited. Several works may share one
// `latest` (the last completion wins). The callback runs right after the work
// completes, which may be just after a wait for it returns. False when the
// work has no future (LibTorch 2.x Gloo's reduce_scatter): nothing is written.
bool RecordCompletionTime(const WorkPtr& work, std::shared_ptr<std::atomic<int64_t>> latest);

// After the wait for a work RecordCompletionTime tracks: the time its cell
// holds once the callback has run, waiting for that at most `*patience_ms`
// (decreased by the wait, so that several calls share one budget and a
// backend whose callbacks never come costs it once); nullopt if none came.
std::optional<int64_t> AwaitCompletionTime(const std::atomic<int64_t>& latest, int* patience_ms);

// steady_clock microseconds: the clock RecordCompletionTime writes (and
// ActionTiming's).
int64_t SteadyClockMicros();

// Starts the operation with `start` and waits for it as WaitWork does; an
// exception thrown by `start` (bad tensors, a broken group) becomes the same
// kind of Status instead of escaping.
[[nodiscard]] absl::Status RunCollective(absl::string_view collective, absl::string_view group,
                                         std::chrono::milliseconds timeout,
                                         const std::function<WorkPtr()>& start);

// "<name> [0,1,2] (this rank's peers: global rank 0, global rank 2)": how a
// collective names its group, so that a timeout says which ranks may have
// died or stopped (`self` is this rank's global rank, `ranks` the members'). At
// most 16 peers are named ("... and 40 more").
std::string DescribeGroup(absl::string_view name, const std::vector<int>& ranks, int self);

}  // namespace pp

#endif  // TOPOLOGY_WAIT_WORK_H_
