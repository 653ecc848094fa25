#include "topology/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "topology/reserved_port.h"

namespace pp {
namespace {

// The value of environment variable `name` as an int in [min, max]; nullopt
// when unset (or empty); InvalidArgument when malformed.
absl::StatusOr<std::optional<int>> IntFromEnv(const char* name, int min, int max) {
  const char* raw = std::getenv(name);
  if (raw == nullptr || *raw == '\0') return std::optional<int>();
  int value = 0;
  if (!absl::SimpleAtoi(raw, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", raw, "' is not an integer"));
  }
  if (value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, "=", value,
                                                   " is out of range [", min, ", ", max, "]"));
  }
  return std::optional<int>(value);
}

absl::Status Missing(const char* name, const char* why) {
  return absl::InvalidArgumentError(
      absl::StrCat("environment variable ", name, " is not set; ", why,
                   " (start workers with the launcher, or set torchrun's MASTER_ADDR, "
                   "MASTER_PORT, RANK, WORLD_SIZE)"));
}

}  // namespace

bool IsLoopbackAddress(const std::string& address) {
  return address == "localhost" || address == "::1" || absl::StartsWith(address, "127.");
}

absl::StatusOr<DistEnv> DistEnvFromEnvironment() {
  constexpr int kMaxRanks = 1 << 20;
  DistEnv env;
  PP_ASSIGN_OR_RETURN(std::optional<int> world_size, IntFromEnv("WORLD_SIZE", 1, kMaxRanks));
  if (!world_size) return Missing("WORLD_SIZE", "it gives the number of ranks");
  env.world_size = *world_size;
  PP_ASSIGN_OR_RETURN(std::optional<int> rank, IntFromEnv("RANK", 0, env.world_size - 1));
  if (!rank) return Missing("RANK", "it gives this process's rank");
  env.rank = *rank;
  PP_ASSIGN_OR_RETURN(std::optional<int> local_world_size,
                      IntFromEnv("LOCAL_WORLD_SIZE", 1, env.world_size));
  env.local_world_size = local_world_size.value_or(env.world_size);
  PP_ASSIGN_OR_RETURN(std::optional<int> local_rank,
                      IntFromEnv("LOCAL_RANK", 0, env.local_world_size - 1));
  if (!local_rank && env.rank >= env.local_world_size) {
    return Missing("LOCAL_RANK", "it is needed when RANK >= LOCAL_WORLD_SIZE");
  }
  env.local_rank = local_rank.value_or(env.rank);
  PP_ASSIGN_OR_RETURN(std::optional<int> port, IntFromEnv("MASTER_PORT", 1, 65535));
  if (port) {
    env.master_port = *port;
  } else if (env.world_size > 1) {
    return Missing("MASTER_PORT", "rank 0 hosts the store on it");
  }
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr != nullptr && *addr != '\0') env.master_addr = addr;
  const char* run_id = std::getenv(kRunIdVariable);
  if (run_id != nullptr) env.run_id = run_id;
  const char* launch_id = std::getenv(kLaunchIdVariable);
  if (launch_id != nullptr) env.launch_id = launch_id;
  PP_ASSIGN_OR_RETURN(std::optional<int> node_rank, IntFromEnv("GROUP_RANK", 0, kMaxRanks));
  env.node_rank = node_rank.value_or(0);
  return env;
}

namespace {

constexpr char kRunIdKey[] = "pp/run_id";

std::string LaunchKey(int node_rank) { return absl::StrCat("pp/launch_of_node/", node_rank); }

// Rank 0 records its node's launch id, then the run id; the others read the
// run id (waiting for rank 0, within the store's timeout) and claim or check
// their node's launch id before they write anything else to the store.
absl::Status CheckRunId(c10d::Store& store, const DistEnv& env) {
  const std::string where = absl::StrCat("the store at ", env.master_addr, ":", env.master_port);
  const std::vector<uint8_t> launch(env.launch_id.begin(), env.launch_id.end());
  std::string theirs;
  try {
    if (env.rank == 0) {
      // Before the run id: a rank that can read the run id finds node 0's
      // launch recorded.
      if (!launch.empty()) store.set(LaunchKey(env.node_rank), launch);
      store.set(kRunIdKey, std::vector<uint8_t>(env.run_id.begin(), env.run_id.end()));
      return absl::OkStatus();
    }
    const std::vector<uint8_t> bytes = store.get(kRunIdKey);
    theirs.assign(bytes.begin(), bytes.end());
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(
        absl::StrCat("rank ", env.rank, " found no run id in ", where,
                     " (rank 0 never recorded one): ", GlooExceptionMessage(e)));
  }
  if (theirs != env.run_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", env.rank, " reached ", where, ", which belongs to another run (run id '", theirs,
        "'; this launch is '", env.run_id,
        "'): two launches use the same port. Leave --master_port at 0 (a free port) or give each "
        "run its own"));
  }
  if (launch.empty()) return absl::OkStatus();
  std::string recorded;
  try {
    // Sets it when no rank of this node has come yet; returns what is there.
    const std::vector<uint8_t> now = store.compareSet(LaunchKey(env.node_rank), {}, launch);
    recorded.assign(now.begin(), now.end());
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("rank ", env.rank, " cannot check its launch in ",
                                               where, ": ", GlooExceptionMessage(e)));
  }
  if (recorded == env.launch_id) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", env.rank, " reached ", where, ", where node ", env.node_rank,
      "'s ranks were started by another launch (", recorded, "; this one is ", env.launch_id,
      ") of the same run id '", env.run_id,
      "': two launches use the same port and run id. This rank leaves that run alone; leave "
      "--master_port at 0 (a free port), or give each launch its own port and run id"));
}

}  // namespace

absl::StatusOr<World> Rendezvous(const DistEnv& env, const RendezvousOptions& options) {
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", env.rank, " is out of range [0, ", env.world_size, ")"));
  }
  if (options.timeout <= std::chrono::milliseconds(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous timeout must be positive; got ", options.timeout.count(), " ms"));
  }
  World world;
  world.rank = env.rank;
  world.size = env.world_size;
  world.local_rank = env.local_rank;
  world.local_world_size = env.local_world_size;
  world.group_options.timeout = options.timeout;
  PP_ASSIGN_OR_RETURN(world.device,
                      DeviceForLocalRank(options.device, env.local_rank, options.ranks_per_device));
  const bool cuda = options.device == DeviceKind::kCuda;
  world.group_options.nccl = cuda && options.ranks_per_device == 1;
  world.group_options.host_staged = cuda && options.ranks_per_device > 1;

  std::string bind = options.bind_address;
  if (bind.empty() && IsLoopbackAddress(env.master_addr)) bind = "127.0.0.1";
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (bind.empty() && (ifname == nullptr || *ifname == '\0')) {
    // This host's name often resolves to 127.0.1.1 or 127.0.0.1 (Debian's
    // /etc/hosts), which Gloo would then advertise to the other hosts; the
    // address that routes to the store's host is one they can reach.
    absl::StatusOr<std::string> local = LocalAddressTowards(env.master_addr);
    if (local.ok()) bind = *local;
  }
  PP_ASSIGN_OR_RETURN(world.group_options.device,
                      MakeGlooDevice(bind, options.transport_thread_nice));

  try {
    if (!options.file_store_path.empty()) {
      world.store = c10::make_intrusive<c10d::FileStore>(options.file_store_path, env.world_size);
    } else {
      c10d::TCPStoreOptions store_options;
      store_options.port = static_cast<std::uint16_t>(env.master_port);
      store_options.isServer = env.rank == 0;
      store_options.numWorkers = env.world_size;
      // The world group's rendezvous below waits for everyone (with the
      // timeout and a clearer error); the store need not.
      store_options.waitWorkers = false;
      store_options.timeout = options.timeout;
      world.store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
    }
    world.store->setTimeout(options.timeout);
  } catch (const std::exception& e) {
    const std::string where =
        options.file_store_path.empty()
            ? absl::StrCat("TCP store at ", env.master_addr, ":", env.master_port,
                           env.rank == 0 ? " (hosted by this rank 0)" : "")
            : absl::StrCat("file store ", options.file_store_path);
    const std::string message = GlooExceptionMessage(e);
    if (LooksLikeTimeout(message)) {
      return absl::DeadlineExceededError(absl::StrCat("rank ", env.rank, " could not reach the ",
                                                      where, " within the timeout: ", message));
    }
    return absl::UnavailableError(
        absl::StrCat("rank ", env.rank, " cannot open the ", where, ": ", message));
  }
  if (!env.run_id.empty()) PP_RETURN_IF_ERROR(CheckRunId(*world.store, env));
  PP_ASSIGN_OR_RETURN(world.group, NewGlooGroup(world.store, "pp/world", env.rank, env.world_size,
                                                world.group_options));
  return world;
}

absl::StatusOr<World> RendezvousFromEnv(const RendezvousOptions& options) {
  PP_ASSIGN_OR_RETURN(DistEnv env, DistEnvFromEnvironment());
  return Rendezvous(env, options);
}

absl::StatusOr<std::string> LocalAddressTowards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  std::string last_error;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    // A UDP connect sends nothing: it only asks the kernel for a route.
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    ::close(fd);
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw =
        local.ss_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&local)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr);
    if (::inet_ntop(local.ss_family, raw, text, sizeof(text)) != nullptr) return std::string(text);
  }
  return absl::UnavailableError(
      absl::StrCat("no route from this host to '", host, "': ", last_error));
}

absl::StatusOr<int> PickFreePort(const std::string& address) {
  PP_ASSIGN_OR_RETURN(const ReservedPort reserved, ReservedPort::OnFreePort(address));
  return reserved.port();
}

}  // namespace pp
