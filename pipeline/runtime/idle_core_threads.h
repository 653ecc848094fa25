// Idle cores for a rank's matrix products on the CPU (threads.borrow_idle_cores).
//
// Ranks that share a machine split its cores: on 2 cores with pp = 2 each rank
// runs its matrix products on one BLAS thread (topology/worker_resources.h).
// Yet every schedule has actions during which it keeps pipeline peers on the
// same machine waiting: under 1F1B the first stage runs its first F before any
// other stage has an input, and its last B after every other stage is done.
// IdleCoreLender gives such an action the idle peers' share of the cores as
// BLAS threads, for that action only.
//
// Which peers are idle comes from the schedule's data dependencies
// (pipeline/schedule/ir/idle_peers.h), not from timing, so it holds in every
// run: a rank computing at the same moment is never counted idle, and the
// threads of the ranks running at once never add up to more than the
// machine's cores. OpenBLAS splits a matrix product over its threads by rows
// and columns of the result, never over the summed dimension, so every result
// has the same bits with any thread count; the option changes speed only.
// MKL gives no such promise (refused before launch: driver/experiment_config).
//
// Next: pipeline/runtime/trainer.h (TrainerOptions::idle_cores).
#ifndef PIPELINE_RUNTIME_IDLE_CORE_THREADS_H_
#define PIPELINE_RUNTIME_IDLE_CORE_THREADS_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeline/runtime/action_observer.h"
#include "pipeline/schedule/ir/action.h"
#include "pipeline/schedule/ir/lowering.h"

namespace pp {

// This rank's machine, as the driver sees it. Plain value type.
struct IdleCoreOptions {
  int machine_cores = 1;  // cores the ranks on this machine share
  int machine_ranks = 1;  // ranks on this machine, of every group
  int base_threads = 1;   // this rank's BLAS threads outside lent actions
  // The pipeline ranks (stage ids) of this rank's pipe group that run on the
  // same machine, itself excluded: the only ranks whose idleness the schedule
  // decides (another replica's or tensor rank's stage runs a schedule of its
  // own and counts as busy).
  std::vector<int> pipe_peers_on_machine;
};

// The BLAS threads of each compute leaf (F, B, I, W, vocabulary pass) of
// `rank`'s list in `program` that gets more than base_threads:
// machine_cores / (machine_ranks - peers idle during it), rounded down.
// InvalidArgument for options out of range (named) or a program whose
// compute order cannot run; an empty plan for a forward-only program.
absl::StatusOr<absl::flat_hash_map<Action, int>> PlanIdleCoreThreads(
    const LoweredProgram& program, int rank, const IdleCoreOptions& options);

// Sets the planned BLAS threads at each planned action's start and
// base_threads at every other action's start and at the step's end, calling
// `set_threads` only when the count changes. Training steps only: an
// evaluation step is left at base_threads. Not thread-safe (the executor's
// thread calls it); borrows nothing.
class IdleCoreLender : public ActionObserver {
 public:
  // `set_threads`: torch_compat::SetBlasThreads in a worker.
  IdleCoreLender(IdleCoreOptions options, std::function<bool(int)> set_threads);

  // Plans `rank`'s list of `program` (the Trainer's training program; again
  // when it changes). On error the previous plan stays.
  absl::Status Plan(const LoweredProgram& program, int rank);
  const absl::flat_hash_map<Action, int>& plan() const { return plan_; }
  // Actions run with lent threads since construction.
  int64_t lent_actions() const { return lent_actions_; }

  void ActionStart(const ObservedStep& step, const Action& action) override;
  absl::Status StepEnd(const ObservedStep& step, const absl::Status& status) override;

 private:
  void Set(int threads);

  IdleCoreOptions options_;
  std::function<bool(int)> set_threads_;
  absl::flat_hash_map<Action, int> plan_;
  int current_;
  int64_t lent_actions_ = 0;
};

}  // namespace pp

#endif  // PIPELINE_RUNTIME_IDLE_CORE_THREADS_H_
