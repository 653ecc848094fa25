// What the bench_* mains share: the --threads flag and its setup, timing (wall
// and thread CPU) and summary statistics, and turning a run's Status into an
// exit code. The peer GPT they train is bench/peer_gpt.h's.
#ifndef BENCH_BENCH_COMMON_H_
#define BENCH_BENCH_COMMON_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"

ABSL_DECLARE_FLAG(int, threads);

namespace pp {

using BenchClock = std::chrono::steady_clock;

// Sets LibTorch's intra-op threads to --threads, or to `default_threads`
// when the flag is 0 (default_threads 0: LibTorch's own default). Returns the
// count in effect.
int SetBenchThreads(int default_threads);

double Seconds(BenchClock::time_point a, BenchClock::time_point b);

// This thread's CPU time in seconds (CLOCK_THREAD_CPUTIME_ID): with one
// intra-op and one BLAS thread, the kernels' cost even on a loaded machine.
double ThreadCpuSeconds();

// Upper median (v[n/2] after sorting); 0 for an empty list. Same for the rest.
double Median(std::vector<double> v);
double Min(const std::vector<double>& v);
double Mean(const std::vector<double>& v);

// 0 for OK; otherwise prints "<name>: <status>" to stderr and returns 1.
int ExitCode(const std::string& name, const absl::Status& status);

}  // namespace pp

#endif  // BENCH_BENCH_COMMON_H_
