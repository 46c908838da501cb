// A small fork-join pool: tasks are claimed one index at a time under a mutex (tasks here are
// whole attention blocks or matrix products, so claiming is never the bottleneck).
#include "backends/cpu/thread_pool.hpp"

#include <cblas.h>

#include <cstdlib>
#include <utility>

namespace qkv::backend::cpu {

namespace {
/// Whether this thread is running one of a parallel_for's tasks (a kernel that spreads its own
/// work, such as an elementwise op's chunks, may be called from another kernel's task).
thread_local bool in_task = false;
}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    openblas_set_num_threads(1);  // our pool owns the cores; see thread_pool.hpp
    int n = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("QKV_NUM_THREADS")) n = std::atoi(env);
    return n < 1 ? 1 : n;
  }());
  return pool;
}

void ThreadPool::run_tasks() {
  std::unique_lock lock(mutex_);
  while (next_ < n_) {
    std::int64_t i = next_++;
    lock.unlock();
    {
      struct InTask {  // restored even when the task throws
        bool was = std::exchange(in_task, true);
        ~InTask() { in_task = was; }
      } scope;
      (*fn_)(i);
    }
    lock.lock();
    if (++finished_ == n_) done_.notify_all();
  }
}

void ThreadPool::work() {
  std::uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_tasks();
  }
}

void ThreadPool::parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1 || workers_.empty() || in_task) {  // nested in a task: its thread runs them all
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    finished_ = 0;
    ++generation_;
  }
  wake_.notify_all();
  run_tasks();
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return finished_ == n_; });
  fn_ = nullptr;
  n_ = 0;
}

}  // namespace qkv::backend::cpu
