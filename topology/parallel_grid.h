// ParallelGrid: this rank's place in a ProcessTopology plus the c10d process
// groups along each axis.
//
// Built once per process after rendezvous, by every rank (collectively):
//
//   PP_ASSIGN_OR_RETURN(pp::World world, pp::RendezvousFromEnv({}));
//   PP_ASSIGN_OR_RETURN(pp::ProcessTopology topo, pp::PipeDataParallelTopology(2, 2));
//   PP_ASSIGN_OR_RETURN(pp::ParallelGrid grid, pp::ParallelGrid::Create(world, topo));
//   grid.pipe_group()->send(...);   // group rank == stage id
//   grid.data_group()->allreduce(grads);
//
// Group ranks: every axis group lists its members in ascending global rank, so
// a member's group rank is its coordinate on that axis (pipe group rank ==
// stage id, data group rank == data-parallel id).
//
// Next: pipeline/runtime/ (p2p between stages), topology/launcher.h.
#ifndef TOPOLOGY_PARALLEL_GRID_H_
#define TOPOLOGY_PARALLEL_GRID_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topology/process_group.h"
#include "topology/process_topology.h"
#include "topology/rendezvous.h"

namespace pp {

// Owns (shares) its process groups; movable, not copyable. Accessors are
// thread-safe; NewGroup is not (call it from one thread).
class ParallelGrid {
 public:
  // Builds the pipe, data, model and model-parallel groups this rank belongs
  // to. Every rank of `world` must call it with an equal topology. The
  // topology needs a "pipe" axis; "data" and "model" are optional (size 1).
  // InvalidArgument when world.size != topology.world_size() (naming both);
  // DeadlineExceeded when a member never arrives.
  static absl::StatusOr<ParallelGrid> Create(const World& world, ProcessTopology topology);

  ParallelGrid(ParallelGrid&&) = default;
  ParallelGrid& operator=(ParallelGrid&&) = default;
  ParallelGrid(const ParallelGrid&) = delete;
  ParallelGrid& operator=(const ParallelGrid&) = delete;

  const ProcessTopology& topology() const { return topology_; }
  int global_rank() const { return rank_; }
  int world_size() const { return topology_.world_size(); }

  int stage_id() const { return stage_id_; }
  int data_parallel_id() const { return data_parallel_id_; }
  int model_parallel_id() const { return model_parallel_id_; }
  int num_stages() const { return num_stages_; }
  int data_parallel_size() const { return data_parallel_size_; }
  int model_parallel_size() const { return model_parallel_size_; }

  bool IsFirstStage() const { return stage_id_ == 0; }
  bool IsLastStage() const { return stage_id_ == num_stages_ - 1; }

  // Global rank of `stage` with the given data-parallel id and this rank's
  // model-parallel id. InvalidArgument for out-of-range stage/data.
  absl::StatusOr<int> StageToGlobal(int stage, int data) const;
  // Global ranks of the previous/next stage in this rank's pipeline, wrapping
  // around (the previous stage of stage 0 is the last stage: interleaved
  // schedules send from the last stage to the first). Check IsFirstStage()/
  // IsLastStage() for a non-circular pipeline. With one stage: this rank.
  // These are global (world) ranks; p2p on pipe_group() addresses peers by
  // group rank, which is the stage id.
  int PrevStageRank() const { return prev_stage_rank_; }
  int NextStageRank() const { return next_stage_rank_; }

  // Ranks differing from this one only in the pipe / data / model coordinate.
  const ProcessGroupPtr& pipe_group() const { return pipe_group_; }
  const ProcessGroupPtr& data_group() const { return data_group_; }
  const ProcessGroupPtr& model_group() const { return model_group_; }
  // The ranks sharing this rank's data-parallel id: one whole model replica
  // (pipe x model; DeepSpeed's "model parallel" group). Reduce the global
  // gradient norm over it.
  const ProcessGroupPtr& model_parallel_group() const { return model_parallel_group_; }
  const ProcessGroupPtr& world_group() const { return world_group_; }

  // Global ranks of the members, in group-rank order.
  const std::vector<int>& pipe_group_ranks() const { return pipe_ranks_; }
  const std::vector<int>& data_group_ranks() const { return data_ranks_; }
  const std::vector<int>& model_group_ranks() const { return model_ranks_; }
  const std::vector<int>& model_parallel_group_ranks() const { return model_parallel_ranks_; }

  // A new group of the given global ranks (group rank = index in `ranks`),
  // e.g. the stages holding one tied weight. Called only by the member ranks,
  // each with the same `ranks` and `name`; the name must be unique per grid
  // (it keys the rendezvous). InvalidArgument for duplicates, out-of-range
  // ranks, this rank not being a member, or a name already used;
  // DeadlineExceeded when a member never calls it.
  absl::StatusOr<ProcessGroupPtr> NewGroup(const std::vector<int>& ranks, const std::string& name);

  // pp::DescribeGroup (wait_work.h) with this rank as `self`.
  std::string DescribeGroup(const std::string& name, const std::vector<int>& ranks) const;
  // DescribeGroup("world group", every global rank).
  std::string DescribeWorldGroup() const;

  // One line: "rank 3 pipe=2 x data=2 | stage 1/2 dp 1/2 mp 0/1 | pipe [1,3] data [2,3] model [3]".
  std::string DebugString() const;

 private:
  ParallelGrid() = default;

  ProcessTopology topology_;
  int rank_ = 0;
  StorePtr store_;
  GroupOptions group_options_;

  int stage_id_ = 0;
  int data_parallel_id_ = 0;
  int model_parallel_id_ = 0;
  int num_stages_ = 1;
  int data_parallel_size_ = 1;
  int model_parallel_size_ = 1;
  int prev_stage_rank_ = 0;
  int next_stage_rank_ = 0;

  ProcessGroupPtr world_group_;
  ProcessGroupPtr pipe_group_;
  ProcessGroupPtr data_group_;
  ProcessGroupPtr model_group_;
  ProcessGroupPtr model_parallel_group_;
  std::vector<int> pipe_ranks_;
  std::vector<int> data_ranks_;
  std::vector<int> model_ranks_;
  std::vector<int> model_parallel_ranks_;

  std::set<std::string> group_names_;  // NewGroup names used so far
};

}  // namespace pp

#endif  // TOPOLOGY_PARALLEL_GRID_H_
