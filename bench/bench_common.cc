#include "bench/bench_common.h"

#include <time.h>

#include <algorithm>
#include <cstdio>

#include <ATen/Parallel.h>

#include "absl/flags/flag.h"

ABSL_FLAG(int, threads, 0,
          "LibTorch intra-op threads (0: the benchmark's default, see its --help text)");

namespace pp {

int SetBenchThreads(int default_threads) {
  const int threads =
      absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : default_threads;
  if (threads > 0) at::set_num_threads(threads);
  return at::get_num_threads();
}

double Seconds(BenchClock::time_point a, BenchClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Min(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
}

int ExitCode(const std::string& name, const absl::Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "%s: %s\n", name.c_str(), status.ToString().c_str());
  return 1;
}

}  // namespace pp
