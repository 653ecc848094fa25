#include "checkpoint/model/checkpoint_lock.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/model/test_files.h"

namespace pp {
namespace {

using checkpoint::test_files::FreshDir;

namespace fs = std::filesystem;

TEST(CheckpointDirLockTest, ASecondHolderIsRefusedNamingTheFirstUntilItReleases) {
  const std::string root = (fs::path(FreshDir("lock_live")) / "ckpt").string();
  auto first = CheckpointDirLock::Acquire(root, ThisProcessAsHolder("run-A", "runs/a"));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->recovered(), "");
  EXPECT_TRUE(fs::exists(fs::path(root) / kCheckpointLockFileName));

  auto second = CheckpointDirLock::Acquire(root, ThisProcessAsHolder("run-B", "runs/b"));
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  const std::string msg(second.status().message());
  EXPECT_TRUE(absl::StrContains(msg, "checkpoint dir " + root + " is in use by run 'run-A'"))
      << msg;
  EXPECT_TRUE(absl::StrContains(msg, absl::StrCat("pid ", ::getpid()))) << msg;
  EXPECT_TRUE(absl::StrContains(msg, "owner 'runs/a'")) << msg;
  EXPECT_EQ(CheckCheckpointDirFree(root).code(), absl::StatusCode::kFailedPrecondition);

  first->reset();
  EXPECT_TRUE(CheckCheckpointDirFree(root).ok());
  auto third = CheckpointDirLock::Acquire(root, ThisProcessAsHolder("run-B", "runs/b"));
  ASSERT_TRUE(third.ok()) << third.status();
  // Released cleanly: nothing stale to report.
  EXPECT_EQ((*third)->recovered(), "");
}

// A holder that dies without releasing (SIGKILL): its lock is free at once,
// and the next run says whose stale lock it took over.
TEST(CheckpointDirLockTest, ALockOfADeadProcessIsRecoveredAndSaidSo) {
  const std::string root = (fs::path(FreshDir("lock_stale")) / "ckpt").string();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(60);  // never outlives a lost parent
    auto lock = CheckpointDirLock::Acquire(root, ThisProcessAsHolder("run-dead", "runs/dead"));
    const char byte = lock.ok() ? 1 : 0;
    if (::write(ready[1], &byte, 1) != 1) ::_exit(3);
    while (true) ::pause();
  }
  ::close(ready[1]);
  pollfd p{ready[0], POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 30000), 1) << "the child never took the lock";
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(byte, 1);

  auto refused = CheckpointDirLock::Acquire(root, ThisProcessAsHolder("run-new", "runs/new"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), absl::StrCat("pid ", child)))
      << refused.status();

  ::kill(child, SIGKILL);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  auto taken = CheckpointDirLock::Acquire(root, ThisProcessAsHolder("run-new", "runs/new"));
  ASSERT_TRUE(taken.ok()) << taken.status();
  const std::string& recovered = (*taken)->recovered();
  EXPECT_TRUE(absl::StrContains(recovered, "took over the stale lock")) << recovered;
  EXPECT_TRUE(absl::StrContains(recovered, "run 'run-dead'")) << recovered;
  EXPECT_TRUE(absl::StrContains(recovered, absl::StrCat("pid ", child))) << recovered;
}

TEST(CheckpointDirLockTest, AnUncreatableDirIsNamed) {
  const std::string file = (fs::path(FreshDir("lock_file")) / "plain").string();
  checkpoint::test_files::Spit(file, "not a directory");
  auto lock = CheckpointDirLock::Acquire(file + "/ckpt", ThisProcessAsHolder("r", "o"));
  EXPECT_FALSE(lock.ok());
  EXPECT_TRUE(absl::StrContains(lock.status().message(), file + "/ckpt")) << lock.status();
}

}  // namespace
}  // namespace pp
