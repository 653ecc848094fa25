#include "pipeline/runtime/device_streams.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace pp {

P2PStreams::P2PStreams(c10::Device device) : device_(device) {
  if (device.is_cpu()) return;
  if (!device_.has_index()) device_ = c10::Device(device.type(), 0);
  c10::impl::VirtualGuardImpl impl(device_.type());
  send_ = impl.getStreamFromGlobalPool(device_);
  recv_ = impl.getStreamFromGlobalPool(device_);
}

absl::Status P2PStreams::Send(const std::function<absl::Status()>& post) {
  if (!active()) return post();
  c10::impl::VirtualGuardImpl impl(device_.type());
  c10::Event produced(device_.type());
  produced.record(impl.getStream(device_));
  produced.block(*send_);
  ++ordered_sends_;
  c10::StreamGuard guard(*send_);
  return post();
}

absl::Status P2PStreams::Recv(const std::function<absl::Status()>& post) {
  if (!active()) return post();
  c10::impl::VirtualGuardImpl impl(device_.type());
  const c10::Stream compute = impl.getStream(device_);
  // The receive stream first waits for the work queued on the compute stream:
  // receive buffers come from the caching allocator (or the pool) as blocks
  // the compute stream may still be writing or reading (the allocator makes a
  // freed block safe to reuse in the compute stream's order only). Without
  // this wait a receive's copy could land before such a pending kernel, which
  // then overwrote it: a bf16 run on one shared GPU read garbage control words.
  c10::Event free_to_write(device_.type());
  free_to_write.record(compute);
  free_to_write.block(*recv_);
  absl::Status s;
  {
    c10::StreamGuard guard(*recv_);
    s = post();
  }
  if (!s.ok()) return s;
  c10::Event arrived(device_.type());
  arrived.record(*recv_);
  arrived.block(compute);
  ++ordered_receives_;
  return absl::OkStatus();
}

}  // namespace pp
