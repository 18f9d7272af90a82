#include "tenplex/data/order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace tenplex::data {
namespace {

// The global sequence of steps [0, steps) straight from the definition: step g is
// batch g mod K of epoch g / K of the Fisher-Yates permutations.
std::vector<uint64_t> Reference(uint64_t n, uint64_t seed, uint64_t b, uint64_t steps) {
  const uint64_t k = n / b;
  std::vector<uint64_t> out;
  for (uint64_t g = 0; g < steps; ++g) {
    Permutation p = Permutation::ForEpoch(n, seed, g / k);
    for (uint64_t i = 0; i < b; ++i) out.push_back(p[(g % k) * b + i]);
  }
  return out;
}

TEST(OrderTest, RankSlicesAreBalancedContiguousAndCover) {
  for (uint64_t b = 1; b <= 40; ++b) {
    for (uint64_t dp = 1; dp <= b && dp <= 12; ++dp) {
      uint64_t next = 0, lo = b, hi = 0;
      for (uint64_t r = 0; r < dp; ++r) {
        auto s = RankSlice(b, dp, r);
        ASSERT_TRUE(s.ok());
        EXPECT_EQ(s->begin, next);
        next = s->end;
        lo = std::min(lo, s->size());
        hi = std::max(hi, s->size());
      }
      EXPECT_EQ(next, b);
      EXPECT_LE(hi - lo, 1u) << b << " " << dp;
      EXPECT_GE(lo, 1u);
    }
  }
  EXPECT_EQ(RankSlice(10, 4, 0)->size(), 3u);  // 3 3 2 2
  EXPECT_EQ(RankSlice(10, 4, 3)->begin, 8u);
}

// Spec §9 dp weights: slices are contiguous, cover the batch in rank order, and their
// sizes are the largest-remainder apportionment, checked by its defining properties:
// each n_j is floor(B w_j / W) or one more, and every rank given one more has a larger
// remainder (B w_j mod W) than every rank not given one, or an equal one and a lower rank.
TEST(OrderTest, WeightedRankSlicesAreTheLargestRemainderApportionment) {
  std::mt19937 rng(3);
  for (int iter = 0; iter < 3000; ++iter) {
    const uint64_t dp = 1 + rng() % 6, b = dp + rng() % 40;
    std::vector<int> w(dp);
    for (int& x : w) x = 1 + static_cast<int>(rng() % 5);
    uint64_t W = 0;
    for (int x : w) W += x;
    std::vector<uint64_t> n(dp);
    uint64_t next = 0;
    bool zero = false;
    for (uint64_t r = 0; r < dp; ++r) zero |= b * w[r] / W == 0 && b * w[r] % W == 0;
    for (uint64_t r = 0; r < dp; ++r) {
      auto s = WeightedRankSlice(b, dp, w, r);
      if (!s.ok()) {
        zero = true;
        EXPECT_NE(s.status().message().find("no samples"), std::string::npos);
        break;
      }
      EXPECT_EQ(s->begin, next);
      next = s->end;
      n[r] = s->size();
    }
    if (zero) continue;
    EXPECT_EQ(next, b);
    std::vector<bool> extra(dp);
    for (uint64_t j = 0; j < dp; ++j) {
      const uint64_t fl = b * w[j] / W;
      ASSERT_TRUE(n[j] == fl || n[j] == fl + 1) << b << " rank " << j;
      extra[j] = n[j] == fl + 1;
    }
    for (uint64_t j = 0; j < dp; ++j) {
      for (uint64_t k = 0; k < dp; ++k) {
        if (!extra[j] || extra[k]) continue;
        const uint64_t rj = b * w[j] % W, rk = b * w[k] % W;
        EXPECT_TRUE(rj > rk || (rj == rk && j < k)) << b << " ranks " << j << " " << k;
      }
    }
    // Equal weights are the v1 rule.
    for (uint64_t r = 0; r < dp; ++r) {
      auto e = WeightedRankSlice(b, dp, std::vector<int>(dp, w[0]), r);
      ASSERT_TRUE(e.ok());
      EXPECT_EQ(e->begin, RankSlice(b, dp, r)->begin);
      EXPECT_EQ(e->end, RankSlice(b, dp, r)->end);
    }
  }
  // The spec's example: B = 10, weights 2+1+1 give 5, 3, 2.
  EXPECT_EQ(WeightedRankSlice(10, 3, {2, 1, 1}, 0)->size(), 5u);
  EXPECT_EQ(WeightedRankSlice(10, 3, {2, 1, 1}, 1)->size(), 3u);
  EXPECT_EQ(WeightedRankSlice(10, 3, {2, 1, 1}, 2)->begin, 8u);
  // 4 samples over 1+1+9: quotas 4/11, 4/11, 36/11; floors 0, 0, 3; the one left goes to
  // rank 0 (remainder 4, tie with rank 1, lower rank), so rank 1 gets none.
  auto bad = WeightedRankSlice(4, 3, {1, 1, 9}, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("dp rank 1 no samples"), std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(WeightedRankSlice(4, 3, {1, 1}, 0).ok());
  EXPECT_FALSE(WeightedRankSlice(4, 2, {1, 1}, 2).ok());
}

TEST(OrderTest, BadSizesAreErrors) {
  EXPECT_EQ(RankSlice(0, 1, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RankSlice(8, 0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RankSlice(8, 2, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RankSlice(4, 5, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(GlobalOrder::Create({10, 0, 0}).ok());
  EXPECT_FALSE(GlobalOrder::Create({10, 0, 11}).ok());
  auto o = GlobalOrder::Create({10, 0, 3});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->Locate(4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(o->Locate(9)->step, 3u);
  EXPECT_EQ(o->Locate(9)->epoch, 1u);  // K = 3
  EXPECT_EQ(o->Locate(9)->batch_in_epoch, 0u);
}

TEST(OrderTest, EveryEpochReadsEachKeptSampleExactlyOnce) {
  for (uint64_t n : {1ull, 7ull, 10ull, 37ull, 100ull}) {
    for (uint64_t b : {1ull, 3ull, 7ull, 10ull}) {
      if (b > n) continue;
      auto o = GlobalOrder::Create({n, 11, b});
      ASSERT_TRUE(o.ok());
      const uint64_t k = o->batches_per_epoch();
      for (uint64_t e = 0; e < 3; ++e) {
        std::vector<uint64_t> ids;
        for (uint64_t j = 0; j < k; ++j) o->AppendBatch(e * k + j, {0, b}, &ids);
        std::set<uint64_t> unique(ids.begin(), ids.end());
        EXPECT_EQ(ids.size(), k * b);
        EXPECT_EQ(unique.size(), ids.size()) << "repeat in epoch " << e;
        EXPECT_TRUE(std::all_of(ids.begin(), ids.end(), [&](uint64_t i) { return i < n; }));
        // The dropped samples are exactly the tail of the epoch's permutation.
        Permutation p = Permutation::ForEpoch(n, 11, e);
        for (uint64_t i = k * b; i < n; ++i) EXPECT_EQ(unique.count(p[i]), 0u);
      }
    }
  }
}

TEST(OrderTest, GlobalSequenceIsTheSameForEveryDp) {
  const uint64_t n = 103, b = 24, seed = 9, steps = 13;  // K = 4: crosses three epochs
  const std::vector<uint64_t> ref = Reference(n, seed, b, steps);
  for (uint64_t dp = 1; dp <= 8; ++dp) {
    auto o = GlobalOrder::Create({n, seed, b});
    ASSERT_TRUE(o.ok());
    std::vector<uint64_t> seq;
    for (uint64_t g = 0; g < steps; ++g) {
      for (uint64_t r = 0; r < dp; ++r) o->AppendBatch(g, *RankSlice(b, dp, r), &seq);
    }
    EXPECT_EQ(seq, ref) << "dp " << dp;
  }
}

TEST(OrderTest, ContinuationAfterADpChangeAtAnyBoundary) {
  const uint64_t n = 50, b = 12, seed = 77;  // K = 4, 2 samples dropped per epoch
  const uint64_t steps = 10;
  const std::vector<uint64_t> ref = Reference(n, seed, b, steps);
  for (uint64_t change = 0; change <= steps; ++change) {
    for (auto [dp1, dp2] : {std::pair<uint64_t, uint64_t>{2, 3}, {8, 1}, {5, 7}, {4, 4}}) {
      // Ranks read with dp1 until the change, the job then resumes at position
      // change * B with dp2: each rank only knows the position.
      std::vector<uint64_t> seq;
      for (uint64_t g = 0; g < steps; ++g) {
        const uint64_t dp = g < change ? dp1 : dp2;
        auto o = GlobalOrder::Create({n, seed, b});  // fresh state: only P is carried
        ASSERT_TRUE(o.ok());
        auto at = o->Locate(g * b);
        ASSERT_TRUE(at.ok());
        for (uint64_t r = 0; r < dp; ++r) o->AppendBatch(at->step, *RankSlice(b, dp, r), &seq);
      }
      EXPECT_EQ(seq, ref) << "change at step " << change << " dp " << dp1 << "->" << dp2;
      // Exactly once per epoch.
      for (uint64_t e = 0; e * 4 < steps; ++e) {
        const uint64_t lo = e * 4 * b, hi = std::min<uint64_t>((e + 1) * 4 * b, seq.size());
        std::set<uint64_t> u(seq.begin() + lo, seq.begin() + hi);
        EXPECT_EQ(u.size(), hi - lo);
      }
    }
  }
}

TEST(OrderTest, HugeStepsLocateWithoutOverflow) {
  auto o = GlobalOrder::Create({1000, 1, 10});
  ASSERT_TRUE(o.ok());
  StepInfo s = o->LocateStep(~0ull);
  EXPECT_EQ(s.epoch, ~0ull / 100);
  EXPECT_EQ(s.batch_in_epoch, ~0ull % 100);
  std::vector<uint64_t> ids;
  o->AppendBatch(~0ull, {0, 10}, &ids);
  EXPECT_EQ(ids.size(), 10u);
}

}  // namespace
}  // namespace tenplex::data
