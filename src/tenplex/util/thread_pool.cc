#include "tenplex/util/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <memory>

namespace tenplex {

ThreadPool::ThreadPool(std::size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (std::size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { Loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

void ThreadPool::ParallelFor(std::size_t n, const std::function<void(std::size_t)>& fn) {
  if (n == 0) return;
  if (n == 1) {
    fn(0);
    return;
  }
  // Work is claimed through a shared counter, so the caller helps and no chunk waits
  // for a busy worker.
  struct State {
    std::atomic<std::size_t> next{0};
    std::atomic<std::size_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  auto state = std::make_shared<State>();
  auto run = [state, n, &fn] {
    for (;;) {
      std::size_t i = state->next.fetch_add(1);
      if (i >= n) return;
      fn(i);
      if (state->done.fetch_add(1) + 1 == n) {
        std::lock_guard<std::mutex> lock(state->mu);
        state->cv.notify_all();
      }
    }
  };
  std::size_t helpers = std::min(n - 1, workers_.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < helpers; ++i) queue_.emplace_back(run);
  }
  cv_.notify_all();
  run();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done.load() == n; });
}

void ForEachConcurrently(std::size_t n, std::size_t max_threads,
                         const std::function<void(std::size_t, std::size_t)>& fn) {
  std::atomic<std::size_t> next{0};
  auto run = [&](std::size_t worker) {
    for (std::size_t i = next++; i < n; i = next++) fn(worker, i);
  };
  const std::size_t threads = std::min(n, std::max<std::size_t>(1, max_threads));
  std::vector<std::thread> helpers;
  for (std::size_t t = 1; t < threads; ++t) helpers.emplace_back(run, t);
  run(0);
  for (std::thread& t : helpers) t.join();
}

void ForEachConcurrently(std::size_t n, std::size_t max_threads,
                         const std::function<void(std::size_t)>& fn) {
  ForEachConcurrently(n, max_threads, [&](std::size_t, std::size_t i) { fn(i); });
}

int HardwareThreads() {
  return static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
}

int ThreadsFor(std::size_t items) { return items < (std::size_t{1} << 16) ? 1 : HardwareThreads(); }

ThreadPool& ThreadPool::Default() {
  static ThreadPool* pool = new ThreadPool(0);
  return *pool;
}

}  // namespace tenplex
