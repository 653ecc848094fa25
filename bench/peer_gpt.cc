#include "bench/peer_gpt.h"

#include <utility>

#include "absl/flags/flag.h"
#include "common/status_macros.h"
#include "topology/process_topology.h"

ABSL_FLAG(int, width, 256, "GPT width.");
ABSL_FLAG(int, layers, 8, "Transformer blocks.");
ABSL_FLAG(int, heads, 4, "Attention heads.");
ABSL_FLAG(int, context, 128, "Sequence length.");
ABSL_FLAG(int, micro_batch_size, 4, "Sequences per micro-batch.");

namespace pp {

GptModelConfig PeerGptModelConfig() {
  GptModelConfig config;
  config.set_vocab_size(256);
  config.set_width(absl::GetFlag(FLAGS_width));
  config.set_num_layers(absl::GetFlag(FLAGS_layers));
  config.set_num_heads(absl::GetFlag(FLAGS_heads));
  config.set_context_length(absl::GetFlag(FLAGS_context));
  return config;
}

SyntheticLmOptions PeerGptData(int num_microbatches) {
  SyntheticLmOptions data;
  data.lm.seq_len = absl::GetFlag(FLAGS_context);
  data.lm.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  data.lm.num_microbatches = num_microbatches;
  data.lm.seed = kPeerGptSeed;
  return data;
}

absl::StatusOr<PeerGptEngine> MakePeerGptEngine(const std::vector<LayerSpec>& specs,
                                                const std::string& store_path, DeviceKind device) {
  DistEnv env;
  env.rank = 0;
  env.world_size = 1;
  RendezvousOptions ro;
  ro.file_store_path = store_path;
  ro.device = device;
  PP_ASSIGN_OR_RETURN(World world, Rendezvous(env, ro));
  PP_ASSIGN_OR_RETURN(ProcessTopology topo, PipeDataParallelTopology(1, 1));
  PP_ASSIGN_OR_RETURN(ParallelGrid grid, ParallelGrid::Create(world, topo));
  PipelineModelOptions mo;
  mo.num_stages = 1;
  mo.partition_method = "uniform";
  mo.base_seed = kPeerGptSeed;
  PP_ASSIGN_OR_RETURN(std::unique_ptr<PipelineModel> model,
                      PipelineModel::Create(specs, mo, grid.stage_id()));
  return PeerGptEngine{std::move(world), std::move(grid), std::move(model)};
}

}  // namespace pp
