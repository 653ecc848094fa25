// Partitioners: split a layer list into contiguous parts, looked up by name.
//
// A method string is `name` or `name:argument` ("uniform", "parameters",
// "type:TransformerBlock", "profile", "explicit:0,3,7,12"). Each partitioner is
// one .cc ending in PP_REGISTER_PARTITIONER in an alwayslink target; link
// //pipeline/partition:all for the built-in ones. The result is `bounds`:
// part s owns layers [bounds[s], bounds[s+1]); every part owns at least one.
//
// With interleaving (chunks = v) a model is split into num_stages * v parts and
// stage s owns parts s, s + p, s + 2p, ...: chunk c of stage s is virtual
// stage c * p + s (VirtualStage below).
//
// Next: pipeline/partition/balance.h (the min-max optimal balancer).
#ifndef PIPELINE_PARTITION_PARTITIONER_H_
#define PIPELINE_PARTITION_PARTITIONER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeline/layers/layer.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/partition/balance.h"

namespace pp {

// Everything a partitioner may look at. Not owning: `specs` must outlive the call.
struct PartitionRequest {
  const std::vector<LayerSpec>* specs = nullptr;
  int64_t num_parts = 1;
  // The text after the first ':' of the method string ("" if none).
  std::string argument;
  // Layers built for counting or profiling are seeded like the real ones.
  uint64_t base_seed = 0;
  // `profile` only: the first layer's inputs and the micro-batch side inputs,
  // and how many timed runs per layer (the median is used; one warm-up first).
  Activations sample_inputs;
  MicroBatch sample_batch;
  int profile_repeats = 5;
  // `profile:cap_mib=N` only: micro-batches in flight on each part under the
  // schedule (e.g. 1F1B's p - s), when the argument gives no in_flight=.
  std::vector<double> part_in_flight;
  // Check the request only: a measuring partitioner (`profile`) checks its
  // argument and returns some valid bounds without building or timing a
  // layer (a launcher refuses 'profile:garbage' before any worker starts).
  bool check_only = false;
};

// A partitioner: pure apart from `profile`'s timing. Must return valid bounds
// or an error naming the bad input; the registry validates the result again.
using PartitionFn = std::function<absl::StatusOr<Bounds>(const PartitionRequest&)>;

// Registers `name` (no ':'). AlreadyExists for a duplicate name.
absl::Status RegisterPartitioner(const std::string& name, const std::string& help, PartitionFn fn);

// Registered names in sorted order, and "name: help" lines for --help.
std::vector<std::string> RegisteredPartitioners();
std::string PartitionerHelp();

// Runs the partitioner named by `method` ("type:Block" -> "type" with argument
// "Block"; request.argument is overwritten). InvalidArgument for an unknown
// name (listing the registered ones), fewer layers than parts, num_parts < 1.
absl::StatusOr<Bounds> Partition(const std::string& method, PartitionRequest request);

// Chunk c of stage s is virtual stage c * num_stages + s.
inline int64_t VirtualStage(int64_t stage, int64_t chunk, int64_t num_stages) {
  return chunk * num_stages + stage;
}

// "stage=0 chunk=0 (part 0) layers=[0, 3) params=1234" plus one line per
// layer ("    0: Embedding"), like DeepSpeed's partition printout.
// `param_counts` may be empty (then no counts are printed) or one per layer.
// `placement` (part -> stage) empty: looped (part c * num_stages + s on s);
// else chunk c of a stage is its c-th part in ascending order (V placement).
std::string PartitionReport(const std::vector<LayerSpec>& specs, const Bounds& bounds,
                            int64_t num_stages, const std::vector<int64_t>& param_counts = {},
                            const std::vector<int>& placement = {});

namespace internal_partition {
// For PP_REGISTER_PARTITIONER: registers or aborts the program with the reason.
bool RegisterOrDie(const char* name, const char* help, PartitionFn fn);
}  // namespace internal_partition

#define PP_PARTITIONER_CONCAT_INNER_(a, b) a##b
#define PP_PARTITIONER_CONCAT_(a, b) PP_PARTITIONER_CONCAT_INNER_(a, b)

// PP_REGISTER_PARTITIONER("uniform", "equal layer counts", &PartitionUniform);
#define PP_REGISTER_PARTITIONER(name, help, fn)                                  \
  static const bool PP_PARTITIONER_CONCAT_(pp_partitioner_registered_, __LINE__) \
      [[maybe_unused]] = ::pp::internal_partition::RegisterOrDie(name, help, fn)

}  // namespace pp

#endif  // PIPELINE_PARTITION_PARTITIONER_H_
