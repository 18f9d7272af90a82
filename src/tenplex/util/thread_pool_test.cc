#include "tenplex/util/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <vector>

namespace tenplex {
namespace {

TEST(ThreadPoolTest, RunsEveryIndexOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  pool.ParallelFor(hits.size(), [&](std::size_t i) { hits[i]++; });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPoolTest, NestedCallsFromSeveralThreads) {
  ThreadPool pool(2);
  std::atomic<int> sum{0};
  pool.ParallelFor(4, [&](std::size_t) {
    ThreadPool::Default().ParallelFor(10, [&](std::size_t j) { sum += static_cast<int>(j); });
  });
  EXPECT_EQ(sum.load(), 4 * 45);
}

}  // namespace
}  // namespace tenplex

namespace tenplex {
namespace {

// Every index once, and at most max_threads calls in flight, all of them at once when
// they block (the calls wait until max_threads are in, so a sequential run would hang).
TEST(ForEachConcurrentlyTest, RunsEveryIndexOnceWithBoundedConcurrency) {
  constexpr std::size_t kN = 100, kMax = 8;
  std::vector<std::atomic<int>> seen(kN);
  std::mutex mu;
  std::condition_variable cv;
  std::size_t in_flight = 0, peak = 0, arrived = 0;
  ForEachConcurrently(kN, kMax, [&](std::size_t i) {
    std::unique_lock<std::mutex> lock(mu);
    ++in_flight;
    peak = std::max(peak, in_flight);
    if (++arrived <= kMax) {  // the first kMax calls meet: proof they ran at once
      cv.notify_all();
      cv.wait(lock, [&] { return arrived >= kMax; });
    }
    --in_flight;
    lock.unlock();
    ++seen[i];
  });
  for (std::size_t i = 0; i < kN; ++i) EXPECT_EQ(seen[i].load(), 1) << i;
  EXPECT_EQ(peak, kMax);
  std::size_t calls = 0;
  ForEachConcurrently(0, kMax, [&](std::size_t) { ++calls; });
  ForEachConcurrently(3, 0, [&](std::size_t) { ++calls; });  // 0 threads: still runs, inline
  EXPECT_EQ(calls, 3u);
}

}  // namespace
}  // namespace tenplex
