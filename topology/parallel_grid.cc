#include "topology/parallel_grid.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "topology/launcher_status.h"
#include "topology/wait_work.h"

namespace pp {
namespace {

// This rank's list in topology.AxisCommLists(axis); {rank} when the topology
// lacks the axis (a size-1 axis).
std::vector<int> OwnList(const ProcessTopology& topology, const std::string& axis, int rank) {
  for (std::vector<int>& list : topology.AxisCommLists(axis)) {
    if (std::find(list.begin(), list.end(), rank) != list.end()) return std::move(list);
  }
  return {rank};
}

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ","), "]");
}

}  // namespace

absl::StatusOr<ParallelGrid> ParallelGrid::Create(const World& world, ProcessTopology topology) {
  if (world.group == nullptr || world.store == nullptr) {
    return absl::InvalidArgumentError(
        "ParallelGrid needs a world from Rendezvous (no group/store)");
  }
  if (world.size != topology.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", world.size, " does not match the topology ",
                     topology.ToString(), ", which needs ", topology.world_size(), " ranks"));
  }
  if (topology.GetDim(kPipeAxis) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology ", topology.ToString(), " has no '", kPipeAxis, "' axis"));
  }
  ParallelGrid grid;
  grid.rank_ = world.rank;
  grid.store_ = world.store;
  grid.group_options_ = world.group_options;
  grid.world_group_ = world.group;
  grid.num_stages_ = topology.GetDim(kPipeAxis);
  grid.data_parallel_size_ = std::max(1, topology.GetDim(kDataAxis));
  grid.model_parallel_size_ = std::max(1, topology.GetDim(kModelAxis));
  PP_ASSIGN_OR_RETURN(grid.stage_id_, topology.GetAxisValue(world.rank, kPipeAxis));
  if (topology.GetDim(kDataAxis) > 0) {
    PP_ASSIGN_OR_RETURN(grid.data_parallel_id_, topology.GetAxisValue(world.rank, kDataAxis));
  }
  if (topology.GetDim(kModelAxis) > 0) {
    PP_ASSIGN_OR_RETURN(grid.model_parallel_id_, topology.GetAxisValue(world.rank, kModelAxis));
  }
  // For the launcher's verdict, should this worker die or stop from here on.
  ReportWorkerPlace(grid.stage_id_, grid.data_parallel_id_);
  grid.pipe_ranks_ = OwnList(topology, kPipeAxis, world.rank);
  grid.data_ranks_ = OwnList(topology, kDataAxis, world.rank);
  grid.model_ranks_ = OwnList(topology, kModelAxis, world.rank);
  if (topology.GetDim(kDataAxis) > 0) {
    PP_ASSIGN_OR_RETURN(grid.model_parallel_ranks_,
                        topology.FilterMatch({{kDataAxis, grid.data_parallel_id_}}));
  } else {
    PP_ASSIGN_OR_RETURN(grid.model_parallel_ranks_, topology.FilterMatch({}));
  }
  grid.topology_ = std::move(topology);

  // Every rank builds its groups in the same order (pipe, data, model, model
  // parallel), and groups of one kind are disjoint, so no rank can wait on a
  // peer that is waiting on another group. A group spanning the whole world
  // is the world group itself.
  auto make = [&](const char* kind,
                  const std::vector<int>& ranks) -> absl::StatusOr<ProcessGroupPtr> {
    if (static_cast<int>(ranks.size()) == grid.world_size()) return grid.world_group_;
    const int group_rank =
        static_cast<int>(std::find(ranks.begin(), ranks.end(), grid.rank_) - ranks.begin());
    // The smallest member names a group uniquely among groups of its kind.
    return NewGlooGroup(grid.store_, absl::StrCat("pp/grid/", kind, "/", ranks.front()), group_rank,
                        static_cast<int>(ranks.size()), grid.group_options_);
  };
  PP_ASSIGN_OR_RETURN(grid.pipe_group_, make("pipe", grid.pipe_ranks_));
  PP_ASSIGN_OR_RETURN(grid.data_group_, make("data", grid.data_ranks_));
  PP_ASSIGN_OR_RETURN(grid.model_group_, make("model", grid.model_ranks_));
  PP_ASSIGN_OR_RETURN(grid.model_parallel_group_,
                      make("model_parallel", grid.model_parallel_ranks_));

  PP_ASSIGN_OR_RETURN(grid.prev_stage_rank_,
                      grid.StageToGlobal((grid.stage_id_ + grid.num_stages_ - 1) % grid.num_stages_,
                                         grid.data_parallel_id_));
  PP_ASSIGN_OR_RETURN(
      grid.next_stage_rank_,
      grid.StageToGlobal((grid.stage_id_ + 1) % grid.num_stages_, grid.data_parallel_id_));
  return grid;
}

std::string ParallelGrid::DescribeGroup(const std::string& name,
                                        const std::vector<int>& ranks) const {
  return ::pp::DescribeGroup(name, ranks, rank_);
}

std::string ParallelGrid::DescribeWorldGroup() const {
  std::vector<int> all(world_size());
  for (int r = 0; r < world_size(); ++r) all[r] = r;
  return DescribeGroup("world group", all);
}

absl::StatusOr<int> ParallelGrid::StageToGlobal(int stage, int data) const {
  if (stage < 0 || stage >= num_stages_) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", stage, " is out of range [0, ", num_stages_, ")"));
  }
  if (data < 0 || data >= data_parallel_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("data-parallel id ", data, " is out of range [0, ", data_parallel_size_, ")"));
  }
  // This rank's coordinate with the pipe and data values replaced.
  PP_ASSIGN_OR_RETURN(std::vector<int> coord, topology_.GetCoord(rank_));
  coord[topology_.AxisIndex(kPipeAxis)] = stage;
  const int data_axis = topology_.AxisIndex(kDataAxis);
  if (data_axis >= 0) coord[data_axis] = data;
  return topology_.GetRankOfCoord(coord);
}

absl::StatusOr<ProcessGroupPtr> ParallelGrid::NewGroup(const std::vector<int>& ranks,
                                                       const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("NewGroup needs a non-empty name");
  if (group_names_.count(name) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a group named '", name, "' was already made on this grid; names must be unique"));
  }
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group '", name, "' lists a rank twice: ", RankList(ranks)));
  }
  if (sorted.empty() || sorted.front() < 0 || sorted.back() >= world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("group '", name, "' ranks ", RankList(ranks),
                                                   " must be non-empty and within [0, ",
                                                   world_size(), ")"));
  }
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, " called NewGroup('", name,
                                                   "') but is not a member of ", RankList(ranks)));
  }
  group_names_.insert(name);
  return NewGlooGroup(store_, absl::StrCat("pp/group/", name), static_cast<int>(me - ranks.begin()),
                      static_cast<int>(ranks.size()), group_options_);
}

std::string ParallelGrid::DebugString() const {
  return absl::StrCat("rank ", rank_, " ", topology_.ToString(), " | stage ", stage_id_, "/",
                      num_stages_, " dp ", data_parallel_id_, "/", data_parallel_size_, " mp ",
                      model_parallel_id_, "/", model_parallel_size_, " | pipe ",
                      RankList(pipe_ranks_), " data ", RankList(data_ranks_), " model ",
                      RankList(model_ranks_));
}

}  // namespace pp
