#include "topology/process_topology.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace pp {

absl::StatusOr<ProcessTopology> ProcessTopology::Create(std::vector<std::string> axes,
                                                        std::vector<int> dims) {
  if (axes.size() != dims.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology needs one dim per axis; got ", axes.size(), " axes [", absl::StrJoin(axes, ","),
        "] and ", dims.size(), " dims [", absl::StrJoin(dims, ","), "]"));
  }
  int64_t product = 1;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topology axis ", i, " has an empty name; axes are [", absl::StrJoin(axes, ","), "]"));
    }
    if (std::find(axes.begin(), axes.begin() + i, axes[i]) != axes.begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate topology axis '", axes[i], "' in [",
                                                     absl::StrJoin(axes, ","),
                                                     "]; each axis may appear once"));
    }
    if (dims[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("topology dim of axis '", axes[i], "' is ", dims[i], "; dims must be >= 1"));
    }
    product *= dims[i];
    if (product > (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("topology [", absl::StrJoin(dims, ","), "] has too many ranks"));
    }
  }
  return ProcessTopology(std::move(axes), std::move(dims));
}

ProcessTopology::ProcessTopology(std::vector<std::string> axes, std::vector<int> dims)
    : axes_(std::move(axes)), dims_(std::move(dims)), strides_(dims_.size(), 1) {
  // Row-major, last axis fastest.
  int stride = 1;
  for (int i = static_cast<int>(dims_.size()) - 1; i >= 0; --i) {
    strides_[i] = stride;
    stride *= dims_[i];
  }
  world_size_ = stride;
}

int ProcessTopology::AxisIndex(const std::string& axis) const {
  auto it = std::find(axes_.begin(), axes_.end(), axis);
  return it == axes_.end() ? -1 : static_cast<int>(it - axes_.begin());
}

int ProcessTopology::GetDim(const std::string& axis) const {
  const int i = AxisIndex(axis);
  return i < 0 ? 0 : dims_[i];
}

namespace {

absl::Status UnknownAxis(const std::string& axis, const std::vector<std::string>& axes) {
  return absl::InvalidArgumentError(absl::StrCat("unknown topology axis '", axis, "'; axes are [",
                                                 absl::StrJoin(axes, ","), "]"));
}

absl::Status CheckValue(const std::string& axis, int value, int dim) {
  if (value < 0 || value >= dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinate ", axis, "=", value, " is out of range [0, ", dim, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> ProcessTopology::GetRankOfCoord(const std::vector<int>& coord) const {
  if (coord.size() != axes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinate [", absl::StrJoin(coord, ","), "] has ", coord.size(),
        " values; the topology has ", axes_.size(), " axes [", absl::StrJoin(axes_, ","), "]"));
  }
  int rank = 0;
  for (size_t i = 0; i < coord.size(); ++i) {
    absl::Status s = CheckValue(axes_[i], coord[i], dims_[i]);
    if (!s.ok()) return s;
    rank += coord[i] * strides_[i];
  }
  return rank;
}

absl::StatusOr<int> ProcessTopology::GetRank(const AxisValues& coord) const {
  for (const auto& [axis, value] : coord) {
    if (AxisIndex(axis) < 0) return UnknownAxis(axis, axes_);
  }
  std::vector<int> values(axes_.size());
  for (size_t i = 0; i < axes_.size(); ++i) {
    auto it = coord.find(axes_[i]);
    if (it == coord.end()) {
      return absl::InvalidArgumentError(absl::StrCat("coordinate is missing axis '", axes_[i],
                                                     "'; give every axis of [",
                                                     absl::StrJoin(axes_, ","), "]"));
    }
    values[i] = it->second;
  }
  return GetRankOfCoord(values);
}

absl::StatusOr<std::vector<int>> ProcessTopology::GetCoord(int rank) const {
  if (rank < 0 || rank >= world_size_) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is out of range [0, ",
                                                   world_size_, ") of topology ", ToString()));
  }
  std::vector<int> coord(axes_.size());
  for (size_t i = 0; i < axes_.size(); ++i) coord[i] = (rank / strides_[i]) % dims_[i];
  return coord;
}

absl::StatusOr<int> ProcessTopology::GetAxisValue(int rank, const std::string& axis) const {
  const int i = AxisIndex(axis);
  if (i < 0) return UnknownAxis(axis, axes_);
  auto coord = GetCoord(rank);
  if (!coord.ok()) return coord.status();
  return (*coord)[i];
}

std::vector<std::vector<int>> ProcessTopology::AxisCommLists(const std::string& axis) const {
  const int a = AxisIndex(axis);
  if (a < 0) return {};
  // Every rank whose coordinate on `axis` is 0 starts one list; the list walks
  // the axis by its stride. Starting ranks come in ascending order.
  std::vector<std::vector<int>> lists;
  lists.reserve(world_size_ / dims_[a]);
  for (int rank = 0; rank < world_size_; ++rank) {
    if ((rank / strides_[a]) % dims_[a] != 0) continue;
    std::vector<int> list(dims_[a]);
    for (int k = 0; k < dims_[a]; ++k) list[k] = rank + k * strides_[a];
    lists.push_back(std::move(list));
  }
  return lists;
}

absl::StatusOr<std::vector<int>> ProcessTopology::FilterMatch(const AxisValues& values) const {
  std::vector<std::pair<int, int>> wanted;  // (axis index, value)
  for (const auto& [axis, value] : values) {
    const int i = AxisIndex(axis);
    if (i < 0) return UnknownAxis(axis, axes_);
    absl::Status s = CheckValue(axis, value, dims_[i]);
    if (!s.ok()) return s;
    wanted.emplace_back(i, value);
  }
  std::vector<int> ranks;
  for (int rank = 0; rank < world_size_; ++rank) {
    bool match = true;
    for (const auto& [i, value] : wanted) {
      if ((rank / strides_[i]) % dims_[i] != value) {
        match = false;
        break;
      }
    }
    if (match) ranks.push_back(rank);
  }
  return ranks;
}

absl::StatusOr<std::string> ProcessTopology::RankRepr(int rank,
                                                      const std::vector<std::string>& omit_axes,
                                                      const std::string& inner_sep,
                                                      const std::string& outer_sep) const {
  if (rank < 0 || rank >= world_size_) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is out of range [0, ",
                                                   world_size_, ") of topology ", ToString()));
  }
  std::vector<std::string> parts;
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (std::find(omit_axes.begin(), omit_axes.end(), axes_[i]) != omit_axes.end()) continue;
    parts.push_back(
        absl::StrFormat("%s%s%02d", axes_[i], inner_sep, (rank / strides_[i]) % dims_[i]));
  }
  return absl::StrJoin(parts, outer_sep);
}

std::string ProcessTopology::ToString() const {
  if (axes_.empty()) return "(single rank)";
  std::vector<std::string> parts;
  for (size_t i = 0; i < axes_.size(); ++i) parts.push_back(absl::StrCat(axes_[i], "=", dims_[i]));
  return absl::StrJoin(parts, " x ");
}

absl::StatusOr<ProcessTopology> PipeDataParallelTopology(int pp, int dp) {
  return ProcessTopology::Create({kPipeAxis, kDataAxis}, {pp, dp});
}

absl::StatusOr<ProcessTopology> PipeModelDataParallelTopology(int pp, int mp, int dp) {
  return ProcessTopology::Create({kPipeAxis, kDataAxis, kModelAxis}, {pp, dp, mp});
}

}  // namespace pp
