// Test only: plants a fault in the tensor-parallel communication functions, so
// that a test can show it notices a missing all-reduce or a wrong scatter (the
// equivalence suite's planted bugs). Never set outside tests.
#ifndef PIPELINE_TENSOR_PARALLEL_PLANTED_FAULT_H_
#define PIPELINE_TENSOR_PARALLEL_PLANTED_FAULT_H_

namespace pp {
namespace tensor_parallel {
namespace internal {

enum class PlantedFault {
  kNone,
  // Every sum all-reduce of mappings.h returns its input unreduced.
  kSkipAllReduce,
  // Every slice takes the next rank's part instead of its own.
  kWrongSlice,
  // Every all-gather of mappings.h returns this rank's part in every slot, as
  // if the peers' were never received (vocabulary parallelism: the softmax's
  // max and sum over the vocabulary stay local).
  kSkipAllGather,
  // LocalVocabRows on ranks > 0 starts one row early (a shard off by one row).
  kShiftedVocabRows,
  // CopyToReplicaGroup's backward keeps each rank's own part of the gradient
  // (a replicated kv head learns only from its own rank's query heads).
  kSkipReplicaGradientSum,
  // p2p's scatter/gather between stages (P2POptions::split_payloads_over):
  // each rank sends the next rank's part of a payload instead of its own.
  kWrongPayloadPart,
  // Vocabulary parallelism with tensor parallelism (stage_executor.cc): the
  // softmax statistics are all-gathered over the pipe group only, as at
  // tp = 1, so each tensor rank's loss misses the other tensor ranks' rows.
  kVocabStatsOverPipeOnly,
  // Vocabulary parallelism with sequence parallelism (vocab_layers.cc): each
  // tensor rank takes the next tensor rank's slice of the sequence.
  kWrongVocabSequenceSlice,
  // Sequence parallelism under the Trainer (sequence_parallel_grads.h): the
  // once-per-step sum of the replicated parameters' gradients is skipped, so
  // each rank keeps its own slice's part.
  kSkipSequenceParallelGradSum,
  // The same sum keeps only the first of those parameters' sums.
  kSumOneSequenceParallelGrad,
  // Vocabulary parallelism's one-barrier algorithm (vocab_passes.cc): each
  // rank's partial hidden-state gradient is summed without its rescale by
  // exp(m_r - M) / S, still relative to its own max.
  kVocabPartialNotRescaled,
};

// Process-wide; the previous fault is returned so a test can restore it.
PlantedFault PlantFault(PlantedFault fault);
PlantedFault CurrentFault();

}  // namespace internal
}  // namespace tensor_parallel
}  // namespace pp

#endif  // PIPELINE_TENSOR_PARALLEL_PLANTED_FAULT_H_
