#ifndef PIPE_TOPOLOGY_RESERVED_PORT_H_
#define PIPE_TOPOLOGY_RESERVED_PORT_H_

#include <string>

#include "absl/status/statusor.h"

namespace pp {

// A free TCP port kept bound, not listening, for as long as this object
// lives. A port picked by binding port 0 and closing is free only a moment:
// in the seconds before rank 0's store binds it, another test's bind to port 0
// or any outgoing connection's ephemeral port can take it (a launch then
// fails with EADDRINUSE). Held bound, the kernel gives it to neither. The
// socket sets SO_REUSEADDR, so a store that binds the port with SO_REUSEADDR
// too (c10d's TCPStore does, both backends) and listens still can: Linux
// refuses a shared port only when one of its sockets listens.
class ReservedPort {
 public:
  // Binds port 0 on the IPv4 `address` (dotted quad). InvalidArgument when it
  // is not one, Unavailable when the kernel has no port to give.
  static absl::StatusOr<ReservedPort> OnFreePort(const std::string& address);

  ReservedPort(ReservedPort&& other) noexcept;
  ReservedPort& operator=(ReservedPort&& other) noexcept;
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  ~ReservedPort();

  int port() const { return port_; }

 private:
  ReservedPort(int fd, int port) : fd_(fd), port_(port) {}

  int fd_ = -1;
  int port_ = 0;
};

}  // namespace pp

#endif  // PIPE_TOPOLOGY_RESERVED_PORT_H_
