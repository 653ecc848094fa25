// StageExecutor: runs one rank's lowered program (pipeline/schedule/ir/lowering.h)
// for one step. It knows no schedule by name: it executes RECV_F, F, SEND_F,
// RECV_B, B, SEND_B in the order given, stashing what backward needs keyed by
// (virtual stage, micro-batch), and hands the step's tail (REDUCE_TIED,
// REDUCE_GRAD, STEP) to a callback (the Trainer).
//
// Data flow of one micro-batch mb through virtual stage s:
//   inputs  = s == 0 ? source.Get(step, mb).inputs : received (RECV_F) or
//             handed over locally by stage s-1 on the same rank
//   F       : outputs = chunk(s).Forward(inputs, batch); stash[(s, mb)]
//             last stage: loss = loss_fn(outputs, batch) / m (scaled once,
//             here only), its detached value accumulated; with per-token
//             loss (kLossMaskKey, micro_batch_source.h) loss_fn's sum times
//             dp / global_loss_tokens instead, which the data-parallel
//             average makes sum / global_loss_tokens
//   B       : autograd from the stashed outputs with the output gradient
//             (RECV_B or local), or from the scaled loss on the last stage;
//             frees the stash entry; the input gradient goes to SEND_B or to
//             stage s-1 locally.
// Every rank that needs a micro-batch reads it itself from the deterministic
// MicroBatchSource; its id travels with the activations, and the last stage
// checks it against the labels it computes the loss with.
//
// Not thread-safe; one executor per rank, used by one thread.
#ifndef PIPELINE_RUNTIME_STAGE_EXECUTOR_H_
#define PIPELINE_RUNTIME_STAGE_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeline/autograd/split_backward.h"
#include "pipeline/layers/layer.h"
#include "pipeline/runtime/action_observer.h"
#include "pipeline/runtime/micro_batch_source.h"
#include "pipeline/runtime/p2p.h"
#include "pipeline/runtime/vocab_layers.h"
#include "pipeline/schedule/ir/action.h"
#include "pipeline/schedule/ir/capabilities.h"
#include "pipeline/schedule/ir/defer_receives.h"
#include "pipeline/schedule/ir/lowering.h"
#include "pipeline/tensor_parallel/mappings.h"

namespace pp {

struct StepStats {
  // Sum of this rank's last-stage micro-batch losses (unscaled, detached);
  // 0 on ranks without the last stage.
  double loss_sum = 0.0;
  int64_t losses_computed = 0;
  // Per-token loss: the step's global_loss_tokens (every rank reads the
  // micro-batches it runs, so every rank knows it); 0: mean of micro-batches.
  int64_t global_loss_tokens = 0;
};

// Testing only: a planted bug of the loss normalisation.
enum class LossNormalizationFault {
  kNone,
  // Each micro-batch's sum divided by its own trained tokens, then averaged
  // over micro-batches and replicas: the mean of micro-batch means that
  // torchtitan (#2972) and DeepSpeed (#7773) users reported.
  kMicroBatchMean,
  // The step's last micro-batch is computed and its loss reported, but its
  // gradient is dropped (the golden-value suite's planted change,
  // experiments/golden/).
  kDroppedMicroBatch,
};

struct StageExecutorOptions {
  P2POptions p2p;
  // Data-parallel replica: micro-batch mb reads global index
  // data_parallel_id * m + mb.
  int data_parallel_id = 0;
  // Replicas in the data group (per-token loss scales by it; set by the Trainer).
  int data_parallel_size = 1;
  LossNormalizationFault loss_normalization_fault = LossNormalizationFault::kNone;
  // Run DeferReceives(program) instead of the program as lowered.
  bool defer_receives = true;
  // Post receives ahead of need (P2P::PostRecvActivations/PostRecvGrads): a
  // channel's first receive of the step is posted when the step starts, and
  // each later one as soon as the previous receive on its channel has been
  // waited for (one posted receive per channel), a gradient receive no
  // earlier than the F whose outputs' layout it needs. Each RECV action then
  // only waits (where it runs: just before the first action that needs its
  // data, with defer_receives). Every posted receive is consumed by the end of
  // the step; a failed step aborts the posted ones. CPU (Gloo) only: on a
  // device posting does nothing (p2p.h).
  bool post_receives_ahead = false;
  // Vocabulary parallelism (set_vocabulary), training steps only: each
  // vocabulary collective (OUT_BCAST, OUT_STATS, OUT_REDUCE, IN_REDUCE,
  // IN_BCAST) only starts, in program order, and the rank moves on; it is
  // waited for (at most the group's timeout) where its result is first read:
  // OUT_BCAST's by OUT_S, OUT_STATS's (the combined statistics, the loss and
  // the gradient scale) by OUT_T or, with one barrier, OUT_REDUCE, OUT_REDUCE's
  // by the last stage's B or I, IN_REDUCE's by stage 0's F, IN_BCAST's by IN_B;
  // a result this rank never reads, and anything still pending, before the
  // step's tail (REDUCE_TIED, REDUCE_GRAD, STEP) and before the step ends. The
  // same Gloo operations on the same tensors as the blocking form, finished
  // in the same order per kind: the same bits. Evaluation stays blocking. A
  // failed step drops what is pending without waiting for it.
  bool vocabulary_async_collectives = false;
};

// What StageExecutor can execute (checked by Validate, and by experiments
// before they launch workers): split backward (I/W) and OVERLAP_F_B included.
// An OVERLAP_F_B runs its forward half, then its backward half, back to back
// on the rank's one thread: correct, but nothing is overlapped (the
// receives either half needs come before the pair, its sends after).
RuntimeCapabilities StageExecutorCapabilities();

// Split backward: I runs BackwardInput (pipeline/autograd/split_backward.h) and
// sends the input gradients at once; W runs the kept WeightGradTask. Between
// them the stash entry keeps the stage inputs and the join nodes of the graph.
//
// Executes lowered programs for the virtual stages of one rank. Borrows the
// modules, the source and the process group; they must outlive it.
class StageExecutor {
 public:
  // `chunks[c]` is virtual stage chunks_stage[c]; `pipe_group` ranks are the
  // pipeline ranks of LoweredProgram::stage_to_rank.
  StageExecutor(
      int rank,
      std::map<int, std::function<Activations(const Activations&, const MicroBatch&)>> stages,
      LossFn loss_fn, MicroBatchSource* source, c10::intrusive_ptr<c10d::ProcessGroup> pipe_group,
      StageExecutorOptions options);

  // Checks that `program` can run on this rank: every action's stage is local
  // and known, the program's stage count matches, and the runtime supports
  // every action (StageExecutorCapabilities). InvalidArgument names the offending action.
  absl::Status Validate(const LoweredProgram& program) const;

  // Runs rank `rank`'s program of `program` for `step`. Tail actions are
  // passed to `tail` in order. With `forward_only` (evaluation), runs under
  // no-grad and keeps nothing for backward. LibTorch errors become Status.
  // On error the executor's per-step state is cleared.
  // `source` overrides the constructor's source for this run (evaluation).
  using TailFn = std::function<absl::Status(const Action&)>;
  absl::StatusOr<StepStats> Run(const LoweredProgram& program, int64_t step, const TailFn& tail,
                                MicroBatchSource* source = nullptr);

  // What Run tells about each step and action (borrowed; null: nothing, and
  // a step reads no clock and waits for no device).
  void set_observer(ActionObserver* observer) { observer_ = observer; }
  ActionObserver* observer() const { return observer_; }
  // Called after every backward compute action (B, I and W; the vocabulary
  // passes' OUT_T and IN_B) of a training program, once its gradients are in
  // the parameters' .grad: the Trainer's bf16 mode moves them into fp32
  // buffers there (mixed_precision.h), so no two micro-batches are summed in
  // bf16. Unset: nothing is called.
  void set_after_backward(std::function<void()> after_backward) {
    after_backward_ = std::move(after_backward);
  }

  // Vocabulary parallelism (Schedule::vocab_parallel): this rank's shards of
  // the embedding and the head (borrowed). A program with vocabulary passes
  // runs only with them set. Then stage 0's F takes the summed embedding
  // (IN_REDUCE) as its input instead of the micro-batch's token ids (still
  // inputs[0]: every rank looks them up), the last stage's F outputs the
  // hidden states the head reads (OUT_BCAST) and computes no loss, its
  // backward starts from their gradient (OUT_REDUCE), and stage 0's input
  // gradient goes to IN_BCAST. The loss is each micro-batch's mean
  // cross-entropy over the tokens whose `labels_key` entry is not the
  // ignore index, scaled by 1/m; StepStats counts it on the last stage's
  // rank. Collectives run on `vocabulary->group()` (the pipe group, or pipe
  // x model under tensor parallelism: every tensor rank of a stage runs the
  // stage's passes; a broadcast starts at the stage's tensor rank 0, whose
  // hidden states and input gradient its tensor peers hold too; under
  // sequence parallelism the stage's slices are summed instead and each
  // tensor rank takes its slice: VocabularyLayers::sequence_parallel) with
  // its timeout.
  void set_vocabulary(VocabularyLayers* vocabulary, std::string labels_key = "labels") {
    vocab_ = vocabulary;
    vocab_labels_key_ = std::move(labels_key);
  }

  P2P& p2p() { return p2p_; }
  const P2P& p2p() const { return p2p_; }

 private:
  using Key = std::pair<int, int>;  // (virtual stage, micro-batch)
  struct StashEntry {
    Activations inputs;     // what Forward received (leaves for grads)
    Activations outputs;    // what Forward returned (graph roots), or
    torch::Tensor loss;     // the scaled loss on the last stage
    bool received = false;  // inputs came from p2p (their buffers can be recycled)
    // After I: what W computes the parameter gradients from. The inputs stay
    // (a join node may have saved them) until W.
    bool input_grads_done = false;
    WeightGradTask weight;
    Activations output_grads;  // received output gradients, recycled after W
  };
  // A vocabulary collective started by action (type, micro-batch) and what
  // its result becomes when waited for (stored for its reader, or the loss).
  struct PendingVocabCollective {
    ActionType type;
    int microbatch = 0;
    int stage = 0;
    tensor_parallel::PendingCollective work;
    std::function<absl::Status(torch::Tensor)> finish;
    // An observed asynchronous step: where the backend writes when the
    // collective completed (PendingCollective::TrackCompletion); else null.
    std::shared_ptr<const std::atomic<int64_t>> completed_us;
  };
  // A finished asynchronous collective whose completion the observer is told
  // after the step's actions (the backend's callback may come just after the
  // wait returns): the action that started it, and when the wait ended.
  struct FinishedVocabCollective {
    Action started;
    std::shared_ptr<const std::atomic<int64_t>> completed_us;
    int64_t waited_us = 0;
  };
  struct StepState {
    const LoweredProgram* program = nullptr;
    int64_t step = 0;
    bool forward_only = false;
    MicroBatchSource* source = nullptr;
    std::map<int, MicroBatchData> data;                 // by micro-batch
    std::map<Key, std::pair<Activations, bool>> inbox;  // inputs for F: (tensors, received)
    std::map<Key, int64_t> inbox_ids;                   // micro-batch id that came with them
    std::map<Key, Activations> outbox;                  // F outputs waiting for SEND_F
    std::map<Key, int64_t> outbox_ids;
    std::map<Key, std::vector<TensorMeta>> out_layouts;      // layout of F outputs (for RECV_B)
    std::map<Key, std::pair<Activations, bool>> grad_inbox;  // output grads for B
    std::map<Key, Activations> grad_outbox;                  // input grads waiting for SEND_B
    std::map<Key, StashEntry> stash;
    StepStats stats;
    // Vocabulary parallelism, by micro-batch: IN_F's share, then on stage
    // 0's rank the sum (its F's input); the last stage's output (OUT_BCAST);
    // OUT_S's statistics; OUT_T's share of the output gradient, then on the
    // last stage's rank the sum; stage 0's input gradient (IN_BCAST); the
    // tokens' loss gradient scale (from OUT_STATS until OUT_T).
    std::map<int, torch::Tensor> vocab_embedded, vocab_hidden, vocab_stats, vocab_hidden_grad,
        vocab_input_grad, vocab_grad_scale;
    // The vocabulary collectives started and not yet finished, in the order
    // they started (StageExecutorOptions::vocabulary_async_collectives; the
    // blocking form finishes each as it starts).
    bool vocab_async = false;
    std::list<PendingVocabCollective> vocab_pending;
    std::vector<FinishedVocabCollective> vocab_finished;
  };

  // post_receives_ahead: the step's receives per channel, in program order,
  // and whether the channel's next one is posted.
  struct Channel {
    std::deque<Action> receives;  // not yet posted
    bool posted = false;          // a receive of this channel is posted, not yet waited for
  };
  using ChannelId = std::pair<int, int>;  // (RECV action type, virtual stage)
  static ChannelId ChannelOf(const Action& a) { return {static_cast<int>(a.type), a.stage}; }
  // Posts each channel's next receive where allowed (see the option).
  absl::Status PostReady(StepState& st, std::map<ChannelId, Channel>& channels);

  absl::Status Execute(const Action& action, StepState& st, const TailFn& tail);
  // The vocabulary passes and their collectives.
  absl::Status ExecuteVocabulary(const Action& action, StepState& st);
  // Keeps the collective `action` started; blocking (not st.vocab_async), finishes it at once.
  absl::Status StartVocabCollective(StepState& st, const Action& action,
                                    tensor_parallel::PendingCollective work,
                                    std::function<absl::Status(torch::Tensor)> finish);
  // Waits for the collective of (`type`, `mb`) if it is pending, and for the
  // collectives of `type` started before it (each kind finishes in program
  // order, as the blocking form: the loss sums in the same order), then
  // finishes them. OK when none is pending.
  absl::Status FinishVocabCollective(StepState& st, ActionType type, int mb);
  // Waits for and finishes every pending one, in the order they started.
  absl::Status FinishVocabCollectives(StepState& st);
  // Finishes, without waiting, the pending ones already complete whose kind
  // has none started before them still in flight (each kind still finishes
  // in program order).
  absl::Status FinishCompletedVocabCollectives(StepState& st);
  // Waits for `pending` (taken off the list), records when for the
  // observer, and runs its finish step.
  absl::Status FinishPendingVocabCollective(StepState& st, PendingVocabCollective pending);
  // Tells `observer` when each of `finished` completed, giving the backend's
  // callbacks up to 100 ms in all to report it (else the wait's end).
  static void ReportVocabCompletions(const ObservedStep& step,
                                     const std::vector<FinishedVocabCollective>& finished,
                                     ActionObserver& observer);
  // Finishes what leaf action `a` reads (VocabCollectiveReadBy), or before a
  // tail action every pending one; run before the action is observed, so
  // that its span holds no wait.
  absl::Status FinishVocabCollectivesReadBy(const Action& a, StepState& st);
  absl::StatusOr<const MicroBatchData*> Data(StepState& st, int mb);
  absl::Status Forward(const Action& a, StepState& st);
  torch::Tensor ScaledLoss(const torch::Tensor& loss, const MicroBatchData& data,
                           int num_microbatches) const;
  // The stash entry a B or I acts on; FailedPrecondition when its F has not
  // run, or its I already has (`what` names the offending action).
  absl::StatusOr<std::map<Key, StashEntry>::iterator> StashBeforeInputGrads(const Action& a,
                                                                            StepState& st,
                                                                            const char* what);
  absl::Status Backward(const Action& a, StepState& st);
  // I: input gradients only, handed on at once; keeps the weight half.
  absl::Status BackwardInput(const Action& a, StepState& st);
  // W: the weight half kept by I.
  absl::Status BackwardWeight(const Action& a, StepState& st);
  // The graph roots and their gradients for a backward of `entry` (B or I):
  // the scaled loss on the last stage, else the outputs that require grad
  // with the output gradients (taken out of the grad inbox).
  absl::Status Roots(const Action& a, StepState& st, StashEntry& entry,
                     std::vector<torch::Tensor>& roots, std::vector<torch::Tensor>& root_grads,
                     Activations& grads, bool& grads_received);
  // Vocabulary parallelism: stage 0's input gradient, kept for IN_BCAST.
  absl::Status KeepEmbeddingGrad(const Action& a, StepState& st, Activations input_grads);
  // Hands input gradients to stage s - 1 (locally or via SEND_B).
  void HandInputGrads(StepState& st, int stage, int mb, Activations input_grads);
  bool IsLocal(const StepState& st, int stage) const;

  int rank_;
  std::map<int, std::function<Activations(const Activations&, const MicroBatch&)>> stages_;
  LossFn loss_fn_;
  MicroBatchSource* source_;
  c10::intrusive_ptr<c10d::ProcessGroup> pipe_group_;
  StageExecutorOptions options_;
  P2P p2p_;
  ActionObserver* observer_ = nullptr;
  VocabularyLayers* vocab_ = nullptr;
  std::string vocab_labels_key_ = "labels";
  std::function<void()> after_backward_;
  absl::Status status_holder_;  // an action's error, carried out of TorchCall
};

}  // namespace pp

#endif  // PIPELINE_RUNTIME_STAGE_EXECUTOR_H_
