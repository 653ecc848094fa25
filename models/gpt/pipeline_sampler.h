// Sampling from a GPT that is trained as a pipeline: each generated token is
// one forward-only pass of the pipeline (the Trainer's evaluation schedule)
// over the current window; the last stage's logits are broadcast over the
// pipe group, so every rank draws the same token.
//
//   PipelineSampler sampler;
//   auto trainer = Trainer::Create(&grid, model, sampler.WrapLoss(GptLoss), &source, options);
//   ... train ...
//   auto tokens = Generate(prompt, context, sample_options,
//                          sampler.LogitsFn(trainer.get(), &grid, vocab, timeout));
#ifndef MODELS_GPT_PIPELINE_SAMPLER_H_
#define MODELS_GPT_PIPELINE_SAMPLER_H_

#include <chrono>
#include <cstdint>

#include <torch/torch.h>

#include "models/gpt/sample.h"
#include "pipeline/runtime/micro_batch_source.h"
#include "pipeline/runtime/trainer.h"
#include "topology/parallel_grid.h"

namespace pp {

// Owns the captured logits and the one-window data source. Must outlive the
// trainer and the functions it returns. Not thread-safe (one per rank).
class PipelineSampler {
 public:
  // The loss to train with: `loss` itself, which also keeps the logits of
  // passes run without gradients (evaluation, sampling).
  LossFn WrapLoss(LossFn loss);

  // Logits of `position` in `window`, on every rank of the pipe group.
  // Collective over the pipeline: every rank calls it with the same window.
  // The window runs padded at its end to a multiple of `sequence_multiple`
  // (sequence parallelism); a causal model's logits before the padding are
  // those of the window alone.
  NextTokenLogitsFn LogitsFn(Trainer* trainer, ParallelGrid* grid, int64_t vocab_size,
                             std::chrono::milliseconds timeout, int64_t sequence_multiple = 1);

 private:
  // Serves the current window for every micro-batch index, with dummy labels.
  class WindowSource : public MicroBatchSource {
   public:
    absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) override;
    torch::Tensor window;
  };

  torch::Tensor captured_;
  WindowSource source_;
  int64_t calls_ = 0;
};

}  // namespace pp

#endif  // MODELS_GPT_PIPELINE_SAMPLER_H_
