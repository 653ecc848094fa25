#include "topology/process_group.h"

#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "topology/thread_ranks.h"

namespace pp {
namespace {

using std::chrono::seconds;

// Waits until one of `keys` is set. c10d's Store::wait needs all of its keys,
// and which name Gloo uses depends on the LibTorch version.
absl::Status WaitForEitherKey(c10d::Store& store, const std::vector<std::string>& keys,
                              std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    for (const std::string& key : keys) {
      if (store.check({key})) return absl::OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "the early member never published its address (none of ", absl::StrJoin(keys, ", "),
      " within ", std::chrono::duration<double>(timeout).count(), " s)"));
}

// The flake of ThreadRanksTest.GridHasTheRequestedShape ("Connection closed by
// peer" in connectFullMesh): Gloo's connecting side of a pair counts as
// connected once it has written its hello, before the listening side has taken
// the connection. A member that then drops its group at once (a rank whose
// test body ends) closes a socket its peer is still adopting, and the peer's
// construction fails. Here one member arrives late (its peer is already
// waiting for its address) and destroys its group as soon as NewGlooGroup
// returns; the waiting member must still get a working group. Both roles take
// turns so that the late member is the connecting side in half of the rounds
// (Gloo picks the side by comparing the two listening addresses).
TEST(NewGlooGroupTest, AMemberThatDropsItsGroupAtOnceDoesNotBreakItsPeer) {
  const std::string path = FreshTempPath("process_group");
  GroupOptions options[2];
  StorePtr stores[2];
  for (int rank = 0; rank < 2; ++rank) {
    options[rank].timeout = seconds(20);
    auto device = MakeGlooDevice("127.0.0.1");
    ASSERT_TRUE(device.ok()) << device.status();
    options[rank].device = *device;
    stores[rank] = c10::make_intrusive<c10d::FileStore>(path, 2);
    stores[rank]->setTimeout(seconds(20));
  }
  constexpr int kRounds = 40;
  for (int round = 0; round < kRounds; ++round) {
    const int early = round % 2;
    const int late = 1 - early;
    const std::string prefix = absl::StrCat("round/", round);
    absl::Status early_status;
    std::thread early_thread([&] {
      absl::StatusOr<ProcessGroupPtr> group =
          NewGlooGroup(stores[early], prefix, early, 2, options[early]);
      early_status = group.status();
    });
    absl::Status late_status;
    std::thread late_thread([&] {
      // The early member is inside Gloo's connectFullMesh, waiting for this
      // one, once it has published its addresses under
      // "<prefix>/<device index>/": key "rank_<rank>" in LibTorch 1.13's
      // Gloo, key "<rank>" in 2.x's.
      absl::Status published = WaitForEitherKey(
          *stores[late],
          {absl::StrCat(prefix, "/0/rank_", early), absl::StrCat(prefix, "/0/", early)},
          seconds(20));
      if (!published.ok()) {
        late_status = published;
        return;
      }
      absl::StatusOr<ProcessGroupPtr> group =
          NewGlooGroup(stores[late], prefix, late, 2, options[late]);
      late_status = group.status();
      // `group` goes out of scope here: its sockets close at once.
    });
    early_thread.join();
    late_thread.join();
    ASSERT_TRUE(late_status.ok()) << "round " << round << ": " << late_status;
    ASSERT_TRUE(early_status.ok()) << "round " << round << ": " << early_status;
  }
  for (StorePtr& store : stores) store.reset();
  ::unlink(path.c_str());
}

TEST(NewGlooGroupTest, RankOutOfRangeIsRefused) {
  const std::string path = FreshTempPath("process_group");
  StorePtr store = c10::make_intrusive<c10d::FileStore>(path, 1);
  absl::StatusOr<ProcessGroupPtr> group = NewGlooGroup(store, "g", 2, 2, GroupOptions());
  EXPECT_EQ(group.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(group.status().message(), "group 'g': rank 2 is out of range [0, 2)");
  store.reset();
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace pp
