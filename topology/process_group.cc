#include "topology/process_group.h"

#include <chrono>
#include <cstdlib>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/torch_compat.h"
#include "glog/logging.h"
#include "topology/host_staged_backend.h"
#include "topology/transport_thread.h"

namespace pp {
bool LooksLikeTimeout(const std::string& message) {
  const std::string lower = absl::AsciiStrToLower(message);
  return absl::StrContains(lower, "timeout") || absl::StrContains(lower, "timed out");
}

std::string GlooExceptionMessage(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

namespace {

absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> CreateGlooDevice(
    const std::string& hostname) {
  try {
    if (!hostname.empty()) return c10d::ProcessGroupGloo::createDeviceForHostname(hostname);
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    if (ifname != nullptr && *ifname != '\0') {
      return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    }
    return c10d::ProcessGroupGloo::createDefaultDevice();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot create a Gloo device for host '",
                                               hostname.empty() ? "(this host)" : hostname,
                                               "': ", GlooExceptionMessage(e)));
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> MakeGlooDevice(
    const std::string& hostname, int transport_thread_nice) {
  PP_RETURN_IF_ERROR(CheckTransportThreadNice(transport_thread_nice));
  if (transport_thread_nice == 0) return CreateGlooDevice(hostname);
  const std::vector<pid_t> before = ThreadIdsOfThisProcess();
  PP_ASSIGN_OR_RETURN(std::shared_ptr<::gloo::transport::Device> device,
                      CreateGlooDevice(hostname));
  PP_ASSIGN_OR_RETURN(int changed, NiceNewEpollThreads(before, transport_thread_nice,
                                                       std::chrono::milliseconds(500)));
  if (changed == 0) {
    LOG(WARNING) << "parallelism.transport_thread_nice = " << transport_thread_nice
                 << ": Gloo's transport thread was not found waiting in epoll within 500 ms; "
                    "it keeps the worker's priority";
  }
  return device;
}

absl::Status StoreBarrier(c10d::Store& store, const std::string& key, int size,
                          std::chrono::milliseconds timeout, const std::string& what) {
  const std::string done_key = key + "/all";
  int64_t arrived = 0;
  try {
    arrived = store.add(key + "/arrived", 1);
    // The last to arrive opens the barrier for everyone.
    if (arrived >= size) store.set(done_key, std::vector<uint8_t>{1});
    store.wait({done_key}, timeout);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    int64_t seen = arrived;
    try {
      seen = store.add(key + "/arrived", 0);
    } catch (const std::exception&) {
      // The count is only for the message.
    }
    return absl::DeadlineExceededError(absl::StrCat(
        what, ": ", seen, " of ", size, " arrived at barrier '", key, "' within ",
        std::chrono::duration<double>(timeout).count(),
        " s: ", GlooExceptionMessage(e).substr(0, GlooExceptionMessage(e).find('\n'))));
  }
}

absl::StatusOr<ProcessGroupPtr> NewGlooGroup(const StorePtr& store, const std::string& prefix,
                                             int rank, int size, const GroupOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("group '", prefix, "': rank ", rank, " is out of range [0, ", size, ")"));
  }
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  if (options.device != nullptr) {
    gloo_options->devices.push_back(options.device);
  } else {
    auto device = MakeGlooDevice("127.0.0.1");
    if (!device.ok()) return device.status();
    gloo_options->devices.push_back(*std::move(device));
  }
  // Gloo's default of two worker threads per group is enough: pipe issues one
  // collective per group at a time.
  gloo_options->threads = 2;
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    // The constructor meets the other members through the store and throws
    // when they do not all arrive within the timeout.
    ProcessGroupPtr group = torch_compat::NewGlooProcessGroup(prefixed, rank, size, gloo_options);
    if (options.host_staged) {
      absl::Status added = AddHostStagedBackend(group, c10::DeviceType::CUDA);
      if (!added.ok()) {
        return absl::Status(added.code(), absl::StrCat("group '", prefix, "' (rank ", rank, " of ",
                                                       size, "): ", added.message()));
      }
    } else if (options.nccl) {
      try {
        torch_compat::AddNcclBackend(
            group, c10::make_intrusive<c10d::PrefixStore>(prefix + "/nccl", store), rank, size,
            options.timeout);
      } catch (const std::exception& e) {
        return absl::FailedPreconditionError(
            absl::StrCat("group '", prefix, "' (rank ", rank, " of ", size,
                         "): cannot add NCCL: ", GlooExceptionMessage(e)));
      }
    }
    PP_RETURN_IF_ERROR(StoreBarrier(
        *store, prefix + "/connected", size, options.timeout,
        absl::StrCat("group '", prefix, "' (rank ", rank, " of ", size, ") after connecting")));
    return group;
  } catch (const std::exception& e) {
    const std::string what = absl::StrCat("group '", prefix, "' (rank ", rank, " of ", size, ")");
    const std::string message = GlooExceptionMessage(e);
    if (LooksLikeTimeout(message)) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": not every member arrived within ",
                       std::chrono::duration<double>(options.timeout).count(),
                       " s: ", message.substr(0, message.find('\n'))));
    }
    return absl::UnavailableError(absl::StrCat(what, ": cannot connect: ", message));
  }
}

}  // namespace pp
