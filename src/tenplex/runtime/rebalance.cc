#include "tenplex/runtime/rebalance.h"

#include <algorithm>
#include <cmath>
#include <numeric>


namespace tenplex::runtime {

namespace {

// TEMPORARY until util/apportion.h lands (spec §9 largest remainder).
std::vector<int64_t> Apportion(int64_t units, const std::vector<int>& w) {
  int64_t total = 0;
  for (int x : w) total += x;
  std::vector<int64_t> n(w.size());
  std::vector<std::size_t> order(w.size());
  int64_t left = units;
  for (std::size_t i = 0; i < w.size(); ++i) {
    n[i] = units * w[i] / total;
    left -= n[i];
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return units * w[a] % total > units * w[b] % total;
  });
  for (int64_t i = 0; i < left; ++i) ++n[order[i]];
  return n;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Index of rank r in dimension k (0 tp, 1 dp, 2 pp), Megatron order.
int IndexOf(int r, int k, int tp, int dp) {
  if (k == 0) return r % tp;
  if (k == 1) return (r / tp) % dp;
  return r / (tp * dp);
}

std::array<std::vector<double>, 3> AllShares(const std::array<SplitDim, 3>& dims,
                                             const std::array<std::vector<int>, 3>& w) {
  std::array<std::vector<double>, 3> s;
  for (int k = 0; k < 3; ++k) s[k] = dims[k].shares(w[k]);
  return s;
}

std::vector<int> Reduced(std::vector<int> w) {
  int g = 0;
  for (int x : w) g = std::gcd(g, x);
  if (g > 1)
    for (int& x : w) x /= g;
  return w;
}

}  // namespace

std::vector<double> UnitShares(int64_t units, const std::vector<int>& weights) {
  std::vector<int64_t> n = Apportion(units, weights);
  std::vector<double> s(n.size());
  for (std::size_t i = 0; i < n.size(); ++i)
    s[i] = units > 0 ? static_cast<double>(n[i]) / static_cast<double>(units) : 0.0;
  return s;
}

std::vector<double> PredictRankSeconds(const std::array<SplitDim, 3>& dims,
                                       const std::vector<double>& measured,
                                       const std::array<std::vector<int>, 3>& weights) {
  const int tp = static_cast<int>(dims[0].weights.size());
  const int dp = static_cast<int>(dims[1].weights.size());
  std::array<std::vector<int>, 3> cur = {dims[0].weights, dims[1].weights, dims[2].weights};
  auto s_cur = AllShares(dims, cur);
  auto s_new = AllShares(dims, weights);
  std::vector<double> out(measured.size());
  for (std::size_t r = 0; r < measured.size(); ++r) {
    double f_cur = 1, f_new = 1;
    for (int k = 0; k < 3; ++k) {
      const int i = IndexOf(static_cast<int>(r), k, tp, dp);
      f_cur *= s_cur[k][i];
      f_new *= s_new[k][i];
    }
    // A rank holding no work cannot be measured; it stays free.
    out[r] = f_cur > 0 ? measured[r] / f_cur * f_new : 0.0;
  }
  return out;
}

RebalanceDecision DecideRebalance(const RebalanceInput& in, const RebalancePolicy& policy) {
  RebalanceDecision d;
  for (int k = 0; k < 3; ++k) d.weights[k] = in.dims[k].weights;
  const int tp = static_cast<int>(in.dims[0].weights.size());
  const int dp = static_cast<int>(in.dims[1].weights.size());
  const int pp = static_cast<int>(in.dims[2].weights.size());
  const int world = tp * dp * pp;
  d.cost_s = in.cost_seconds;
  if (static_cast<int>(in.rank_seconds.size()) < policy.min_window) {
    d.reason = "window of " + std::to_string(in.rank_seconds.size()) + " steps, need " +
               std::to_string(policy.min_window);
    return d;
  }
  for (const auto& step : in.rank_seconds) {
    if (static_cast<int>(step.size()) != world) {
      d.reason = "rank_seconds has " + std::to_string(step.size()) + " ranks, world size is " +
                 std::to_string(world);
      return d;
    }
  }
  d.rank_seconds.resize(world);
  for (int r = 0; r < world; ++r) {
    std::vector<double> v;
    for (const auto& step : in.rank_seconds) v.push_back(step[r]);
    d.rank_seconds[r] = Median(v);
  }
  auto predict = [&](const std::array<std::vector<int>, 3>& w) {
    auto t = PredictRankSeconds(in.dims, d.rank_seconds, w);
    return *std::max_element(t.begin(), t.end());
  };
  d.current_step_s = predict(d.weights);
  std::array<std::vector<int>, 3> best = d.weights;
  double best_t = d.current_step_s;
  // Seconds per unit of work of every rank, from the measured split.
  std::vector<double> tau(world);
  {
    std::array<std::vector<int>, 3> cur = d.weights;
    auto s = AllShares(in.dims, cur);
    for (int r = 0; r < world; ++r) {
      double f = 1;
      for (int k = 0; k < 3; ++k) f *= s[k][IndexOf(r, k, tp, dp)];
      tau[r] = f > 0 ? d.rank_seconds[r] / f : 0.0;
    }
  }
  for (int k : {0, 1, 2, 0}) {
    const int n = static_cast<int>(in.dims[k].weights.size());
    if (n < 2) continue;
    auto s = AllShares(in.dims, best);
    // The pace of index i: its slowest rank's seconds for its share of the other dims.
    std::vector<double> pace(n, 0.0);
    for (int r = 0; r < world; ++r) {
      double f = tau[r];
      for (int o = 0; o < 3; ++o)
        if (o != k) f *= s[o][IndexOf(r, o, tp, dp)];
      double& p = pace[IndexOf(r, k, tp, dp)];
      p = std::max(p, f);
    }
    std::vector<double> target(n);
    for (int i = 0; i < n; ++i) target[i] = pace[i] > 0 ? 1.0 / pace[i] : 0.0;
    const double top = *std::max_element(target.begin(), target.end());
    if (!(top > 0)) continue;
    for (int K = 1; K <= policy.max_weight; ++K) {
      std::vector<int> w(n);
      for (int i = 0; i < n; ++i)
        w[i] = std::max(1, static_cast<int>(std::lround(target[i] / top * K)));
      if (in.dims[k].total > 0) {
        std::vector<int64_t> counts = Apportion(in.dims[k].total, w);
        if (*std::min_element(counts.begin(), counts.end()) < 1) continue;
        for (int i = 0; i < n; ++i) w[i] = static_cast<int>(counts[i]);
      } else {
        w = Reduced(w);
      }
      auto cand = best;
      cand[k] = w;
      const double t = predict(cand);
      if (t < best_t * (1 - 1e-9)) {
        best_t = t;
        best = cand;
      }
    }
  }
  d.predicted_step_s = best_t;
  const double per_step = d.current_step_s - best_t;
  d.predicted_gain_s = std::max(0.0, per_step) * static_cast<double>(in.remaining_steps);
  if (best == d.weights) {
    d.reason = "the current split is the best predicted";
    return d;
  }
  d.weights = best;
  if (per_step < policy.min_step_gain * d.current_step_s) {
    d.reason = "predicted step gain " + std::to_string(per_step / d.current_step_s * 100) +
               "% is under the " + std::to_string(policy.min_step_gain * 100) + "% threshold";
    return d;
  }
  if (d.predicted_gain_s <= in.cost_seconds * policy.cost_margin) {
    d.reason = "predicted gain " + std::to_string(d.predicted_gain_s) +
               " s over the remaining steps does not exceed the reconfiguration cost " +
               std::to_string(in.cost_seconds) + " s";
    return d;
  }
  d.rebalance = true;
  d.reason = "predicted gain exceeds the cost";
  return d;
}

}  // namespace tenplex::runtime
