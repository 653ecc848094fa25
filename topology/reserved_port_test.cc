#include "topology/reserved_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "topology/rendezvous.h"

namespace pp {
namespace {

using ::testing::HasSubstr;

// Whether a socket without SO_REUSEADDR (a plain bind, as another program's)
// can bind `port` on 127.0.0.1.
bool PlainBindSucceeds(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return bound;
}

TEST(ReservedPortTest, OthersCannotBindItUntilItIsReleased) {
  absl::StatusOr<ReservedPort> reserved = ReservedPort::OnFreePort("127.0.0.1");
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  const int port = reserved->port();
  EXPECT_GT(port, 0);
  EXPECT_FALSE(PlainBindSucceeds(port));
  {
    ReservedPort moved = *std::move(reserved);  // the reservation moves with it
    EXPECT_EQ(moved.port(), port);
    EXPECT_FALSE(PlainBindSucceeds(port));
  }
  EXPECT_TRUE(PlainBindSucceeds(port));
}

// The launcher's case: rank 0 hosts c10d's TCPStore on the port while the
// launcher still holds it.
TEST(ReservedPortTest, RankZerosStoreListensOnIt) {
  absl::StatusOr<ReservedPort> reserved = ReservedPort::OnFreePort("127.0.0.1");
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  DistEnv env;
  env.master_port = reserved->port();
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(20);
  absl::StatusOr<World> world = Rendezvous(env, options);
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_EQ(world->size, 1);
}

TEST(ReservedPortTest, ANonAddressIsRefused) {
  absl::StatusOr<ReservedPort> reserved = ReservedPort::OnFreePort("localhost");
  EXPECT_EQ(reserved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(reserved.status().message(), HasSubstr("'localhost' is not an IPv4 address"));
}

}  // namespace
}  // namespace pp
