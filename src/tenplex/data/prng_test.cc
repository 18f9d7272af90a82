#include "tenplex/data/prng.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

namespace tenplex::data {
namespace {

TEST(PrngTest, SplitMix64MatchesPublishedValues) {
  // First outputs of SplitMix64 from state 0 (the reference C code by Vigna, as used
  // to seed xoshiro generators).
  SplitMix64 g(0);
  EXPECT_EQ(g.Next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(g.Next(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(g.Next(), 0x06C45D188009454Full);
  static_assert(Mix64(0) == 0);
}

TEST(PrngTest, EpochStatesDiffer) {
  std::set<uint64_t> states;
  for (uint64_t seed : {0ull, 1ull, 42ull, ~0ull}) {
    for (uint64_t e = 0; e < 100; ++e) states.insert(EpochState(seed, e));
  }
  EXPECT_EQ(states.size(), 400u);
}

TEST(PrngTest, BelowIsInRangeAndUniform) {
  SplitMix64 g(7);
  constexpr int kBins = 10, kDraws = 200000;
  std::vector<int> count(kBins);
  for (int i = 0; i < kDraws; ++i) {
    uint64_t v = g.Below(kBins);
    ASSERT_LT(v, uint64_t{kBins});
    ++count[v];
  }
  double chi2 = 0, expect = double(kDraws) / kBins;
  for (int c : count) chi2 += (c - expect) * (c - expect) / expect;
  EXPECT_LT(chi2, 27.9);  // 9 degrees of freedom, p = 0.001
  EXPECT_EQ(g.Below(1), 0u);
}

TEST(PrngTest, BelowRejectsOnHugeBounds) {
  // n = 2^63 + 1: almost half of all draws are rejected; results stay in range and the
  // upper half is reached.
  const uint64_t n = (uint64_t{1} << 63) + 1;
  SplitMix64 g(3);
  bool high = false;
  for (int i = 0; i < 1000; ++i) {
    uint64_t v = g.Below(n);
    ASSERT_LT(v, n);
    high |= v >= (uint64_t{1} << 62);
  }
  EXPECT_TRUE(high);
}

std::vector<uint64_t> ToVector(const Permutation& p) {
  std::vector<uint64_t> v(p.size());
  for (uint64_t i = 0; i < p.size(); ++i) v[i] = p[i];
  return v;
}

TEST(PrngTest, PermutationIsAPermutationAndDeterministic) {
  for (uint64_t n : {1ull, 2ull, 3ull, 10ull, 1000ull, 4097ull}) {
    auto a = ToVector(Permutation::ForEpoch(n, 5, 2));
    auto sorted = a;
    std::sort(sorted.begin(), sorted.end());
    std::vector<uint64_t> iota(n);
    std::iota(iota.begin(), iota.end(), 0);
    EXPECT_EQ(sorted, iota) << n;
    EXPECT_EQ(a, ToVector(Permutation::ForEpoch(n, 5, 2)));
    if (n >= 10) {
      EXPECT_NE(a, ToVector(Permutation::ForEpoch(n, 5, 3)));
      EXPECT_NE(a, ToVector(Permutation::ForEpoch(n, 6, 2)));
    }
  }
}

TEST(PrngTest, PermutationMatchesDefinitionStepByStep) {
  // The header's definition, spelled out with the public generator: start with the
  // identity and swap a[i] with a[Below(i + 1)] for i = n-1 .. 1.
  const uint64_t n = 50, seed = 123456789, epoch = 4;
  SplitMix64 g(Mix64(Mix64(seed) ^ epoch));
  std::vector<uint64_t> a(n);
  std::iota(a.begin(), a.end(), 0);
  for (uint64_t i = n - 1; i >= 1; --i) std::swap(a[i], a[g.Below(i + 1)]);
  EXPECT_EQ(a, ToVector(Permutation::ForEpoch(n, seed, epoch)));
}

TEST(PrngTest, AllPermutationsOfThreeAreEquallyLikely) {
  std::map<std::vector<uint64_t>, int> seen;
  constexpr int kEpochs = 60000;
  for (int e = 0; e < kEpochs; ++e) ++seen[ToVector(Permutation::ForEpoch(3, 99, e))];
  ASSERT_EQ(seen.size(), 6u);
  double chi2 = 0, expect = kEpochs / 6.0;
  for (auto& [p, c] : seen) chi2 += (c - expect) * (c - expect) / expect;
  EXPECT_LT(chi2, 20.5);  // 5 degrees of freedom, p = 0.001
}

}  // namespace
}  // namespace tenplex::data
