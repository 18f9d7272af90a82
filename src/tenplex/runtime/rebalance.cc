#include "tenplex/runtime/rebalance.h"

#include <algorithm>
#include <cmath>
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
double PredictStep(const std::array<SplitDim, 3>& dims, const std::vector<double>& measured,
                   const std::array<std::vector<int>, 3>& w) {
  auto t = PredictRankSeconds(dims, measured, w);
  return *std::max_element(t.begin(), t.end());
}

// Seconds per unit of work of every rank, from the measured split.
std::vector<double> SecondsPerUnit(const RebalanceInput& in, const RebalanceDecision& d,
                                   const Grid& g) {
  std::vector<double> tau(g.world);
  std::array<std::vector<int>, 3> cur = d.weights;
  auto s = AllShares(in.dims, cur);
  for (int r = 0; r < g.world; ++r) {
    double f = 1;
    for (int k = 0; k < 3; ++k) f *= s[k][IndexOf(r, k, g.tp, g.dp)];
    tau[r] = f > 0 ? d.rank_seconds[r] / f : 0.0;
  }
  return tau;
}

// The target speed of every index of dimension k under `best`: the inverse of its
// pace, its slowest rank's seconds for its share of the other dims.
std::vector<double> TargetSpeeds(const RebalanceInput& in, const std::vector<double>& tau,
                                 const std::array<std::vector<int>, 3>& best, int k,
                                 const Grid& g) {
  const int n = static_cast<int>(in.dims[k].weights.size());
  auto s = AllShares(in.dims, best);
  std::vector<double> pace(n, 0.0);
  for (int r = 0; r < g.world; ++r) {
    double f = tau[r];
    for (int o = 0; o < 3; ++o)
      if (o != k) f *= s[o][IndexOf(r, o, g.tp, g.dp)];
    double& p = pace[IndexOf(r, k, g.tp, g.dp)];
    p = std::max(p, f);
  }
  std::vector<double> target(n);
  for (int i = 0; i < n; ++i) target[i] = pace[i] > 0 ? 1.0 / pace[i] : 0.0;
  return target;
}

// The target speeds of dimension k rounded to weights of at most `max`; empty when
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

// Tries the roundings of dimension k's target speeds; keeps in best / best_t the
// fastest predicted split.
void ImproveDim(const RebalanceInput& in, const RebalancePolicy& policy, const RebalanceDecision& d,
                const std::vector<double>& tau, int k, const Grid& g,
                std::array<std::vector<int>, 3>& best, double& best_t) {
  if (in.dims[k].weights.size() < 2) return;
  std::vector<double> target = TargetSpeeds(in, tau, best, k, g);
  const double top = *std::max_element(target.begin(), target.end());
  if (!(top > 0)) return;
  for (int K = 1; K <= policy.max_weight; ++K) {
    std::vector<int> w = RoundedWeights(in.dims[k], target, top, K);
    if (w.empty()) continue;
    auto cand = best;
    cand[k] = w;
    const double t = PredictStep(in.dims, d.rank_seconds, cand);
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
  d.current_step_s = PredictStep(in.dims, d.rank_seconds, d.weights);
  std::array<std::vector<int>, 3> best = d.weights;
  double best_t = d.current_step_s;
  const std::vector<double> tau = SecondsPerUnit(in, d, g);
  for (int k : {0, 1, 2, 0}) ImproveDim(in, policy, d, tau, k, g, best, best_t);
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
                                              const RebalancePolicy& policy) {
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
  ConfigRebalance out;
  out.decision = DecideRebalance(in, policy);
  out.to = ProposedConfig(model, config, out.decision);
  return out;
}

}  // namespace tenplex::runtime
