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

// ---- The speed model with a fixed part (a_r + b_r · f_r), against brute force. ----

using Weights = std::array<std::vector<int>, 3>;

// Rank r's fraction of the work under w, computed here from the dims' shares.
std::vector<double> TestFractions(const RebalanceInput& in, const Weights& w) {
  const int tp = static_cast<int>(in.dims[0].weights.size());
  const int dp = static_cast<int>(in.dims[1].weights.size());
  const int pp = static_cast<int>(in.dims[2].weights.size());
  std::vector<double> f;
  for (int r = 0; r < tp * dp * pp; ++r) {
    f.push_back(in.dims[0].shares(w[0])[r % tp] * in.dims[1].shares(w[1])[(r / tp) % dp] *
                in.dims[2].shares(w[2])[r / (tp * dp)]);
  }
  return f;
}

// The true model's seconds of every rank under w.
std::vector<double> TrueSeconds(const RebalanceInput& in, const std::vector<double>& a,
                                const std::vector<double>& b, const Weights& w) {
  std::vector<double> f = TestFractions(in, w), t;
  for (std::size_t r = 0; r < f.size(); ++r) t.push_back(a[r] + b[r] * f[r]);
  return t;
}

Weights W(std::vector<int> tp, std::vector<int> dp, std::vector<int> pp) {
  return {std::move(tp), std::move(dp), std::move(pp)};
}

SplitSample Sample(const Weights& w, std::vector<double> t) {
  SplitSample s;
  s.weights = w;
  s.rank_seconds = std::move(t);
  return s;
}

double TrueStep(const RebalanceInput& in, const std::vector<double>& a,
                const std::vector<double>& b, const Weights& w) {
  auto t = TrueSeconds(in, a, b, w);
  return *std::max_element(t.begin(), t.end());
}

// A window of `steps` steps under the input's current weights, +-noise.
std::vector<std::vector<double>> TrueWindow(const RebalanceInput& in, const std::vector<double>& a,
                                            const std::vector<double>& b, int steps,
                                            double noise = 0, unsigned seed = 1) {
  Weights cur = {in.dims[0].weights, in.dims[1].weights, in.dims[2].weights};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(1 - noise, 1 + noise);
  std::vector<std::vector<double>> out;
  for (int s = 0; s < steps; ++s) {
    auto t = TrueSeconds(in, a, b, cur);
    for (double& x : t) x *= noise > 0 ? u(rng) : 1.0;
    out.push_back(t);
  }
  return out;
}

// Every weighting of the input's dims: weights 1..max_w (tp, dp), every split of the
// layers with at least one per stage (pp); the best true step time over all of them.
double BruteForceBest(const RebalanceInput& in, const std::vector<double>& a,
                      const std::vector<double>& b, int max_w, Weights* arg = nullptr) {
  std::array<std::vector<std::vector<int>>, 3> options;
  for (int k = 0; k < 3; ++k) {
    const int n = static_cast<int>(in.dims[k].weights.size());
    const int64_t total = in.dims[k].total;
    std::vector<int> w(n, 1);
    while (true) {
      int sum = 0;
      for (int x : w) sum += x;
      const bool ok = total > 0 ? sum == total : true;
      if (n == 1) {
        options[k].push_back(in.dims[k].weights);
        break;
      }
      if (ok) {
        auto sh = in.dims[k].shares(w);
        if (*std::min_element(sh.begin(), sh.end()) > 0) options[k].push_back(w);
      }
      const int top = total > 0 ? static_cast<int>(total) : max_w;
      int i = 0;
      while (i < n && w[i] == top) w[i++] = 1;
      if (i == n) break;
      ++w[i];
    }
  }
  double best = 1e300;
  for (const auto& x : options[0])
    for (const auto& y : options[1])
      for (const auto& z : options[2]) {
        const double t = TrueStep(in, a, b, {x, y, z});
        if (t < best) {
          best = t;
          if (arg) *arg = {x, y, z};
        }
      }
  return best;
}

TEST(RebalanceSpeedModelTest, TwoSplitsGiveTheFixedAndProportionalParts) {
  RebalanceInput in = Input(2, 1, 1, 64);
  const std::vector<double> a = {0.2, 0.6}, b = {1.0, 3.0};
  SplitSample even = Sample(W({1, 1}, {1}, {4}), TrueSeconds(in, a, b, W({1, 1}, {1}, {4})));
  SplitSample moved = Sample(W({2, 1}, {1}, {4}), TrueSeconds(in, a, b, W({2, 1}, {1}, {4})));
  SpeedModel m = FitSpeedModel(in.dims, moved, {even});
  EXPECT_EQ(m.fitted_ranks, 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(m.fixed_s[r], a[r], 1e-9) << r;
    EXPECT_NEAR(m.per_work_s[r], b[r], 1e-9) << r;
  }
  // No other split: the proportional model (all of the time scales with the share).
  SpeedModel p = FitSpeedModel(in.dims, even, {});
  EXPECT_EQ(p.fitted_ranks, 0);
  EXPECT_EQ(p.fixed_s[1], 0.0);
  EXPECT_NEAR(p.per_work_s[1], (0.6 + 1.5) / 0.5, 1e-9);
  // A share that barely moved gives no slope of its own: the others' fixed fraction.
  SplitSample near = Sample(W({1, 1}, {1}, {4}), {1.0, 2.0});
  SpeedModel q = FitSpeedModel(in.dims, near, {near});
  EXPECT_EQ(q.fitted_ranks, 0);
}

TEST(RebalanceSpeedModelTest, MeasurementsThatContradictTheModelAreNoFit) {
  RebalanceInput in = Input(2, 1, 1, 64);
  // Rank 0 got faster with more work (the load changed): no slope of its own, it takes
  // the fitted ranks' fixed fraction; rank 1's time fell more than its share (a < 0):
  // proportional, fixed fraction 0.
  SplitSample even = Sample(W({1, 1}, {1}, {4}), {1.0, 2.0});
  SplitSample moved = Sample(W({2, 1}, {1}, {4}), {0.9, 0.5});
  RebalancePolicy policy;
  SpeedModel m = FitSpeedModel(in.dims, moved, {even}, policy);
  EXPECT_EQ(m.fitted_ranks, 1);
  EXPECT_EQ(m.fixed_s[0], 0.0);
  EXPECT_NEAR(m.per_work_s[0], 0.9 / (43.0 / 64), 1e-9);
  EXPECT_EQ(m.fixed_s[1], 0.0);
  EXPECT_NEAR(m.per_work_s[1], 0.5 / (21.0 / 64), 1e-9);
  // Rank 0's time hardly moved with its share (fixed part 90%): no fit either; rank 1
  // fits (fixed 0.2 of its 0.8 s) and lends rank 0 its fixed fraction.
  SplitSample flat = Sample(W({2, 1}, {1}, {4}), {0.98, 0.2 + 1.2 * 21.0 / 64});
  SplitSample even2 = Sample(W({1, 1}, {1}, {4}), {0.95, 0.2 + 1.2 * 0.5});
  SpeedModel n = FitSpeedModel(in.dims, flat, {even2}, policy);
  EXPECT_EQ(n.fitted_ranks, 1);
  EXPECT_NEAR(n.fixed_s[1], 0.2, 1e-9);
  EXPECT_NEAR(n.fixed_s[0], 0.98 * 0.2 / flat.rank_seconds[1], 1e-9);
}

// Random true models on several grids: given the even split and one other measured
// split, the policy's pick is within 1% of the best weighting found by brute force (10%
// on grids split in two dimensions), and its predicted step time is the true one (the
// fit is exact without noise).
TEST(RebalanceSpeedModelTest, PickMatchesBruteForceOverWeightings) {
  struct Case {
    int tp, dp, pp;
    int64_t tp_units;
    int layers, max_w;
  };
  const std::vector<Case> cases = {{2, 1, 1, 64, 4, 32}, {4, 1, 1, 96, 4, 8}, {1, 2, 1, 1, 4, 16},
                                   {1, 4, 1, 1, 4, 8},   {1, 1, 2, 1, 8, 1},  {1, 1, 3, 1, 12, 1},
                                   {2, 1, 2, 64, 8, 16}, {2, 2, 1, 64, 4, 8}};
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> slow(1.0, 3.0), fixed(0.0, 0.4);
  for (const Case& c : cases) {
    for (int trial = 0; trial < 4; ++trial) {
      RebalanceInput in = Input(c.tp, c.dp, c.pp, c.tp_units, c.layers);
      const int world = c.tp * c.dp * c.pp;
      std::vector<double> a(world), b(world);
      for (int r = 0; r < world; ++r) {
        b[r] = slow(rng);
        a[r] = fixed(rng) * b[r] / world;  // up to 40% of the even share's time
      }
      // Measured at even, then at the proportional pick (as a run would).
      in.rank_seconds = TrueWindow(in, a, b, 3);
      RebalanceDecision first = DecideRebalance(in);
      if (first.weights == first.measured.weights) continue;
      RebalanceInput again = in;
      for (int k = 0; k < 3; ++k) again.dims[k].weights = first.weights[k];
      again.history = {first.measured};
      again.rank_seconds = TrueWindow(again, a, b, 3);
      RebalanceDecision d = DecideRebalance(again);
      Weights arg;
      const double best = BruteForceBest(in, a, b, c.max_w, &arg);
      SCOPED_TRACE("tp " + std::to_string(c.tp) + " dp " + std::to_string(c.dp) + " pp " +
                   std::to_string(c.pp) + " trial " + std::to_string(trial));
      EXPECT_NEAR(d.predicted_step_s, TrueStep(in, a, b, d.weights), 1e-9);
      // One parallel dimension: the per-dimension equalisation is the optimum up to
      // rounding. Two: the search goes one dimension at a time, a heuristic (measured
      // up to 8% above the joint optimum on these cases).
      const int dims_split = (c.tp > 1) + (c.dp > 1) + (c.pp > 1);
      EXPECT_LE(d.predicted_step_s, best * (dims_split == 1 ? 1.01 : 1.1));
      // The proportional model's pick, judged by the true model, is never better.
      EXPECT_GE(TrueStep(in, a, b, first.weights), d.predicted_step_s * (1 - 1e-9));
    }
  }
}

// dp=2, the slow rank 3x slower with a fixed part (its optimizer step over the whole
// model): the proportional first move (3+1) overshoots; the second decision, with both
// splits measured, gives it fewer samples still, and then noise moves nothing.
TEST(RebalanceSpeedModelTest, SecondRebalanceCorrectsTheProportionalMove) {
  RebalanceInput in = Input(1, 2, 1, 1);
  const std::vector<double> a = {0.15, 0.45}, b = {1.0, 3.0};
  in.rank_seconds = TrueWindow(in, a, b, 3);
  RebalanceDecision first = DecideRebalance(in);
  ASSERT_TRUE(first.rebalance) << first.reason;
  EXPECT_EQ(first.weights[1], (std::vector<int>{3, 1}));
  RebalanceInput again = in;
  again.dims[1].weights = first.weights[1];
  again.history = {first.measured};
  again.rank_seconds = TrueWindow(again, a, b, 3);
  RebalanceDecision second = DecideRebalance(again);
  ASSERT_TRUE(second.rebalance) << second.reason;
  Weights arg;
  const double best = BruteForceBest(in, a, b, 16, &arg);
  EXPECT_NEAR(TrueStep(in, a, b, second.weights), best, 1e-9);
  EXPECT_LT(UnitShares(16, second.weights[1])[1], 0.25);
  // Steady speeds, noisy windows, three splits known: no third move.
  for (unsigned seed = 1; seed <= 30; ++seed) {
    RebalanceInput third = again;
    third.dims[1].weights = second.weights[1];
    third.history = {first.measured, second.measured};
    third.rank_seconds = TrueWindow(third, a, b, 4, 0.05, seed);
    RebalanceDecision e = DecideRebalance(third);
    EXPECT_FALSE(e.rebalance) << "seed " << seed << ": " << e.reason;
  }
}

}  // namespace
}  // namespace tenplex::runtime
