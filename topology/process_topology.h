// ProcessTopology: where each rank sits in the pipe x data x model grid.
//
// Ranks are laid out row-major with the last axis fastest (DeepSpeed's
// ProcessTopology semantics), so rank <-> coordinate and the per-axis
// communicator lists are pure functions of (axes, dims), testable without any
// process. ParallelGrid (topology/parallel_grid.h) turns them into c10d groups.
//
//   PP_ASSIGN_OR_RETURN(ProcessTopology topo, PipeModelDataParallelTopology(2, 1, 2));
//   topo.AxisCommLists("data");            // [[0,1],[2,3]]: ranks differing only in data
//   PP_ASSIGN_OR_RETURN(int r, topo.GetRank({{"pipe", 1}, {"data", 0}, {"model", 0}}));
//
// Next: topology/parallel_grid.h.
#ifndef TOPOLOGY_PROCESS_TOPOLOGY_H_
#define TOPOLOGY_PROCESS_TOPOLOGY_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pp {

// Axis names used across pipe. "model" is the tensor-parallel slot.
inline constexpr char kPipeAxis[] = "pipe";
inline constexpr char kDataAxis[] = "data";
inline constexpr char kModelAxis[] = "model";

// A coordinate (or a partial one, for FilterMatch) by axis name:
// {{"pipe", 1}, {"data", 0}}.
using AxisValues = std::map<std::string, int>;

// An immutable value type; copyable and thread-safe to read.
class ProcessTopology {
 public:
  // No axes: a single rank (world_size() == 1).
  ProcessTopology() = default;

  // `axes` are distinct non-empty names, `dims[i]` >= 1 is the size of axes[i].
  // Errors (InvalidArgument) name the offending axis or dim.
  static absl::StatusOr<ProcessTopology> Create(std::vector<std::string> axes,
                                                std::vector<int> dims);

  const std::vector<std::string>& axes() const { return axes_; }
  const std::vector<int>& dims() const { return dims_; }
  // Product of the dims.
  int world_size() const { return world_size_; }

  // Size of `axis`; 0 for an axis this topology does not have.
  int GetDim(const std::string& axis) const;
  // Index of `axis` in axes(), or -1.
  int AxisIndex(const std::string& axis) const;

  // Rank of a full coordinate: every axis must be given exactly once, with a
  // value in [0, dim). InvalidArgument names a missing/unknown axis or a value
  // out of range.
  absl::StatusOr<int> GetRank(const AxisValues& coord) const;
  // Same, with the values in axes() order.
  absl::StatusOr<int> GetRankOfCoord(const std::vector<int>& coord) const;

  // Coordinate of `rank` in axes() order. InvalidArgument unless
  // 0 <= rank < world_size().
  absl::StatusOr<std::vector<int>> GetCoord(int rank) const;
  // Coordinate of `rank` on one axis. InvalidArgument for a bad rank or axis.
  absl::StatusOr<int> GetAxisValue(int rank, const std::string& axis) const;

  // The groups of ranks that differ only in `axis`, each sorted ascending (so a
  // rank's index in its list equals its coordinate on `axis`), lists ordered by
  // their smallest rank. Empty for an unknown axis.
  std::vector<std::vector<int>> AxisCommLists(const std::string& axis) const;

  // Ranks (ascending) whose coordinate matches every given axis value; axes not
  // named are free. InvalidArgument for an unknown axis or out-of-range value.
  absl::StatusOr<std::vector<int>> FilterMatch(const AxisValues& values) const;

  // "axis_%02d" for every axis not in `omit_axes`, joined by `outer_sep`
  // (DeepSpeed's get_rank_repr): "model_00" in a pipe/data/model topology, ""
  // in a pipe/data one. Used to name per-rank files (checkpoints).
  // InvalidArgument unless 0 <= rank < world_size().
  absl::StatusOr<std::string> RankRepr(
      int rank, const std::vector<std::string>& omit_axes = {kDataAxis, kPipeAxis},
      const std::string& inner_sep = "_", const std::string& outer_sep = "-") const;

  // "pipe=2 x data=2 x model=1".
  std::string ToString() const;

  bool operator==(const ProcessTopology& other) const {
    return axes_ == other.axes_ && dims_ == other.dims_;
  }
  bool operator!=(const ProcessTopology& other) const { return !(*this == other); }

 private:
  ProcessTopology(std::vector<std::string> axes, std::vector<int> dims);

  std::vector<std::string> axes_;
  std::vector<int> dims_;
  std::vector<int> strides_;  // strides_[i]: rank distance between neighbours on axes_[i]
  int world_size_ = 1;
};

// Axes (pipe, data), dims (pp, dp).
absl::StatusOr<ProcessTopology> PipeDataParallelTopology(int pp, int dp);
// Axes (pipe, data, model), dims (pp, dp, mp): model is fastest, so
// tensor-parallel peers are neighbouring ranks (as in DeepSpeed).
absl::StatusOr<ProcessTopology> PipeModelDataParallelTopology(int pp, int mp, int dp);

}  // namespace pp

#endif  // TOPOLOGY_PROCESS_TOPOLOGY_H_
