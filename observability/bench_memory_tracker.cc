// What the tracking allocator costs: allocate + free through LibTorch's default
// CPU allocator, directly and behind a TrackingAllocator, for several sizes and
// thread counts. Prints a table and one JSON line.
//
//   ./bazelw run -c opt //observability:bench_memory_tracker -- --iterations=200000
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <c10/core/CPUAllocator.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "observability/memory_tracker.h"

ABSL_FLAG(int, iterations, 200000, "allocate+free pairs per thread and measurement");
ABSL_FLAG(int, repeats, 5, "measurements per case; the median is reported");

namespace pp {
namespace {

// Median nanoseconds per allocate+free pair over `threads` threads.
double NanosPerPair(c10::Allocator* allocator, size_t bytes, int threads) {
  const int iterations = absl::GetFlag(FLAGS_iterations);
  std::vector<double> runs;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        for (int i = 0; i < iterations; ++i) {
          c10::DataPtr p = allocator->allocate(bytes);
          // Touch the block so the compiler cannot drop the pair.
          static_cast<volatile char*>(p.get())[0] = 1;
        }
      });
    }
    for (std::thread& w : workers) w.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    runs.push_back(seconds * 1e9 / iterations);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

void Run() {
  c10::Allocator* plain = c10::GetDefaultCPUAllocator();
  TrackingAllocator tracking(plain);
  std::printf("%10s %8s %14s %14s %10s\n", "bytes", "threads", "plain ns/pair", "tracked ns/pair",
              "overhead");
  std::string json = "{\"bench\":\"memory_tracker\",\"cases\":[";
  bool first = true;
  for (size_t bytes : {size_t{64}, size_t{4096}, size_t{1} << 20}) {
    for (int threads : {1, 2}) {
      const double base = NanosPerPair(plain, bytes, threads);
      const double tracked = NanosPerPair(&tracking, bytes, threads);
      std::printf("%10zu %8d %14.1f %14.1f %9.1f%%\n", bytes, threads, base, tracked,
                  100.0 * (tracked - base) / base);
      absl::StrAppend(&json, first ? "" : ",", "{\"bytes\":", bytes, ",\"threads\":", threads,
                      ",\"plain_ns\":", base, ",\"tracked_ns\":", tracked, "}");
      first = false;
    }
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
}

}  // namespace
}  // namespace pp

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  pp::Run();
  return 0;
}
