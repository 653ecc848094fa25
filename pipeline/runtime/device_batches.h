// Micro-batches on the rank's device: a MicroBatchSource that reads another
// one and moves every tensor (first-stage inputs and side inputs: labels,
// masks) to a device. Data sources stay device-agnostic (they build CPU
// tensors); the Trainer wraps its sources when its device is not the CPU.
//
// CPU tensors are pinned and copied non_blocking (topology/device_transfer.h ToDevice):
// the copy is queued on the device's current stream, so the kernels that use
// the batch run after it and the host does not wait.
#ifndef PIPELINE_RUNTIME_DEVICE_BATCHES_H_
#define PIPELINE_RUNTIME_DEVICE_BATCHES_H_

#include <cstdint>

#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "pipeline/runtime/micro_batch_source.h"

namespace pp {

// `data` with every defined tensor on `device` (the same tensors on the CPU).
MicroBatchData MicroBatchOnDevice(MicroBatchData data, const c10::Device& device);

// Borrows `source` (which must outlive it). Thread-compatible like the source.
class DeviceMicroBatchSource : public MicroBatchSource {
 public:
  DeviceMicroBatchSource(MicroBatchSource* source, c10::Device device)
      : source_(source), device_(device) {}

  absl::StatusOr<MicroBatchData> Get(int64_t step, int64_t index) override;

  MicroBatchSource* source() const { return source_; }
  const c10::Device& device() const { return device_; }

 private:
  MicroBatchSource* source_;
  c10::Device device_;
};

}  // namespace pp

#endif  // PIPELINE_RUNTIME_DEVICE_BATCHES_H_
