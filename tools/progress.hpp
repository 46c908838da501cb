// A progress line for the commands that can run for more than a couple of seconds.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace qkv::tool {

/// "WHAT DONE/TOTAL (S s)" on stderr, rewritten in place (a carriage return) at most ten times a
/// second once the work has taken a second (QKV_PROGRESS_DELAY_MS changes that), and erased when the work is done or the Progress
/// goes out of scope, so that it never mixes with what the command prints. Nothing at all when
/// stderr is not a terminal (a pipe, a file, CI's log), QKV_NO_PROGRESS is set, or `total` is 0.
class Progress {
 public:
  Progress(std::string what, std::int64_t total);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// `done` of the total finished.
  void update(std::int64_t done);
  /// Erases the line (before the command prints a result).
  void clear();

 private:
  using Clock = std::chrono::steady_clock;
  std::string what_;
  std::int64_t total_;
  bool enabled_;
  bool shown_ = false;
  Clock::time_point start_ = Clock::now(), last_{};
  Clock::duration delay_ = std::chrono::seconds(1);
};

}  // namespace qkv::tool
