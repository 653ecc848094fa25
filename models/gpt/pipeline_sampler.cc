#include "models/gpt/pipeline_sampler.h"

#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "common/torch_status.h"
#include "pipeline/runtime/model_parallel_group.h"
#include "pipeline/runtime/vocab_layers.h"
#include "pipeline/tensor_parallel/mappings.h"
#include "topology/wait_work.h"

namespace pp {

LossFn PipelineSampler::WrapLoss(LossFn loss) {
  return [this, loss = std::move(loss)](const Activations& outputs, const MicroBatch& batch) {
    if (!torch::GradMode::is_enabled()) captured_ = outputs.at(0).detach();
    return loss(outputs, batch);
  };
}

absl::StatusOr<MicroBatchData> PipelineSampler::WindowSource::Get(int64_t step, int64_t index) {
  MicroBatchData data;
  // Unique per (call, index) and far above training ids.
  data.batch.id = (int64_t{1} << 40) + step * 4096 + index;
  data.batch.tensors["input_ids"] = window;
  data.batch.tensors["labels"] = torch::zeros_like(window);
  data.inputs = {window};
  return data;
}

NextTokenLogitsFn PipelineSampler::LogitsFn(Trainer* trainer, ParallelGrid* grid,
                                            int64_t vocab_size, std::chrono::milliseconds timeout,
                                            int64_t sequence_multiple) {
  return [=, this](const torch::Tensor& window, int64_t position) -> absl::StatusOr<torch::Tensor> {
    const int64_t length = window.size(-1);
    const int64_t padded = (length + sequence_multiple - 1) / sequence_multiple * sequence_multiple;
    source_.window = padded == length
                         ? window
                         : torch::constant_pad_nd(window, {0, padded - length}, /*value=*/0);
    PP_RETURN_IF_ERROR(trainer->Evaluate(&source_, calls_++).status());
    // Vocabulary parallelism: every rank holds the head's input (its OUT_S
    // read it) and its rows of the head; the logits are gathered on all.
    if (const VocabularyLayers* vocabulary = trainer->vocabulary()) {
      const torch::Tensor& hidden = vocabulary->last_hidden();
      if (!hidden.defined() || hidden.dim() != 3 || position >= hidden.size(1)) {
        return absl::InternalError("the vocabulary passes left no head input for sampling");
      }
      PP_ASSIGN_OR_RETURN(torch::Tensor logits, vocabulary->GatherLogits(hidden[0][position]));
      return logits.slice(0, 0, vocab_size).to(torch::kCPU).contiguous();
    }
    torch::Tensor logits = torch::zeros({vocab_size});
    // The rank holding the last virtual stage: the last rank when looped,
    // rank 0 under V placement (zbv).
    const int last_rank = trainer->eval_program().stage_to_rank.back();
    if (grid->stage_id() == last_rank) {
      if (!captured_.defined() || captured_.dim() != 3 || position >= captured_.size(1)) {
        return absl::InternalError(
            "the last stage captured no logits for sampling (was the loss wrapped?)");
      }
      // On the CPU like the other ranks' zeros: one backend (Gloo) for the
      // broadcast even when the last stage computes on a GPU.
      torch::Tensor local = captured_[0][position];
      // Tensor parallelism: each rank of the model group holds its slice of
      // the (padded) vocabulary; gathered on the group's device, then cut
      // to the real vocabulary.
      if (grid->model_parallel_size() > 1) {
        const ModelParallelGroup group = ModelParallelGroupOf(*grid, timeout);
        torch::NoGradGuard no_grad;
        PP_RETURN_IF_ERROR(TorchCall("gathering the sampling logits over the model group", [&] {
          local =
              tensor_parallel::AllGather(local.contiguous(), group, /*dim=*/0, "sampling logits")
                  .slice(0, 0, vocab_size);
        }));
      }
      logits = local.to(torch::kCPU, torch::kFloat).contiguous();
    }
    if (grid->num_stages() > 1) {
      std::vector<at::Tensor> tensors = {logits};
      c10d::BroadcastOptions options;
      options.rootRank = last_rank;  // pipe group rank == stage
      PP_RETURN_IF_ERROR(
          RunCollective("broadcast of sampling logits",
                        grid->DescribeGroup("pipe group", grid->pipe_group_ranks()), timeout,
                        [&] { return grid->pipe_group()->broadcast(tensors, options); }));
    }
    return logits;
  };
}

}  // namespace pp
