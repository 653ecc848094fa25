#include "bench/peer_gpt.h"

#include "absl/flags/flag.h"

ABSL_FLAG(int, width, 256, "GPT width.");
ABSL_FLAG(int, layers, 8, "Transformer blocks.");
ABSL_FLAG(int, heads, 4, "Attention heads.");
ABSL_FLAG(int, context, 128, "Sequence length.");
ABSL_FLAG(int, micro_batch_size, 4, "Sequences per micro-batch.");

namespace pp {

GptConfig PeerGptConfig() {
  GptConfig config;
  config.vocab_size = 256;
  config.width = absl::GetFlag(FLAGS_width);
  config.num_layers = absl::GetFlag(FLAGS_layers);
  config.num_heads = absl::GetFlag(FLAGS_heads);
  config.context_length = absl::GetFlag(FLAGS_context);
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

}  // namespace pp
