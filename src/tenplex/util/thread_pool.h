// A fixed pool of worker threads with a blocking parallel-for. Copies of large boxes
// are split into a few chunks and run on the pool; small copies run inline.
//
// Thread-safety: ParallelFor may be called from several threads at once; each call
// blocks until all of its chunks are done.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "tenplex/util/status.h"

namespace tenplex {

// The first error of parallel work: workers Set what they got and stop at their next
// chunk once failed() says so; Get returns the first non-ok status (ok if none).
class FirstError {
 public:
  void Set(const Status& s) {
    if (s.ok()) return;
    std::lock_guard<std::mutex> l(mu_);
    if (status_.ok()) status_ = s;
    failed_ = true;
  }
  bool failed() const { return failed_.load(); }
  Status Get() {
    std::lock_guard<std::mutex> l(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  Status status_;
  std::atomic<bool> failed_{false};
};

class ThreadPool {
 public:
  // threads == 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(std::size_t threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  std::size_t size() const { return workers_.size(); }

  // Runs fn(i) for i in [0, n), using the pool and the calling thread; returns when
  // all are done.
  void ParallelFor(std::size_t n, const std::function<void(std::size_t)>& fn);

  // A process-wide pool sized to the machine.
  static ThreadPool& Default();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Runs fn(i) for i in [0, n) on up to max_threads threads of its own at once (started
// for this call, the calling thread among them) and returns when every call returned.
// For blocking calls (one request to one host each), not for computation: a control
// phase asks thousands of hosts at once this way instead of one after the other.
void ForEachConcurrently(std::size_t n, std::size_t max_threads,
                         const std::function<void(std::size_t)>& fn);
// The same with fn(worker, i), worker in [0, threads) naming the thread (the caller is 0),
// for computation that keeps per-thread state (the planner's tensors, planner.h).
void ForEachConcurrently(std::size_t n, std::size_t max_threads,
                         const std::function<void(std::size_t, std::size_t)>& fn);

// This machine's hardware threads (at least 1).
int HardwareThreads();
// How many threads computation over `items` items uses by default (MakePlan's needs,
// HostPlanParts' ops): every hardware thread from 65,536 items up, one below, where
// starting threads would cost more than they save.
int ThreadsFor(std::size_t items);

// How many control requests a coordinator has in flight at once (ForEachConcurrently).
inline constexpr std::size_t kControlConcurrency = 64;

}  // namespace tenplex
