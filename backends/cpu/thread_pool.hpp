// The CPU backend's threads: one pool owns all parallelism (OpenBLAS is pinned to one thread, so
// its threads and ours never compete for the cores).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qkv::backend::cpu {

class ThreadPool {
 public:
  /// `threads` workers in all, the calling thread included (QKV_NUM_THREADS, else the cores).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  /// Calls fn(i) for i in [0, n), spread over the pool; returns when all calls have returned.
  /// Runs inline when n == 1, the pool has one thread, or the caller is itself one of a
  /// parallel_for's tasks (nested calls run on the task's thread). Not for two threads outside
  /// the pool at once.
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& fn);

  /// The process-wide pool.
  static ThreadPool& global();

 private:
  void work();
  void run_tasks();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(std::int64_t)>* fn_ = nullptr;
  std::int64_t n_ = 0, next_ = 0, finished_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace qkv::backend::cpu
