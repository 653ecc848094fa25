// The peer GPT (../shared/peers/README.md: byte vocabulary 256, width 256, 8
// blocks, 4 heads, context 128, micro-batches of 4 sequences), the one pipe's
// benches train to compare with DeepSpeed and PyTorch: its config and its
// synthetic data in one place, for bench_gpt_kernels, bench_gpt_pp1 and
// gpu_pp1. The size flags (--width, --layers, --heads, --context,
// --micro_batch_size) are defined here, the peer GPT's by default. The same
// model in PyTorch is bench/peer_gpt.py; in pipe's config language
// bench/bench_common.py's PEER_GPT.
#ifndef BENCH_PEER_GPT_H_
#define BENCH_PEER_GPT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "models/data/synthetic_lm_data.h"
#include "models/gpt/gpt.h"
#include "pipeline/layers/layer_spec.h"
#include "pipeline/pipeline_model.h"
#include "topology/device.h"
#include "topology/parallel_grid.h"
#include "topology/rendezvous.h"

ABSL_DECLARE_FLAG(int, width);
ABSL_DECLARE_FLAG(int, layers);
ABSL_DECLARE_FLAG(int, heads);
ABSL_DECLARE_FLAG(int, context);
ABSL_DECLARE_FLAG(int, micro_batch_size);

namespace pp {

// The seed of the peer GPT's weights (BuildSequential, PipelineModelOptions'
// base_seed) and of its synthetic data in every bench.
inline constexpr uint64_t kPeerGptSeed = 1234;

// The GPT of the size flags: vocabulary 256 (bytes), MLP 4x, no dropout.
GptModelConfig PeerGptModelConfig();

// Its synthetic data: sequences of --context tokens, --micro_batch_size of
// them per micro-batch, `num_microbatches` per step, seed kPeerGptSeed.
SyntheticLmOptions PeerGptData(int num_microbatches);

// pipe's engine at pp = 1 for the peer GPT, less its Trainer: a one-rank
// world (file store at `store_path`, computing on `device`), its grid, and
// the model of `specs` as one stage (partition "uniform", seed kPeerGptSeed)
// on the CPU. Members are destroyed model first, world last.
struct PeerGptEngine {
  World world;
  ParallelGrid grid;
  std::unique_ptr<PipelineModel> model;
};
absl::StatusOr<PeerGptEngine> MakePeerGptEngine(const std::vector<LayerSpec>& specs,
                                                const std::string& store_path, DeviceKind device);

}  // namespace pp

#endif  // BENCH_PEER_GPT_H_
