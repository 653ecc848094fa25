#include "pipeline/runtime/model_parallel_group.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "pipeline/tensor_parallel/sequence_parallel_grads.h"

namespace pp {

ModelParallelGroup ModelParallelGroupOf(const ParallelGrid& grid, std::chrono::milliseconds timeout,
                                        bool sequence_parallel) {
  ModelParallelGroup group;
  if (grid.model_parallel_size() <= 1) return group;
  group.rank = grid.model_parallel_id();
  group.size = grid.model_parallel_size();
  group.group = grid.model_group();
  group.timeout = timeout;
  group.description = grid.DescribeGroup("model group", grid.model_group_ranks());
  group.sequence_parallel = sequence_parallel;
  // Armed by a Trainer over a model built with this group.
  if (sequence_parallel) {
    group.sequence_parallel_grads = std::make_shared<tensor_parallel::SequenceParallelGrads>();
  }
  return group;
}

ModelParallelGroup PipeGroupOf(const ParallelGrid& grid, std::chrono::milliseconds timeout) {
  ModelParallelGroup group;
  if (grid.num_stages() <= 1) return group;
  group.rank = grid.stage_id();
  group.size = grid.num_stages();
  group.group = grid.pipe_group();
  group.timeout = timeout;
  group.description = grid.DescribeGroup("pipe group", grid.pipe_group_ranks());
  return group;
}

ModelParallelGroup VocabularyGroupOf(const ParallelGrid& grid, std::chrono::milliseconds timeout,
                                     bool sequence_parallel) {
  if (grid.model_parallel_size() <= 1) return PipeGroupOf(grid, timeout);
  ModelParallelGroup group;
  // The c10d group's rank: this rank's place among the members (ascending
  // global ranks; pipe-major, as the grid's axes are pipe, data, model).
  const std::vector<int>& ranks = grid.model_parallel_group_ranks();
  group.rank = std::find(ranks.begin(), ranks.end(), grid.global_rank()) - ranks.begin();
  group.size = static_cast<int64_t>(grid.num_stages()) * grid.model_parallel_size();
  group.group = grid.model_parallel_group();
  group.timeout = timeout;
  group.description =
      grid.DescribeGroup("model-parallel group (pipe x model)", grid.model_parallel_group_ranks());
  group.sequence_parallel = sequence_parallel;
  return group;
}

}  // namespace pp
