// One run at a time per checkpoint directory: `<root>/.lock`, an flock(2)
// held for the run's lifetime whose contents name the holder (pid, host, run
// id, owner, since when).
//
// The kernel drops an flock when its process dies, however it dies, so a lock
// file left by a dead process is stale by construction: the next run takes it
// over and says whose it was. A live holder (another process, or another lock
// object in this one) makes Acquire fail with FailedPrecondition naming it.
//
//   PP_ASSIGN_OR_RETURN(auto lock, CheckpointDirLock::Acquire(dir, holder));
//   if (!lock->recovered().empty()) LOG(WARNING) << lock->recovered();
//   ... the run saves into dir; the lock goes when `lock` does ...
//
// Next: checkpoint/model/checkpoint_dir.h (what lives in the directory).
#ifndef CHECKPOINT_MODEL_CHECKPOINT_LOCK_H_
#define CHECKPOINT_MODEL_CHECKPOINT_LOCK_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pp {

inline constexpr char kCheckpointLockFileName[] = ".lock";

// Who holds (or held) a checkpoint directory.
struct CheckpointLockHolder {
  int64_t pid = 0;
  std::string host;
  // The launch (PP_RUN_ID), may be empty.
  std::string run_id;
  // The run across restarts (its checkpoints' manifest `owner`), may be empty.
  std::string owner;
  // UTC, ISO 8601.
  std::string since;

  // "run 'r' (owner 'o', pid 123 on host h, since 2026-...)".
  std::string ToString() const;
};

// This process: getpid(), gethostname(), the given ids and the time now.
CheckpointLockHolder ThisProcessAsHolder(const std::string& run_id, const std::string& owner);

class CheckpointDirLock {
 public:
  // Creates `root` if needed and takes `<root>/.lock` without waiting.
  // FailedPrecondition naming the live holder and what to do when it is
  // held; errors naming the path when the directory or file cannot be made.
  static absl::StatusOr<std::unique_ptr<CheckpointDirLock>> Acquire(
      const std::string& root, const CheckpointLockHolder& holder);

  // Releases the lock (the file stays, emptied: its next taker recovers
  // nothing).
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

  const std::string& path() const { return path_; }
  // Non-empty when the file named a holder that no longer held it (a run
  // that died without releasing): says whose lock was taken over.
  const std::string& recovered() const { return recovered_; }

 private:
  CheckpointDirLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
  std::string recovered_;
};

// OK when nobody holds `<root>/.lock` (or there is none); FailedPrecondition
// naming the live holder otherwise. Takes nothing: for a check before
// workers start (the run itself still takes the lock).
absl::Status CheckCheckpointDirFree(const std::string& root);

}  // namespace pp

#endif  // CHECKPOINT_MODEL_CHECKPOINT_LOCK_H_
