#include "tools/progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace qkv::tool {

Progress::Progress(std::string what, std::int64_t total)
    : what_(std::move(what)), total_(total), enabled_(total > 0 && ::isatty(STDERR_FILENO) == 1 && !std::getenv("QKV_NO_PROGRESS")) {
  if (const char* delay = std::getenv("QKV_PROGRESS_DELAY_MS")) delay_ = std::chrono::milliseconds(std::atoi(delay));
}

Progress::~Progress() { clear(); }

void Progress::update(std::int64_t done) {
  if (!enabled_) return;
  const Clock::time_point now = Clock::now();
  if (now - start_ < delay_ || now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  const double s = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "\r\033[K%s %lld/%lld (%.0f s)", what_.c_str(), static_cast<long long>(done), static_cast<long long>(total_), s);
  std::fflush(stderr);
  shown_ = true;
}

void Progress::clear() {
  if (!shown_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  shown_ = false;
}

}  // namespace qkv::tool
