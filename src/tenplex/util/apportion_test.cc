// Apportion against a brute-force reference that hands out units one at a time by
// exact rational comparison of remainders, and the examples of spec §9.
#include "tenplex/util/apportion.h"

#include <gtest/gtest.h>

#include <random>

namespace tenplex {
namespace {

// Reference: floors, then the leftover units one by one to the rank with the largest
// remainder not yet served (lowest rank on ties), searched linearly each time.
std::vector<int64_t> Brute(int64_t U, const std::vector<int>& w) {
  int64_t W = 0;
  for (int x : w) W += x;
  std::vector<int64_t> n(w.size());
  std::vector<bool> served(w.size(), false);
  int64_t left = U;
  for (std::size_t i = 0; i < w.size(); ++i) {
    n[i] = U * w[i] / W;
    left -= n[i];
  }
  while (left-- > 0) {
    int best = -1;
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (served[i]) continue;
      if (best < 0 || (U * w[i]) % W > (U * w[best]) % W) best = static_cast<int>(i);
    }
    served[best] = true;
    ++n[best];
  }
  return n;
}

TEST(ApportionTest, SpecExamples) {
  EXPECT_EQ(Apportion(10, {2, 1, 1}), (std::vector<int64_t>{5, 3, 2}));
  EXPECT_EQ(Apportion(8, {3, 1}), (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(Apportion(64, {3, 1}), (std::vector<int64_t>{48, 16}));
  EXPECT_EQ(Apportion(8, {1, 1, 1}), (std::vector<int64_t>{3, 3, 2}));
  EXPECT_EQ(Apportion(8, {6, 2}), Apportion(8, {3, 1}));
  EXPECT_EQ(ApportionRange(10, {2, 1, 1}, 1).begin, 5);
  EXPECT_EQ(ApportionRange(10, {2, 1, 1}, 1).end, 8);
  EXPECT_EQ(JoinWeights({3, 1}), "3+1");
}

TEST(ApportionTest, MatchesBruteForceAndEvenSplit) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 20000; ++iter) {
    const int n = 1 + static_cast<int>(rng() % 6);
    std::vector<int> w(n);
    for (int& x : w) x = 1 + static_cast<int>(rng() % 7);
    const int64_t U = static_cast<int64_t>(rng() % 50);
    const std::vector<int64_t> got = Apportion(U, w);
    ASSERT_EQ(got, Brute(U, w)) << U;
    int64_t sum = 0;
    for (int64_t x : got) sum += x;
    EXPECT_EQ(sum, U);
    // Equal weights: the v1 rule, the first U mod n ranks one more.
    std::vector<int> eq(n, w[0]);
    const std::vector<int64_t> e = Apportion(U, eq);
    for (int i = 0; i < n; ++i) EXPECT_EQ(e[i], U / n + (i < U % n ? 1 : 0));
  }
  // Huge unit counts stay exact.
  const int64_t big = int64_t{1} << 62;
  auto g = Apportion(big, {1000000, 1, 3});
  EXPECT_EQ(g[0] + g[1] + g[2], big);
}

}  // namespace
}  // namespace tenplex
