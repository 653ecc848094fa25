// A run's memory per pipeline rank in bytes, predicted before launch, and the
// per-rank cap `parallelism.memory_cap_mib`.
//
// The prediction is pipeline/schedule/analysis/memory_plan.h's planner fed with the
// model's own memory arithmetic (models/model_memory.h), for one rank of
// a tensor-parallel model group: per virtual stage its parameters (blocks spread evenly over the p
// x v virtual stages, the embedding on the first, the head and its logits on the last), one
// micro-batch's activations kept for the backward (fewer with activation checkpointing on the
// layers checkpointable_types matches), the boundary message, and under precision "bf16" the fp32
// master weights and bf16 activations. The schedule's own action lists decide how many
// micro-batches each rank holds.
//
//   PP_RETURN_IF_ERROR(pp::CheckMemoryCap(config));  // before launch
//   auto plan = pp::PlanRunMemory(config, schedule);  // predicted per rank
#ifndef DRIVER_MEMORY_BUDGET_H_
#define DRIVER_MEMORY_BUDGET_H_

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "driver/config.pb.h"
#include "models/registry.h"
#include "pipeline/schedule/analysis/memory_plan.h"
#include "pipeline/schedule/ir/schedule.h"

namespace pp {

// The model's memory arithmetic, when its registration gives one.
std::optional<ModelMemory> ModelMemoryOf(const driver::ExperimentConfig& config);

// How many of the model's layers activation checkpointing may recompute:
// those checkpointable_types matches (all when it is empty; none when it does
// not compile, which config validation reports).
double CheckpointableLayerCount(const driver::ExperimentConfig& config);

// The schedule a run's memory is planned for: the config's ("auto": its
// measurement schedule). ResourceExhausted when it has too many actions to
// build for a prediction; the registry's error when it does not build.
absl::StatusOr<Schedule> PlannedSchedule(const driver::ExperimentConfig& config);

// The planner's inputs for `config` with `num_virtual_stages` (p x v); nullopt
// for a model without a memory arithmetic (its layers are its own).
struct RunMemoryInputs {
  std::vector<StageMemory> stages;
  MemoryPlanOptions options;
};
std::optional<RunMemoryInputs> RunMemoryInputsOf(const driver::ExperimentConfig& config,
                                                 int num_virtual_stages);

// The predicted peak per pipeline rank of `config` trained with `schedule`
// (one data-parallel replica and one tensor-parallel rank; every replica,
// and every rank of a model group, is the same). nullopt for a model without
// a transformer shape.
absl::StatusOr<std::optional<MemoryPlan>> PlanRunMemory(const driver::ExperimentConfig& config,
                                                        const Schedule& schedule);

// OK when parallelism.memory_cap_mib is 0 (no cap) or every rank's predicted
// peak under the config's schedule ("auto": its measurement schedule) fits.
// Else InvalidArgument naming the rank, its predicted bytes and biggest terms,
// and what would fit: other registered schedules of the same shape, activation
// checkpointing, a smaller micro_batch_size, a partition with fewer layers on
// that rank.
absl::Status CheckMemoryCap(const driver::ExperimentConfig& config);

// Whether every rank's predicted peak under `schedule` fits
// parallelism.memory_cap_mib, by the byte plan CheckMemoryCap uses. true
// without a cap or a prediction (a model without a transformer shape).
absl::StatusOr<bool> FitsMemoryCap(const driver::ExperimentConfig& config,
                                   const Schedule& schedule);

// parallelism.memory_cap_mib in the synthesiser's units (one virtual stage's
// activations of one micro-batch, pipeline/schedule/schedules/synthesis.h): per rank
// (cap - its fixed bytes - its largest recompute range) / the largest
// per-micro-batch activation bytes of a virtual stage, the smallest over
// ranks. nullopt when there is no cap or the model has no transformer shape.
// InvalidArgument when not even one micro-batch's activations fit.
absl::StatusOr<std::optional<double>> SynthesisMemoryCap(const driver::ExperimentConfig& config);

}  // namespace pp

#endif  // DRIVER_MEMORY_BUDGET_H_
