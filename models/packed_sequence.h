// Packed sequences: several documents share a row of a micro-batch, each
// attending only to itself with positions that restart at its first token
// (docs/packed_sequences.md). A packing data source (models/data/packed_data.h)
// says where documents are with two side inputs of the micro-batch, shaped like
// "input_ids" [rows, time]:
//   "position_ids": int64, each token's position within its document (0, 1, ...);
//   "document_ids": int64, equal exactly for tokens of one document of the row
//                   (padding: a value no document has).
// Models read them from the micro-batch on every stage (every rank computes the
// micro-batch itself), so nothing about packing travels between stages. Without
// them a row is one sequence: positions 0..time-1, attention causal.
#ifndef MODELS_PACKED_SEQUENCE_H_
#define MODELS_PACKED_SEQUENCE_H_

#include <cstdint>

#include <torch/torch.h>

#include "pipeline/layers/layer.h"

namespace pp {

inline constexpr char kPositionIdsKey[] = "position_ids";
inline constexpr char kDocumentIdsKey[] = "document_ids";

// The batch's position_ids ([rows, time], checked against `time`), or an
// undefined tensor when the batch has none (the caller's 0..time-1).
torch::Tensor PackedPositions(const MicroBatch& batch, int64_t time);

// The batch's document_ids, or an undefined tensor when it has none.
torch::Tensor DocumentIds(const MicroBatch& batch);

// True where query i of a row may NOT attend to key j, which belongs to
// another document: [rows, 1, time, time] (broadcasting over heads) from
// document_ids [rows, time] (checked), or an undefined tensor for undefined
// ids. Causality is the caller's.
torch::Tensor CrossDocumentMask(const torch::Tensor& document_ids, int64_t time);

}  // namespace pp

#endif  // MODELS_PACKED_SEQUENCE_H_
