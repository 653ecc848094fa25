#include "models/packed_sequence.h"

namespace pp {
namespace {

void CheckSideInput(const torch::Tensor& t, const char* key, int64_t time) {
  TORCH_CHECK(t.dim() == 2 && t.size(1) == time, "\"", key, "\" must be [rows, ", time,
              "] (the sequence's length), got ", t.sizes());
  TORCH_CHECK(!at::isFloatingType(t.scalar_type()), "\"", key, "\" must hold integers, got ",
              t.scalar_type());
}

}  // namespace

torch::Tensor PackedPositions(const MicroBatch& batch, int64_t time) {
  if (!batch.Has(kPositionIdsKey)) return torch::Tensor();
  const torch::Tensor& t = batch.Get(kPositionIdsKey);
  CheckSideInput(t, kPositionIdsKey, time);
  return t;
}

torch::Tensor DocumentIds(const MicroBatch& batch) {
  return batch.Has(kDocumentIdsKey) ? batch.Get(kDocumentIdsKey) : torch::Tensor();
}

torch::Tensor CrossDocumentMask(const torch::Tensor& document_ids, int64_t time) {
  if (!document_ids.defined()) return document_ids;
  CheckSideInput(document_ids, kDocumentIdsKey, time);
  return (document_ids.unsqueeze(2) != document_ids.unsqueeze(1)).unsqueeze(1);
}

}  // namespace pp
