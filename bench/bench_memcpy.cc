// Memory bandwidth of one core: large buffer copies (memcpy), GB/s.
//
//   bazel-bin/bench/bench_memcpy --bytes=268435456 --seconds=2
//
// Run alone, then as two processes at once (bench/bench_limits.py does
// both, with --start_at so that both copy in the same window): the ratio says
// how much of one core's memory bandwidth the other core's traffic takes away,
// the physical limit under two pipeline ranks that each stream activations and
// weights through a shared memory system. The buffer should be well above the
// last-level cache (32 MiB on the project machine's 2 cores) to measure DRAM;
// a small one measures a core's own caches.
//
// Prints one JSON line: bytes, copies, and per-copy GB/s (bytes copied per
// second; the memory traffic is twice that, read + write) as median, best,
// worst.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int64_t, bytes, int64_t{256} << 20,
          "Size of each of the two buffers copied between (default 256 MiB, well above the "
          "last-level cache). Must be >= 4096.");
ABSL_FLAG(double, seconds, 2.0, "How long to keep copying, after --min_copies (> 0).");
ABSL_FLAG(int, min_copies, 3, "At least this many timed copies (>= 1).");
ABSL_FLAG(double, start_at, 0,
          "Unix time (seconds) to start copying at, after the buffers are made and touched, so "
          "that processes started together copy in the same window; 0: at once. At most 60 s "
          "ahead.");

namespace pp {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

absl::Status Run() {
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const int min_copies = absl::GetFlag(FLAGS_min_copies);
  const double start_at = absl::GetFlag(FLAGS_start_at);
  if (bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat("--bytes=", bytes, " must be >= 4096"));
  }
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    return absl::InvalidArgumentError(absl::StrCat("--seconds=", seconds, " must be > 0"));
  }
  if (min_copies < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--min_copies=", min_copies, " must be >= 1"));
  }
  const auto now_unix = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  if (start_at != 0 && !(start_at > now_unix() - 60 && start_at < now_unix() + 60)) {
    return absl::InvalidArgumentError(absl::StrCat("--start_at=", start_at,
                                                   " must be 0 or a Unix time within 60 s of now (",
                                                   now_unix(), ")"));
  }
  const size_t n = static_cast<size_t>(bytes);
  std::unique_ptr<char[]> a(new char[n]);
  std::unique_ptr<char[]> b(new char[n]);
  // Touch every page of both buffers before timing (first-touch faults are
  // not bandwidth) and give the source distinct bytes.
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<char>(i * 131u);
  std::memset(b.get(), 0, n);

  if (start_at != 0) {
    const double wait = start_at - now_unix();
    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
  std::vector<double> gb_per_s;
  uint64_t check = 0;
  const Clock::time_point begin = Clock::now();
  for (int k = 0;
       static_cast<int>(gb_per_s.size()) < min_copies || Seconds(begin, Clock::now()) < seconds;
       ++k) {
    // Alternate directions so that every copy reads what the last one wrote.
    char* dst = k % 2 == 0 ? b.get() : a.get();
    const char* src = k % 2 == 0 ? a.get() : b.get();
    const Clock::time_point t0 = Clock::now();
    std::memcpy(dst, src, n);
    const double s = Seconds(t0, Clock::now());
    // Read something back so that the copy is not optimised away.
    check += static_cast<unsigned char>(dst[(k * 4099) % n]);
    gb_per_s.push_back(static_cast<double>(n) / s * 1e-9);
  }
  const double total = Seconds(begin, Clock::now());
  std::sort(gb_per_s.begin(), gb_per_s.end());  // upper median below
  nlohmann::json out = {
      {"bench", "memcpy"},
      {"bytes", bytes},
      {"copies", gb_per_s.size()},
      {"seconds", total},
      {"gb_per_s", gb_per_s[gb_per_s.size() / 2]},
      {"gb_per_s_best", gb_per_s.back()},
      {"gb_per_s_worst", gb_per_s.front()},
      {"check", check},
  };
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = pp::Run();
  if (status.ok()) return 0;
  std::fprintf(stderr, "bench_memcpy: %s\n", status.ToString().c_str());
  return 1;
}
