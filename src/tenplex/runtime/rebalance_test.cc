#include "tenplex/runtime/rebalance.h"

#include <gtest/gtest.h>

#include <random>

namespace tenplex::runtime {
namespace {

// A dimension of n indexes whose work is `units` apportioned units (tp groups, samples).
SplitDim Units(int n, int64_t units) {
  SplitDim d;
  d.weights.assign(n, 1);
  d.shares = [units](const std::vector<int>& w) { return UnitShares(units, w); };
  return d;
}

// Pipeline stages over `layers` layers, even.
SplitDim Layers(int pp, int layers) {
  SplitDim d;
  d.weights.assign(pp, layers / pp);
  d.total = layers;
  d.shares = [layers](const std::vector<int>& w) {
    std::vector<double> s;
    for (int x : w) s.push_back(static_cast<double>(x) / layers);
    return s;
  };
  return d;
}

// Window of steps where rank r takes speed_factor[r] x its share of `unit` seconds of work,
// with multiplicative noise of +-noise.
std::vector<std::vector<double>> Window(const RebalanceInput& in, const std::vector<double>& slow,
                                        int steps, double noise, unsigned seed = 1) {
  std::array<std::vector<int>, 3> cur = {in.dims[0].weights, in.dims[1].weights,
                                         in.dims[2].weights};
  // Ones everywhere under the current split, then scaled by the split's shares.
  std::vector<double> ones(slow.size(), 1.0);
  std::vector<double> work = PredictRankSeconds(in.dims, ones, cur);  // = 1 (same split)
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(1 - noise, 1 + noise);
  std::vector<std::vector<double>> out;
  const int tp = static_cast<int>(in.dims[0].weights.size());
  const int dp = static_cast<int>(in.dims[1].weights.size());
  for (int s = 0; s < steps; ++s) {
    std::vector<double> row;
    for (std::size_t r = 0; r < slow.size(); ++r) {
      const int t = static_cast<int>(r) % tp, d = (static_cast<int>(r) / tp) % dp,
                p = static_cast<int>(r) / (tp * dp);
      double share = in.dims[0].shares(in.dims[0].weights)[t] *
                     in.dims[1].shares(in.dims[1].weights)[d] *
                     in.dims[2].shares(in.dims[2].weights)[p];
      row.push_back(work[r] * share * slow[r] * (noise > 0 ? u(rng) : 1.0));
    }
    out.push_back(row);
  }
  return out;
}

RebalanceInput Input(int tp, int dp, int pp, int64_t tp_units, int layers = 4) {
  RebalanceInput in;
  in.dims = {Units(tp, tp_units), Units(dp, 16), Layers(pp, layers)};
  in.remaining_steps = 100;
  in.cost_seconds = 1.0;
  return in;
}

TEST(RebalanceTest, Tp2SlowRankGetsAThird) {
  RebalanceInput in = Input(2, 1, 1, 64);
  in.rank_seconds = Window(in, {1.0, 2.0}, 4, 0.0);
  RebalanceDecision d = DecideRebalance(in);
  ASSERT_TRUE(d.rebalance) << d.reason;
  EXPECT_EQ(d.weights[0], (std::vector<int>{2, 1}));
  EXPECT_NEAR(d.current_step_s, 1.0, 1e-9);  // 2 x half the work
  // The best reachable with 64 units is 43 + 21: rank 1 then takes 2 x 21/64.
  EXPECT_NEAR(d.predicted_step_s, 43.0 / 64, 1e-9);
  EXPECT_NEAR(d.predicted_gain_s, (1.0 - 43.0 / 64) * 100, 1e-6);
}

TEST(RebalanceTest, BalancedOrSlightlyNoisyRunsStay) {
  for (unsigned seed = 1; seed <= 50; ++seed) {
    RebalanceInput in = Input(4, 2, 1, 64);
    in.rank_seconds = Window(in, std::vector<double>(8, 1.0), 5, 0.05, seed);
    RebalanceDecision d = DecideRebalance(in);
    EXPECT_FALSE(d.rebalance) << "seed " << seed << ": " << d.reason;
  }
}

TEST(RebalanceTest, AfterRebalancingSteadySpeedsDoNotOscillate) {
  RebalanceInput in = Input(2, 1, 1, 64);
  in.rank_seconds = Window(in, {1.0, 3.0}, 4, 0.0);
  RebalanceDecision d = DecideRebalance(in);
  ASSERT_TRUE(d.rebalance);
  // Measure again under the new split, with noise: no second change.
  for (unsigned seed = 1; seed <= 30; ++seed) {
    RebalanceInput again = in;
    again.dims[0].weights = d.weights[0];
    again.rank_seconds = Window(again, {1.0, 3.0}, 4, 0.05, seed);
    RebalanceDecision e = DecideRebalance(again);
    EXPECT_FALSE(e.rebalance) << "seed " << seed << ": " << e.reason;
  }
  // The slow device recovers: back towards even.
  RebalanceInput back = in;
  back.dims[0].weights = d.weights[0];
  back.rank_seconds = Window(back, {1.0, 1.0}, 4, 0.0);
  RebalanceDecision f = DecideRebalance(back);
  ASSERT_TRUE(f.rebalance) << f.reason;
  EXPECT_EQ(f.weights[0], (std::vector<int>{1, 1}));
}

TEST(RebalanceTest, CostAboveGainKeepsTheSplit) {
  RebalanceInput in = Input(2, 1, 1, 64);
  in.rank_seconds = Window(in, {1.0, 2.0}, 4, 0.0);
  in.remaining_steps = 3;  // gain (1 - 43/64) x 3 = 0.98 s
  in.cost_seconds = 1.0;
  RebalanceDecision d = DecideRebalance(in);
  EXPECT_FALSE(d.rebalance);
  EXPECT_NE(d.reason.find("does not exceed"), std::string::npos) << d.reason;
  in.remaining_steps = 4;  // 1.31 s > 1 s
  EXPECT_TRUE(DecideRebalance(in).rebalance);
}

TEST(RebalanceTest, GranularityIsHonoured) {
  // 2 query groups over tp=2: no uneven split is possible, nothing to gain.
  RebalanceInput in = Input(2, 1, 1, 2);
  in.rank_seconds = Window(in, {1.0, 2.0}, 4, 0.0);
  RebalanceDecision d = DecideRebalance(in);
  EXPECT_FALSE(d.rebalance) << d.reason;
}

TEST(RebalanceTest, SlowDpRankGetsFewerSamples) {
  RebalanceInput in = Input(1, 4, 1, 1);
  in.rank_seconds = Window(in, {1.0, 1.0, 2.0, 1.0}, 3, 0.0);
  RebalanceDecision d = DecideRebalance(in);
  ASSERT_TRUE(d.rebalance) << d.reason;
  EXPECT_EQ(d.weights[1], (std::vector<int>{2, 2, 1, 2}));
  EXPECT_NEAR(d.current_step_s, 2.0 / 4, 1e-9);
  EXPECT_NEAR(d.predicted_step_s, 5.0 / 16, 1e-9);  // 5+5+2+4 samples: the best of 16
}

TEST(RebalanceTest, SlowStageGetsFewerLayers) {
  RebalanceInput in = Input(1, 1, 2, 1, 8);
  in.rank_seconds = Window(in, {1.0, 3.0}, 3, 0.0);
  RebalanceDecision d = DecideRebalance(in);
  ASSERT_TRUE(d.rebalance) << d.reason;
  EXPECT_EQ(d.weights[2], (std::vector<int>{6, 2}));
  int sum = 0;
  for (int x : d.weights[2]) sum += x;
  EXPECT_EQ(sum, 8);
}

TEST(RebalanceTest, BruteForceAgreesOnTp4) {
  // Every weight vector up to 8 per rank: the policy's pick is within 2% of the best.
  const std::vector<double> slow = {1.0, 1.5, 1.0, 2.5};
  RebalanceInput in = Input(4, 1, 1, 96);
  in.rank_seconds = Window(in, slow, 3, 0.0);
  RebalanceDecision d = DecideRebalance(in);
  ASSERT_TRUE(d.rebalance);
  double best = 1e9;
  std::array<std::vector<int>, 3> w = {{{}, {1}, {4}}};
  for (int a = 1; a <= 8; ++a)
    for (int b = 1; b <= 8; ++b)
      for (int c = 1; c <= 8; ++c)
        for (int e = 1; e <= 8; ++e) {
          w[0] = {a, b, c, e};
          auto t = PredictRankSeconds(in.dims, d.rank_seconds, w);
          best = std::min(best, *std::max_element(t.begin(), t.end()));
        }
  EXPECT_LE(d.predicted_step_s, best * 1.02);
}

TEST(RebalanceTest, ShortWindowOrWrongWidthDecidesNothing) {
  RebalanceInput in = Input(2, 1, 1, 64);
  in.rank_seconds = {{1.0, 2.0}};
  EXPECT_FALSE(DecideRebalance(in).rebalance);
  in.rank_seconds = {{1.0, 2.0, 3.0}, {1.0, 2.0, 3.0}};
  RebalanceDecision d = DecideRebalance(in);
  EXPECT_FALSE(d.rebalance);
  EXPECT_NE(d.reason.find("world size"), std::string::npos);
}

}  // namespace
}  // namespace tenplex::runtime
