// Rank 0's view of a run's progress: a bar redrawn in place on the terminal,
// or a plain line every `log_interval` steps.
#ifndef DRIVER_PROGRESS_H_
#define DRIVER_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace pp {

// "42s", "3m07s", "1h05m".
std::string FormatDuration(double seconds);

// The launcher forwards workers' output line by line, so the bar goes straight
// to the controlling terminal (/dev/tty, when PP_PROGRESS_TTY is set).
class Progress {
 public:
  Progress(int64_t total, int64_t log_interval);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Update(int64_t step, double loss, double tokens_per_s, std::optional<double> eval_loss);
  void Finish();
  double Elapsed() const;
  // Whether `step` (0-based) prints a line (an evaluated step does too).
  bool Logs(int64_t step) const;

 private:
  int64_t total_;
  int64_t log_interval_;
  std::FILE* tty_ = nullptr;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace pp

#endif  // DRIVER_PROGRESS_H_
