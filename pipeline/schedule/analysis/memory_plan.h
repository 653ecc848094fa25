// A memory planner in bytes: the predicted peak per rank of a schedule, from
// per-virtual-stage byte costs (parameters, activations per micro-batch,
// boundary messages), with the terms that make it up.
//
// Per rank: parameters + gradients (same bytes as the parameters) + optimizer
// state (AdamW: 2 fp32 states per parameter, SGD with momentum: 1, plain
// SGD: 0; parameters are taken to be fp32, or see fp32_master_weights) + p2p
// buffers + activations by
// liveness, walking the rank's compute actions in order as the simulator's
// memory model does (simulator.h): F keeps its stage's activation bytes until
// its B; a split backward frees MemorySplit::InputFraction() of them at I and
// the rest at W, and holds the stage's weight_pending_bytes from I to W. With activation
// checkpointing a stage's `activation_bytes` are only the checkpointed inputs, and its
// `recompute_bytes` (the range's activations regenerated for the backward) are live during each B
// or I of that stage only (each W instead where its I computes nothing: backward_in_weight).
// Forward-only schedules keep one micro-batch's activations at a time and no gradients or
// optimizer state.
//
// p2p buffers, what the CPU runtime (Gloo, pipeline/runtime/p2p.h) keeps:
// - receive buffers: the pool keeps every buffer it ever handed out, so a
//   rank holds, all step, the most received tensors it uses at once (an input
//   from another rank from its F until the backward is done with it, B or W;
//   an output gradient during B, or from I to W), each the boundary's bytes;
// - sent messages: a Gloo send completes only when waited for, which the
//   step's tail does, so everything a rank sent to another rank stays live
//   until then: an F's output beyond its B (or I), each B's (or I's) input
//   gradient. 1F1B's peak therefore grows with every backward done. (NCCL
//   sends report completion, and the runtime drops them at its next send:
//   there this term may over-predict; not measured on a device.)
// A stage handed over to another stage on the same rank (V placements)
// sends and receives nothing.
//
// Tied parameters: a stage holding a tied copy counts its bytes (every rank
// with a copy holds it, as the runtime does); give them in parameter_bytes.
//
// Vocabulary parallelism (Schedule::vocab_parallel, vocab_passes.h): every
// rank holds its rows of the embedding and the head (VocabMemory, counted
// with the parameters, their gradients and optimizer state; leave them out of
// the first and last stages' parameter_bytes), each micro-batch's OUT_S
// result until its OUT_T, and during OUT_S, OUT_T and IN_B what the pass
// allocates and frees (its logits, their gradient, the rows' gradient).
//
// The optimizer step (MemoryPlanOptions::step_temporary_factor): the
// temporaries it allocates beside its state, live in the step's tail, when
// every activation is freed; they make the peak of a rank whose parameters
// outweigh its activations (a vocabulary shard's rank).
#ifndef PIPELINE_SCHEDULE_ANALYSIS_MEMORY_PLAN_H_
#define PIPELINE_SCHEDULE_ANALYSIS_MEMORY_PLAN_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipeline/schedule/analysis/simulator.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {

enum class OptimizerKind { kSgd, kSgdMomentum, kAdamW };

// "sgd", "momentum" (SGD with momentum) or "adamw"; InvalidArgument otherwise.
absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view text);

// fp32 state bytes per parameter byte: AdamW 2, momentum 1, SGD 0.
double OptimizerStateFactor(OptimizerKind kind);

// One virtual stage's bytes. Doubles: bytes are only summed and compared.
struct StageMemory {
  double parameter_bytes = 0;   // its parameters (tied copies included)
  double activation_bytes = 0;  // kept by one micro-batch's F until its backward
  double recompute_bytes = 0;   // regenerated during its backward (checkpointing)
  double boundary_bytes = 0;    // one micro-batch's output (the p2p message)
  // A split backward's extra: bytes its I leaves for its W (the saved
  // inputs and output gradients the weight gradients need; with
  // checkpointing the range I regenerated), freed by W.
  double weight_pending_bytes = 0;
  // Its I computes no input gradient (the first stage's input, token ids,
  // has none), so the whole backward runs in its W: with checkpointing the
  // range is regenerated there, and recompute_bytes are live during W, not I.
  bool backward_in_weight = false;
};

// What a rank holds for the vocabulary passes.
struct VocabMemory {
  double parameter_bytes = 0;  // its rows of the embedding and of the head (once if tied)
  // One micro-batch's OUT_S result kept until its OUT_T: the exps of its
  // logits (fp32, tokens x vocabulary / p), the head's input (tokens x
  // width), the statistics.
  double pending_bytes = 0;
  // The one-barrier algorithm's (Schedule::vocab_barriers 1) partial
  // hidden-state gradient (fp32, tokens x width), held from OUT_S until
  // OUT_REDUCE. In a list without collectives (a compute-only schedule)
  // OUT_REDUCE's place is Lower()'s: right after OUT_STATS (the bytes count
  // at OUT_S only), or with `async_collectives` as late as the micro-batch's
  // OUT_T (LoweringOptions::vocab_async_collectives; counted until it).
  // Ignored for two-barrier schedules.
  double partial_bytes = 0;
  bool async_collectives = false;
  // Live during one pass only, beside what it keeps and every micro-batch's
  // pending bytes: OUT_S's logits before their exps; OUT_T's gradient of the
  // logits (fp32, tokens x vocabulary / p) and of the rows (rows x width,
  // before it is added to theirs); IN_B's gradient of the embedding rows.
  double output_s_workspace_bytes = 0;
  double output_t_workspace_bytes = 0;
  double input_b_workspace_bytes = 0;
};

struct MemoryPlanOptions {
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  MemorySplit split;  // how I and W free activations (simulator.h)
  // bf16 with fp32 master weights (pipeline/runtime/mixed_precision.h):
  // `parameter_bytes` stay the fp32 bytes; the module holds half of them
  // (bf16), the optimizer a full fp32 master copy, gradients an fp32
  // accumulation buffer plus the bf16 gradients of the last backward (1.5x),
  // optimizer state is fp32. Activation and boundary bytes are the caller's
  // (give them in bf16).
  bool fp32_master_weights = false;
  // The distributed optimizer over this many data-parallel ranks
  // (pipeline/runtime/distributed_optimizer.h; 1: none): each rank keeps
  // 1/dp of the optimizer state and of the fp32 masters, and in the step's
  // tail holds its parameters' gradients flattened in fp32 for the
  // reduce-scatter plus its slice of the reduced ones (`reduce_buffers`).
  int distributed_optimizer_dp = 1;
  // Only with a vocab_parallel schedule (else all 0).
  VocabMemory vocab;
  // Bytes the optimizer step allocates, and frees, per byte of the fp32
  // parameters it updates (the fp32 masters under fp32_master_weights; 1/dp
  // of them under the distributed optimizer): MultiTensorAdamW's denominators
  // sqrt(v) + eps, one per parameter, 1 (pipeline/runtime/multi_tensor_adamw.h).
  // 0: not counted. Live in the step's tail, after the sent messages are
  // waited for.
  double step_temporary_factor = 0;
};

// One rank's prediction: the peak and its terms at the peak.
struct RankMemoryPlan {
  double peak_bytes = 0;
  double parameters = 0;      // the module's (bf16 under fp32_master_weights)
  double master_weights = 0;  // fp32 copies (fp32_master_weights only)
  double gradients = 0;
  double optimizer_state = 0;
  double p2p_buffers = 0;    // receive buffers (the pool's most in use)
  double activations = 0;    // held at the peak
  double recompute = 0;      // regenerated activations live at the peak
  double sent_messages = 0;  // sent to other ranks, kept until the step's tail
  // The distributed optimizer's tail buffers, when they make the peak.
  double reduce_buffers = 0;
  double vocab_pending = 0;     // OUT_S results held for OUT_T (and OUT_REDUCE) at the peak
  double vocab_workspace = 0;   // the vocabulary pass running at the peak: its temporaries
  double step_temporaries = 0;  // the optimizer step's, when the step makes the peak
  int peak_step = -1;           // position in the rank's list where the peak is reached
  // (term name, bytes), biggest first, zero terms left out.
  std::vector<std::pair<std::string, double>> Terms() const;
};

struct MemoryPlan {
  std::vector<RankMemoryPlan> ranks;
};

// InvalidArgument when `stages` does not have one entry per virtual stage, a
// value is negative or not finite, or the schedule's compute actions name
// stages out of range. `schedule.ranks` may be a lowered program's (its
// communication and tail actions are skipped).
absl::StatusOr<MemoryPlan> PlanMemory(const Schedule& schedule,
                                      const std::vector<StageMemory>& stages,
                                      const MemoryPlanOptions& options = {});

// "1.50 MiB" (B, KiB, MiB, GiB).
std::string FormatBytes(double bytes);

// One line per rank: "rank 0: peak 1.50 MiB = activations 1.00 MiB + ..."
// (terms biggest first).
std::string FormatMemoryPlan(const MemoryPlan& plan);

}  // namespace pp

#endif  // PIPELINE_SCHEDULE_ANALYSIS_MEMORY_PLAN_H_
