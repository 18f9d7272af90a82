#include "tenplex/util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
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
