#include "driver/progress.h"

#include <cstdlib>
#include <iostream>

#include "absl/strings/str_format.h"

namespace pp {
namespace {

std::string HumanCount(double x) {
  return x >= 1e6   ? absl::StrFormat("%.2fM", x / 1e6)
         : x >= 1e3 ? absl::StrFormat("%.1fk", x / 1e3)
                    : absl::StrFormat("%.0f", x);
}

}  // namespace

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

Progress::Progress(int64_t total, int64_t log_interval)
    : total_(total), log_interval_(log_interval) {
  if (std::getenv("PP_PROGRESS_TTY") != nullptr) tty_ = std::fopen("/dev/tty", "w");
  start_ = std::chrono::steady_clock::now();
}
Progress::~Progress() {
  if (tty_ != nullptr) std::fclose(tty_);
}

void Progress::Update(int64_t step, double loss, double tokens_per_s,
                      std::optional<double> eval_loss) {
  const double elapsed = Elapsed();
  const double eta =
      elapsed / static_cast<double>(step + 1) * static_cast<double>(total_ - step - 1);
  const std::string stats =
      absl::StrFormat("step %d/%d  loss %.4f  %s tok/s  ETA %s", step + 1, total_, loss,
                      HumanCount(tokens_per_s), FormatDuration(eta));
  if (tty_ != nullptr) {
    constexpr int kBar = 28;
    const int filled = static_cast<int>(kBar * (step + 1) / total_);
    std::fprintf(tty_, "\r[%s%s] %s   ", std::string(filled, '#').c_str(),
                 std::string(kBar - filled, '.').c_str(), stats.c_str());
    if (eval_loss.has_value()) {
      std::fprintf(
          tty_, "%s",
          absl::StrFormat("\n  eval loss %.4f at step %d\n", *eval_loss, step + 1).c_str());
    }
    std::fflush(tty_);
    return;
  }
  if (Logs(step) || eval_loss.has_value()) {
    std::cout << stats
              << (eval_loss.has_value() ? absl::StrFormat("  eval loss %.4f", *eval_loss) : "")
              << std::endl;
  }
}
bool Progress::Logs(int64_t step) const {
  return (step + 1) % log_interval_ == 0 || step == 0 || step + 1 == total_;
}
void Progress::Finish() {
  if (tty_ != nullptr) {
    std::fprintf(tty_, "\n");
    std::fflush(tty_);
  }
}
double Progress::Elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

}  // namespace pp
