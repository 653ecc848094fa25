// Restarts across nodes (--max_restarts with --nnodes > 1): the launchers of a
// run agree on every attempt (a "round") through a c10d TCPStore that node 0's
// launcher hosts on --master_port + 1, as torchrun's agents rendezvous for
// every round:
//   - before starting its workers, each launcher joins the round and waits for
//     every node (a node missing after the join timeout ends the run, named);
//   - a launcher whose workers fail posts the cause (the first post of a round
//     wins); the others see it while supervising (Failure) and stop theirs at
//     once instead of waiting out their p2p timeouts;
//   - once its workers have exited, each posts how its attempt ended and its
//     furthest training step, and every launcher reads every node's (Finish):
//     the same facts, so the same decision (restart or stop) on every node.
// No worker of round r meets a worker of round r + 1: a launcher joins r + 1
// only after all of its round-r workers exited, and the round's workers start
// only once every node has joined.
//
// Thread-compatible: one launcher thread uses it.
#ifndef TOPOLOGY_RESTART_ROUNDS_H_
#define TOPOLOGY_RESTART_ROUNDS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pp {

// How one node's attempt ended.
struct NodeOutcome {
  int node = 0;
  bool ok = false;                      // every worker of the node exited 0
  bool worker_failed = false;           // a worker failed (not a signal to the launcher)
  bool stopped_for_other_node = false;  // stopped because another node failed
  int64_t furthest_step = -1;           // the furthest training step a worker reported
  std::string cause;                    // why the node's attempt failed ("" when ok)
};

class RestartRounds {
 public:
  // Returns the signal that arrived for the launcher (SIGINT, SIGTERM,
  // SIGHUP), 0 when none did; called between the waits' polls.
  using SignalCheck = std::function<int()>;

  // Node 0 hosts the store on `host`:`port` (its launcher's address as the
  // workers see it); every node connects, retrying up to `timeout`, which also
  // bounds every wait for the other nodes. Unavailable naming the address when
  // the store cannot be reached. Every wait, the connection's included, ends
  // early with Cancelled naming the signal and the awaited nodes when
  // `signals` reports one (a Ctrl-C while another node is awaited).
  static absl::StatusOr<std::unique_ptr<RestartRounds>> Connect(const std::string& host, int port,
                                                                int node_rank, int nnodes,
                                                                absl::Duration timeout,
                                                                SignalCheck signals = nullptr);
  ~RestartRounds();

  // Joins `round` and waits until every node has: DeadlineExceeded naming the
  // nodes that did not join within the timeout.
  absl::Status Join(int round);
  // Posts this node's failure of `round` ("node N: <cause>" for the others);
  // only a round's first post is kept.
  void PostFailure(int round, const std::string& cause);
  // The first failure posted in `round` by another node, if any (a quick
  // look at the store; nullopt too when the store cannot be read).
  std::optional<std::string> Failure(int round);
  // Posts this node's outcome of `round` and returns every node's, by node,
  // once all are there: DeadlineExceeded naming the nodes that did not report
  // within the timeout. Node 0 (the store's host) returns only once every
  // node has read them.
  absl::StatusOr<std::vector<NodeOutcome>> Finish(int round, const NodeOutcome& mine);

  // The root cause among `outcomes` that failed, as "node N: <cause>": a
  // worker stopped by a signal (its peers then time out), else one killed by
  // a signal, else the lowest node's; never a node stopped only because
  // another failed. "" when none failed. The same on every node.
  static std::string RootCause(const std::vector<NodeOutcome>& outcomes);

 private:
  RestartRounds() = default;
  // Waits until `count_key` reaches nnodes_; the error names the nodes whose
  // `node_key(n)` is missing.
  absl::Status WaitForAll(const std::string& count_key, const std::string& what, int round,
                          const std::function<std::string(int)>& node_key);
  // Cancelled "received <signal> while waiting for <awaited()>; stopping"
  // when signals_ reports one (`awaited` runs only then: it may read the
  // store).
  absl::Status Interrupted(const std::function<std::string()>& awaited) const;

  struct Store;  // the c10d store, kept out of this header
  std::unique_ptr<Store> store_;
  int node_rank_ = 0;
  int nnodes_ = 1;
  absl::Duration timeout_;
  SignalCheck signals_;
};

}  // namespace pp

#endif  // TOPOLOGY_RESTART_ROUNDS_H_
