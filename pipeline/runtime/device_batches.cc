#include "pipeline/runtime/device_batches.h"

#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "topology/device_transfer.h"

namespace pp {

MicroBatchData MicroBatchOnDevice(MicroBatchData data, const c10::Device& device) {
  if (device.is_cpu()) return data;
  data.inputs = ToDevice(data.inputs, device);
  for (auto& [name, tensor] : data.batch.tensors) tensor = ToDevice({tensor}, device)[0];
  return data;
}

absl::StatusOr<MicroBatchData> DeviceMicroBatchSource::Get(int64_t step, int64_t index) {
  PP_ASSIGN_OR_RETURN(MicroBatchData data, source_->Get(step, index));
  return MicroBatchOnDevice(std::move(data), device_);
}

}  // namespace pp
