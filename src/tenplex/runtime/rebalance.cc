#include "tenplex/runtime/rebalance.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "tenplex/util/apportion.h"

namespace tenplex::runtime {

namespace {

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

namespace {

// Each rank's fraction of the job's work under w.
std::vector<double> Fractions(const std::array<SplitDim, 3>& dims,
                              const std::array<std::vector<int>, 3>& w, int world) {
  const int tp = static_cast<int>(dims[0].weights.size());
  const int dp = static_cast<int>(dims[1].weights.size());
  auto s = AllShares(dims, w);
  std::vector<double> f(world, 1.0);
  for (int r = 0; r < world; ++r)
    for (int k = 0; k < 3; ++k) f[r] *= s[k][IndexOf(r, k, tp, dp)];
  return f;
}

int WorldOf(const std::array<SplitDim, 3>& dims) {
  return static_cast<int>(dims[0].weights.size() * dims[1].weights.size() * dims[2].weights.size());
}

bool SameShape(const std::array<SplitDim, 3>& dims, const SplitSample& s, int world) {
  for (int k = 0; k < 3; ++k)
    if (s.weights[k].size() != dims[k].weights.size()) return false;
  return static_cast<int>(s.rank_seconds.size()) == world;
}

}  // namespace

SpeedModel FitSpeedModel(const std::array<SplitDim, 3>& dims, const SplitSample& current,
                         const std::vector<SplitSample>& history, const RebalancePolicy& policy) {
  const int world = WorldOf(dims);
  SpeedModel m;
  m.fixed_s.assign(world, 0.0);
  m.per_work_s.assign(world, 0.0);
  if (static_cast<int>(current.rank_seconds.size()) != world) return m;
  const std::vector<double> fc = Fractions(dims, current.weights, world);
  std::vector<std::vector<double>> fh;
  std::vector<const SplitSample*> hs;
  for (const SplitSample& h : history) {
    if (!SameShape(dims, h, world)) continue;
    fh.push_back(Fractions(dims, h.weights, world));
    hs.push_back(&h);
  }
  // Per rank: the least-squares slope through the current point, or none.
  std::vector<double> frac(world, -1.0);  // fitted fixed fraction a/t, -1: no fit
  for (int r = 0; r < world; ++r) {
    const double t = current.rank_seconds[r], f = fc[r];
    if (!(f > 0) || !(t > 0)) continue;
    double sxx = 0, sxy = 0;
    for (std::size_t j = 0; j < hs.size(); ++j) {
      const double dx = fh[j][r] - f, dy = hs[j]->rank_seconds[r] - t;
      if (!(fh[j][r] > 0) || !(hs[j]->rank_seconds[r] > 0)) continue;
      sxx += dx * dx;
      sxy += dx * dy;
    }
    if (sxx < policy.min_share_change * policy.min_share_change * f * f) continue;
    const double b = sxy / sxx;
    const double a = t - b * f;
    // Time that does not grow with the share (b <= 0), or almost all of it fixed: the
    // speed changed between the splits (load), not a fit to extrapolate; no slope.
    if (!(b > 0) || a / t > policy.max_fixed_fraction) continue;
    frac[r] = std::max(0.0, a / t);  // a < 0 (time fell faster than the share): proportional
    ++m.fitted_ranks;
  }
  std::vector<double> fitted;
  for (double x : frac)
    if (x >= 0) fitted.push_back(x);
  const double fallback = fitted.empty() ? policy.fixed_fraction : Median(fitted);
  for (int r = 0; r < world; ++r) {
    const double t = current.rank_seconds[r], f = fc[r];
    if (!(f > 0)) continue;  // a rank holding no work cannot be measured; it stays free
    const double phi = frac[r] >= 0 ? frac[r] : fallback;
    m.fixed_s[r] = phi * t;
    m.per_work_s[r] = (t - m.fixed_s[r]) / f;
  }
  return m;
}

std::vector<double> PredictRankSeconds(const std::array<SplitDim, 3>& dims, const SpeedModel& model,
                                       const std::array<std::vector<int>, 3>& weights) {
  const int world = static_cast<int>(model.fixed_s.size());
  const std::vector<double> f = Fractions(dims, weights, world);
  std::vector<double> out(world);
  for (int r = 0; r < world; ++r)
    out[r] = model.per_work_s[r] > 0 ? model.fixed_s[r] + model.per_work_s[r] * f[r] : 0.0;
  return out;
}

std::vector<double> PredictRankSeconds(const std::array<SplitDim, 3>& dims,
                                       const std::vector<double>& measured,
                                       const std::array<std::vector<int>, 3>& weights) {
  SplitSample cur;
  cur.weights = {dims[0].weights, dims[1].weights, dims[2].weights};
  cur.rank_seconds = measured;
  return PredictRankSeconds(dims, FitSpeedModel(dims, cur, {}), weights);
}

namespace {

// The rank grid of a split: tp fastest, then dp, then pp (Megatron order).
struct Grid {
  int tp, dp, world;
  explicit Grid(const std::array<SplitDim, 3>& dims)
      : tp(static_cast<int>(dims[0].weights.size())),
        dp(static_cast<int>(dims[1].weights.size())),
        world(tp * dp * static_cast<int>(dims[2].weights.size())) {}
};

// Why the window cannot be used (too short, wrong rank count); empty when it can.
std::string WindowProblem(const RebalanceInput& in, const RebalancePolicy& policy, int world) {
  if (static_cast<int>(in.rank_seconds.size()) < policy.min_window) {
    return "window of " + std::to_string(in.rank_seconds.size()) + " steps, need " +
           std::to_string(policy.min_window);
  }
  for (const auto& step : in.rank_seconds) {
    if (static_cast<int>(step.size()) != world) {
      return "rank_seconds has " + std::to_string(step.size()) + " ranks, world size is " +
             std::to_string(world);
    }
  }
  return "";
}

// Each rank's median seconds over the window.
std::vector<double> MedianRankSeconds(const RebalanceInput& in, int world) {
  std::vector<double> out(world);
  for (int r = 0; r < world; ++r) {
    std::vector<double> v;
    for (const auto& step : in.rank_seconds) v.push_back(step[r]);
    out[r] = Median(v);
  }
  return out;
}

// The predicted step time under w: its slowest rank's seconds.
double PredictStep(const std::array<SplitDim, 3>& dims, const SpeedModel& m,
                   const std::array<std::vector<int>, 3>& w) {
  auto t = PredictRankSeconds(dims, m, w);
  return *std::max_element(t.begin(), t.end());
}

// The target shares of dimension k's indexes under `best` (the other dims' shares
// fixed) that equalise the predicted times: index i's time is max over its ranks of
// a_r + c_r·s_i; s_i(T) = min_r (T - a_r) / c_r, T by bisection so that they sum to 1.
std::vector<double> TargetShares(const RebalanceInput& in, const SpeedModel& m,
                                 const std::array<std::vector<int>, 3>& best, int k,
                                 const Grid& g) {
  const int n = static_cast<int>(in.dims[k].weights.size());
  auto s = AllShares(in.dims, best);
  std::vector<double> a(g.world), c(g.world);
  double hi = 0;
  for (int r = 0; r < g.world; ++r) {
    c[r] = m.per_work_s[r];
    for (int o = 0; o < 3; ++o)
      if (o != k) c[r] *= s[o][IndexOf(r, o, g.tp, g.dp)];
    a[r] = m.fixed_s[r];
    hi = std::max(hi, a[r] + c[r]);
  }
  auto shares_at = [&](double T) {
    std::vector<double> x(n, std::numeric_limits<double>::infinity());
    for (int r = 0; r < g.world; ++r) {
      if (!(c[r] > 0)) continue;  // a rank with no work to scale sets no limit
      double& xi = x[IndexOf(r, k, g.tp, g.dp)];
      xi = std::min(xi, std::max(0.0, (T - a[r]) / c[r]));
    }
    for (double& xi : x)
      if (std::isinf(xi)) xi = 1.0;
    return x;
  };
  auto sum = [](const std::vector<double>& x) { return std::accumulate(x.begin(), x.end(), 0.0); };
  double lo = 0;
  for (int it = 0; it < 200 && hi - lo > 1e-12 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    (sum(shares_at(mid)) < 1.0 ? lo : hi) = mid;
  }
  return shares_at(hi);
}

// The target shares of dimension k rounded to weights of at most `max`; empty when
// some index would get no unit (a count dimension) or no share (spec §9).
std::vector<int> RoundedWeights(const SplitDim& dim, const std::vector<double>& target, double top,
                                int max) {
  const int n = static_cast<int>(target.size());
  std::vector<int> w(n);
  for (int i = 0; i < n; ++i)
    w[i] = std::max(1, static_cast<int>(std::lround(target[i] / top * max)));
  if (dim.total > 0) {
    std::vector<int64_t> counts = Apportion(dim.total, w);
    if (*std::min_element(counts.begin(), counts.end()) < 1) return {};
    for (int i = 0; i < n; ++i) w[i] = static_cast<int>(counts[i]);
  } else {
    w = Reduced(w);
  }
  // Spec §9: every rank must get some of every split; the shares say 0 otherwise.
  std::vector<double> sk = dim.shares(w);
  if (*std::min_element(sk.begin(), sk.end()) <= 0) return {};
  return w;
}

// Tries the roundings of dimension k's target shares; keeps in best / best_t the
// fastest predicted split.
void ImproveDim(const RebalanceInput& in, const RebalancePolicy& policy, const SpeedModel& m, int k,
                const Grid& g, std::array<std::vector<int>, 3>& best, double& best_t) {
  if (in.dims[k].weights.size() < 2) return;
  std::vector<double> target = TargetShares(in, m, best, k, g);
  const double top = *std::max_element(target.begin(), target.end());
  if (!(top > 0)) return;
  for (int K = 1; K <= policy.max_weight; ++K) {
    std::vector<int> w = RoundedWeights(in.dims[k], target, top, K);
    if (w.empty()) continue;
    auto cand = best;
    cand[k] = w;
    const double t = PredictStep(in.dims, m, cand);
    if (t < best_t * (1 - 1e-9)) {
      best_t = t;
      best = cand;
    }
  }
}

// Fills in the prediction for `best` and decides whether it is worth its cost.
void Conclude(const RebalanceInput& in, const RebalancePolicy& policy,
              const std::array<std::vector<int>, 3>& best, double best_t, RebalanceDecision& d) {
  d.predicted_step_s = best_t;
  const double per_step = d.current_step_s - best_t;
  d.predicted_gain_s = std::max(0.0, per_step) * static_cast<double>(in.remaining_steps);
  if (best == d.weights) {
    d.reason = "the current split is the best predicted";
    return;
  }
  d.weights = best;
  if (per_step < policy.min_step_gain * d.current_step_s) {
    d.reason = "predicted step gain " + std::to_string(per_step / d.current_step_s * 100) +
               "% is under the " + std::to_string(policy.min_step_gain * 100) + "% threshold";
    return;
  }
  if (d.predicted_gain_s <= in.cost_seconds * policy.cost_margin) {
    d.reason = "predicted gain " + std::to_string(d.predicted_gain_s) +
               " s over the remaining steps does not exceed the reconfiguration cost " +
               std::to_string(in.cost_seconds) + " s";
    return;
  }
  d.rebalance = true;
  d.reason = "predicted gain exceeds the cost";
}

}  // namespace

RebalanceDecision DecideRebalance(const RebalanceInput& in, const RebalancePolicy& policy) {
  RebalanceDecision d;
  for (int k = 0; k < 3; ++k) d.weights[k] = in.dims[k].weights;
  const Grid g(in.dims);
  d.cost_s = in.cost_seconds;
  d.reason = WindowProblem(in, policy, g.world);
  if (!d.reason.empty()) return d;
  d.rank_seconds = MedianRankSeconds(in, g.world);
  d.measured.weights = d.weights;
  d.measured.rank_seconds = d.rank_seconds;
  d.speed = FitSpeedModel(in.dims, d.measured, in.history, policy);
  d.current_step_s = PredictStep(in.dims, d.speed, d.weights);
  std::array<std::vector<int>, 3> best = d.weights;
  double best_t = d.current_step_s;
  // Coordinate passes until a pass changes nothing (each dimension's targets depend on
  // the others' shares).
  for (int pass = 0; pass < 6; ++pass) {
    const auto before = best;
    for (int k : {0, 1, 2}) ImproveDim(in, policy, d.speed, k, g, best, best_t);
    if (best == before) break;
  }
  Conclude(in, policy, best, best_t, d);
  return d;
}

namespace {

// tp: every split tensor's units, weighted by its elements (its share of the FLOPs).
SplitDim TpDim(const Model& model, const ParallelConfig& config) {
  struct Split {
    double numel;
    int64_t units;
  };
  std::vector<Split> splits;
  for (const TensorDesc& t : model.tensors) {
    const TpUnits u = TpUnitsOf(t, config.tp);
    if (u.units <= 0) continue;
    double n = 1;
    for (int64_t d : t.shape) n *= static_cast<double>(d);
    splits.push_back({n, u.units});
  }
  SplitDim dim;
  dim.weights = config.TpWeights();
  dim.shares = [splits](const std::vector<int>& w) {
    std::vector<double> s(w.size(), 0.0);
    if (splits.empty()) {
      s.assign(w.size(), 1.0 / static_cast<double>(w.size()));
      return s;
    }
    double total = 0;
    std::vector<bool> empty(w.size(), false);
    for (const Split& x : splits) {
      std::vector<int64_t> n = Apportion(x.units, w);
      for (std::size_t i = 0; i < w.size(); ++i) {
        s[i] += x.numel * static_cast<double>(n[i]) / static_cast<double>(x.units);
        if (n[i] == 0) empty[i] = true;
      }
      total += x.numel;
    }
    for (std::size_t i = 0; i < w.size(); ++i) s[i] = empty[i] ? 0.0 : s[i] / total;
    return s;
  };
  return dim;
}

// pp: the layers per stage (a count dimension when there is more than one stage).
Result<SplitDim> PpDim(const Model& model, const ParallelConfig& config) {
  SplitDim dim;
  TP_ASSIGN_OR_RETURN(std::vector<int> bounds, StageBounds(model, config));
  for (int p = 0; p < config.pp; ++p) dim.weights.push_back(bounds[p + 1] - bounds[p]);
  const int layers = model.num_layers;
  dim.total = config.pp > 1 ? layers : 0;
  dim.shares = [layers](const std::vector<int>& w) {
    std::vector<double> s;
    for (int x : w) s.push_back(w.size() == 1 ? 1.0 : static_cast<double>(x) / layers);
    return s;
  };
  return dim;
}

// The config of the decision's weights, canonical; `config` itself when the proposal
// is invalid (the decision then says so) or equal to it.
ParallelConfig ProposedConfig(const Model& model, const ParallelConfig& config,
                              RebalanceDecision& decision) {
  const int layers = model.num_layers;
  ParallelConfig to = config;
  to.tp_weights = decision.weights[0];
  to.dp_weights = decision.weights[1];
  if (config.pp > 1) {
    to.layers = decision.weights[2];
    const auto& l = to.layers;
    if (layers % config.pp == 0 &&
        std::all_of(l.begin(), l.end(), [&](int x) { return x == layers / config.pp; }))
      to.layers.clear();
  }
  to = CanonicalConfig(model, to);
  Status valid = ValidateConfig(model, to);
  if (!valid.ok()) {
    decision.rebalance = false;
    decision.reason = "the proposed split is not valid: " + valid.message();
    to = config;
  }
  if (to == CanonicalConfig(model, config)) {
    decision.rebalance = false;
    to = config;
  }
  return to;
}

}  // namespace

Result<ConfigRebalance> DecideConfigRebalance(const Model& model, const ParallelConfig& config,
                                              int64_t global_batch,
                                              const std::vector<std::vector<double>>& rank_seconds,
                                              int64_t remaining_steps, double cost_seconds,
                                              const RebalancePolicy& policy,
                                              const std::vector<SplitSample>& history) {
  TP_RETURN_IF_ERROR(ValidateConfig(model, config));
  if (global_batch < config.dp)
    return InvalidArgument("global batch " + std::to_string(global_batch) + " < dp");
  RebalanceInput in;
  in.dims[0] = TpDim(model, config);
  in.dims[1].weights = config.DpWeights();
  in.dims[1].shares = [global_batch](const std::vector<int>& w) {
    return UnitShares(global_batch, w);
  };
  TP_ASSIGN_OR_RETURN(in.dims[2], PpDim(model, config));
  in.rank_seconds = rank_seconds;
  in.remaining_steps = remaining_steps;
  in.cost_seconds = cost_seconds;
  in.history = history;
  ConfigRebalance out;
  out.decision = DecideRebalance(in, policy);
  out.to = ProposedConfig(model, config, out.decision);
  return out;
}

}  // namespace tenplex::runtime
