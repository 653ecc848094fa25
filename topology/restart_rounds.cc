#include "topology/restart_rounds.h"

#include <string.h>

#include <chrono>
#include <thread>
#include <utility>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace pp {

struct RestartRounds::Store {
  c10::intrusive_ptr<c10d::Store> store;
};

namespace {

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string Text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::string RoundKey(int round, const std::string& what) {
  return absl::StrCat("pp/restart/round_", round, "/", what);
}

// "ok|worker_failed|stopped_for_other_node|step|cause" (the cause last: it
// may hold '|').
std::string Encode(const NodeOutcome& o) {
  return absl::StrCat(o.ok ? 1 : 0, "|", o.worker_failed ? 1 : 0, "|",
                      o.stopped_for_other_node ? 1 : 0, "|", o.furthest_step, "|", o.cause);
}

NodeOutcome Decode(int node, const std::string& text) {
  NodeOutcome o;
  o.node = node;
  std::vector<std::string> parts = absl::StrSplit(text, absl::MaxSplits('|', 4));
  if (parts.size() != 5 || !absl::SimpleAtoi(parts[3], &o.furthest_step)) {
    o.cause = absl::StrCat("node ", node, " reported an unreadable outcome '", text, "'");
    return o;
  }
  o.ok = parts[0] == "1";
  o.worker_failed = parts[1] == "1";
  o.stopped_for_other_node = parts[2] == "1";
  o.cause = parts[4];
  return o;
}

}  // namespace

RestartRounds::~RestartRounds() = default;

absl::StatusOr<std::unique_ptr<RestartRounds>> RestartRounds::Connect(const std::string& host,
                                                                      int port, int node_rank,
                                                                      int nnodes,
                                                                      absl::Duration timeout,
                                                                      SignalCheck signals) {
  std::unique_ptr<RestartRounds> rounds(new RestartRounds());
  rounds->node_rank_ = node_rank;
  rounds->nnodes_ = nnodes;
  rounds->timeout_ = timeout;
  rounds->signals_ = std::move(signals);
  const auto ms = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  // A client retries in attempts of at most a second, so that a signal is
  // seen while node 0's launcher is still awaited.
  const absl::Time deadline = absl::Now() + timeout;
  const absl::Duration attempt = node_rank == 0 ? timeout : std::min(timeout, absl::Seconds(1));
  for (;;) {
    try {
      c10d::TCPStoreOptions o;
      o.port = static_cast<std::uint16_t>(port);
      o.isServer = node_rank == 0;
      o.numWorkers = nnodes;
      o.waitWorkers = false;
      o.timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(attempt));
      rounds->store_ = std::make_unique<Store>();
      rounds->store_->store = c10::make_intrusive<c10d::TCPStore>(host, o);
      rounds->store_->store->setTimeout(ms);
      return rounds;
    } catch (const std::exception& e) {
      if (absl::Status s = rounds->Interrupted([&] {
            return absl::StrCat("node 0's launcher (the restart store at ", host, ":", port, ")");
          });
          !s.ok()) {
        return s;
      }
      if (absl::Now() + attempt <= deadline) continue;
      return absl::UnavailableError(absl::StrCat(
          "node ", node_rank, ": the launchers' restart store at ", host, ":", port,
          node_rank == 0 ? " (hosted by this node 0)" : " (node 0's launcher hosts it)",
          " cannot be reached within ", absl::FormatDuration(timeout), ": ", e.what()));
    }
  }
}

absl::Status RestartRounds::Interrupted(const std::function<std::string()>& awaited) const {
  const int signo = signals_ ? signals_() : 0;
  if (signo == 0) return absl::OkStatus();
  return absl::CancelledError(
      absl::StrCat("received ", strsignal(signo), " while waiting for ", awaited(), "; stopping"));
}

absl::Status RestartRounds::WaitForAll(const std::string& count_key, const std::string& what,
                                       int round, const std::function<std::string(int)>& node_key) {
  const absl::Time deadline = absl::Now() + timeout_;
  try {
    auto missing = [&] {
      std::vector<int> nodes;
      for (int n = 0; n < nnodes_; ++n) {
        if (!store_->store->check({node_key(n)})) nodes.push_back(n);
      }
      return nodes;
    };
    while (store_->store->add(count_key, 0) < nnodes_) {
      if (absl::Status s = Interrupted([&] {
            return absl::StrCat("node(s) ", absl::StrJoin(missing(), ", "), " to ", what,
                                " restart round ", round);
          });
          !s.ok()) {
        return s;
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("node(s) ", absl::StrJoin(missing(), ", "), " did not ", what,
                         " restart round ", round, " within ", absl::FormatDuration(timeout_),
                         " (--restart_join_timeout); ending the run"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("node ", node_rank_,
                                               ": the restart store failed in round ", round,
                                               " (node 0's launcher gone?): ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status RestartRounds::Join(int round) {
  try {
    store_->store->set(RoundKey(round, absl::StrCat("joined/", node_rank_)), Bytes("1"));
    store_->store->add(RoundKey(round, "joined"), 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("node ", node_rank_, ": cannot join restart round ",
                                               round, " (node 0's launcher gone?): ", e.what()));
  }
  return WaitForAll(RoundKey(round, "joined"), "join", round,
                    [round](int n) { return RoundKey(round, absl::StrCat("joined/", n)); });
}

void RestartRounds::PostFailure(int round, const std::string& cause) {
  try {
    if (store_->store->add(RoundKey(round, "failures"), 1) == 1) {
      store_->store->set(RoundKey(round, "failure"),
                         Bytes(absl::StrCat("node ", node_rank_, ": ", cause)));
    }
  } catch (const std::exception&) {
    // The outcome posted in Finish still carries the cause.
  }
}

std::optional<std::string> RestartRounds::Failure(int round) {
  try {
    const std::string key = RoundKey(round, "failure");
    if (!store_->store->check({key})) return std::nullopt;
    return Text(store_->store->get(key));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

absl::StatusOr<std::vector<NodeOutcome>> RestartRounds::Finish(int round, const NodeOutcome& mine) {
  auto outcome_key = [round](int n) { return RoundKey(round, absl::StrCat("outcome/", n)); };
  try {
    store_->store->set(outcome_key(node_rank_), Bytes(Encode(mine)));
    store_->store->add(RoundKey(round, "finished"), 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("node ", node_rank_,
                                               ": cannot report restart round ", round,
                                               " (node 0's launcher gone?): ", e.what()));
  }
  if (absl::Status s =
          WaitForAll(RoundKey(round, "finished"), "report the end of", round, outcome_key);
      !s.ok()) {
    return s;
  }
  std::vector<NodeOutcome> all;
  auto read_key = [round](int n) { return RoundKey(round, absl::StrCat("read/", n)); };
  try {
    for (int n = 0; n < nnodes_; ++n) {
      all.push_back(Decode(n, Text(store_->store->get(outcome_key(n)))));
    }
    store_->store->set(read_key(node_rank_), Bytes("1"));
    store_->store->add(RoundKey(round, "read"), 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("node ", node_rank_, ": cannot read restart round ",
                                               round, "'s outcomes: ", e.what()));
  }
  // Node 0's launcher hosts the store: it stays until every node has read
  // the outcomes (a run that ends here would otherwise take the store away
  // from a node still reading them).
  if (node_rank_ == 0) {
    if (absl::Status s =
            WaitForAll(RoundKey(round, "read"), "read the outcomes of", round, read_key);
        !s.ok()) {
      return s;
    }
  }
  return all;
}

std::string RestartRounds::RootCause(const std::vector<NodeOutcome>& outcomes) {
  const NodeOutcome* best = nullptr;
  int best_rank = 0;
  for (const NodeOutcome& o : outcomes) {
    if (o.ok || o.stopped_for_other_node) continue;
    const int rank = o.cause.find("was stopped by signal") != std::string::npos  ? 0
                     : o.cause.find("was killed by signal") != std::string::npos ? 1
                                                                                 : 2;
    if (best == nullptr || rank < best_rank) {
      best = &o;
      best_rank = rank;
    }
  }
  return best == nullptr ? "" : absl::StrCat("node ", best->node, ": ", best->cause);
}

}  // namespace pp
