#include "topology/reserved_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pp {

absl::StatusOr<ReservedPort> ReservedPort::OnFreePort(const std::string& address) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (::inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not an IPv4 address to pick a free port on"));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket(): ", std::strerror(errno)));
  const int on = 1;
  socklen_t len = sizeof(addr);
  if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot bind a free port on ", address, ": ", std::strerror(err)));
  }
  return ReservedPort(fd, static_cast<int>(ntohs(addr.sin_port)));
}

ReservedPort::ReservedPort(ReservedPort&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}

ReservedPort& ReservedPort::operator=(ReservedPort&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    port_ = other.port_;
  }
  return *this;
}

ReservedPort::~ReservedPort() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace pp
