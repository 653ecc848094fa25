// grid_demo: launches pp*dp*mp ranks on this machine, builds the ParallelGrid,
// runs an all-reduce of the rank ids on every axis group and a ring p2p along
// the pipeline, and prints one table (rank 0) checking every result.
//
//   ./bazelw run //experiments:grid_demo -- --nproc_per_node=4 --pp=2 --dp=2
#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/torch_status.h"
#include "topology/launcher.h"
#include "topology/parallel_grid.h"
#include "topology/process_topology.h"
#include "topology/rendezvous.h"

ABSL_FLAG(int, pp, 2, "Pipeline stages.");
ABSL_FLAG(int, dp, 1, "Data-parallel replicas.");
ABSL_FLAG(int, mp, 1, "Model-parallel (tensor) slots.");
ABSL_FLAG(int, timeout_s, 60, "Rendezvous and collective timeout, seconds.");

namespace pp {
namespace {

absl::StatusOr<int64_t> AllReduceSum(const ProcessGroupPtr& group, int64_t value) {
  std::vector<at::Tensor> t = {at::full({1}, value, at::kLong)};
  PP_RETURN_IF_ERROR(TorchCall("all-reduce", [&] { group->allreduce(t)->wait(); }));
  return t[0].item<int64_t>();
}

// Sends this rank's id to the next stage and returns what the previous stage
// sent (pipe group ranks are stage ids).
absl::StatusOr<int64_t> RingExchange(const ParallelGrid& grid) {
  if (grid.num_stages() == 1) return grid.global_rank();
  std::vector<at::Tensor> out = {at::full({1}, grid.global_rank(), at::kLong)};
  std::vector<at::Tensor> in = {at::zeros({1}, at::kLong)};
  const int next = (grid.stage_id() + 1) % grid.num_stages();
  const int prev = (grid.stage_id() + grid.num_stages() - 1) % grid.num_stages();
  PP_RETURN_IF_ERROR(TorchCall("ring p2p", [&] {
    auto send = grid.pipe_group()->send(out, next, /*tag=*/0);
    grid.pipe_group()->recv(in, prev, /*tag=*/0)->wait();
    send->wait();
  }));
  return in[0].item<int64_t>();
}

std::string Members(const std::vector<int>& ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ","), "]");
}

// One checked result: "6" or "5!=6".
std::string Checked(int64_t got, int64_t want, bool* ok) {
  if (got == want) return absl::StrCat(got);
  *ok = false;
  return absl::StrCat(got, "!=", want);
}

absl::Status Run() {
  const int pp = absl::GetFlag(FLAGS_pp), dp = absl::GetFlag(FLAGS_dp),
            mp = absl::GetFlag(FLAGS_mp);
  PP_ASSIGN_OR_RETURN(ProcessTopology topology, PipeModelDataParallelTopology(pp, mp, dp));
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(absl::GetFlag(FLAGS_timeout_s));
  PP_ASSIGN_OR_RETURN(World world, RendezvousFromEnv(options));
  PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world, topology));

  auto sum = [](const std::vector<int>& r) { return std::accumulate(r.begin(), r.end(), 0); };
  bool ok = true;
  PP_ASSIGN_OR_RETURN(int64_t pipe_sum, AllReduceSum(grid.pipe_group(), grid.global_rank()));
  PP_ASSIGN_OR_RETURN(int64_t data_sum, AllReduceSum(grid.data_group(), grid.global_rank()));
  PP_ASSIGN_OR_RETURN(int64_t model_sum, AllReduceSum(grid.model_group(), grid.global_rank()));
  PP_ASSIGN_OR_RETURN(int64_t world_sum, AllReduceSum(grid.world_group(), grid.global_rank()));
  PP_ASSIGN_OR_RETURN(int64_t from_prev, RingExchange(grid));
  PP_ASSIGN_OR_RETURN(std::vector<int> coord, topology.GetCoord(grid.global_rank()));

  const std::string row = absl::StrFormat(
      "%4d  %-9s %5d %5d  %-10s %-10s %-10s %8s %8s %8s %8s  %s", grid.global_rank(),
      absl::StrCat("(", absl::StrJoin(coord, ","), ")"), grid.stage_id(), grid.data_parallel_id(),
      Members(grid.pipe_group_ranks()), Members(grid.data_group_ranks()),
      Members(grid.model_group_ranks()), Checked(pipe_sum, sum(grid.pipe_group_ranks()), &ok),
      Checked(data_sum, sum(grid.data_group_ranks()), &ok),
      Checked(model_sum, sum(grid.model_group_ranks()), &ok),
      Checked(world_sum, int64_t{grid.world_size()} * (grid.world_size() - 1) / 2, &ok),
      absl::StrCat(grid.PrevStageRank(), "->", grid.global_rank(), " got ",
                   Checked(from_prev, grid.PrevStageRank(), &ok)));
  // Rank 0 gathers the rows through the store and prints the table.
  PP_RETURN_IF_ERROR(TorchCall("publish row", [&] {
    world.store->set(absl::StrCat("grid_demo/row/", grid.global_rank()),
                     std::vector<uint8_t>(row.begin(), row.end()));
  }));
  if (grid.global_rank() == 0) {
    std::printf("topology %s, %d ranks\n", topology.ToString().c_str(), grid.world_size());
    std::printf(
        "(coord is pipe,data,model; each sum is the all-reduce of the members' "
        "rank ids, 'a!=b' marks a wrong one)\n");
    std::printf("%s\n",
                absl::StrFormat("%4s  %-9s %5s %5s  %-10s %-10s %-10s %8s %8s %8s %8s  %s", "rank",
                                "coord", "stage", "dp", "pipe grp", "data grp", "model grp",
                                "pipe sum", "data sum", "mdl sum", "wrld sum", "p2p prev->me")
                    .c_str());
    for (int r = 0; r < grid.world_size(); ++r) {
      std::vector<uint8_t> bytes;
      PP_RETURN_IF_ERROR(TorchCall(
          "read row", [&] { bytes = world.store->get(absl::StrCat("grid_demo/row/", r)); }));
      std::printf("%s\n", std::string(bytes.begin(), bytes.end()).c_str());
    }
    std::fflush(stdout);
  }
  // Nobody leaves (taking rank 0's store with it) before rank 0 has read.
  PP_RETURN_IF_ERROR(TorchCall("barrier", [&] { grid.world_group()->barrier()->wait(); }));
  if (!ok)
    return absl::InternalError(
        absl::StrCat("wrong results on rank ", grid.global_rank(), ": ", row));
  return absl::OkStatus();
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  pp::MaybeLaunch(argc, argv, [] {
    return absl::GetFlag(FLAGS_pp) * absl::GetFlag(FLAGS_dp) * absl::GetFlag(FLAGS_mp);
  });
  absl::Status status = pp::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "grid_demo: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
