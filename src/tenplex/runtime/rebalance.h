// The rebalance policy of `tenplex run --rebalance`: when measured per-rank speeds
// are imbalanced, split the work in proportion to them, but only when that pays.
//
// Input: the per-rank compute seconds of a window of steps (the workers' `rank_seconds`,
// which exclude waiting in collectives), the current split of each parallel dimension
// (tp_weights, dp_weights, and layers per pipeline stage), and for each dimension a
// function giving each index's share of the dimension's work under given weights (for
// tp: the FLOP-weighted unit shares of the split tensors after spec §9 apportionment,
// so query-group granularity is honoured; for dp: samples; for pp: layers).
//
// Model. Rank r = (t, d, p) does the fraction f_r = s_tp[t]·s_dp[d]·s_pp[p] of the
// job's work. Its step compute is modelled as a fixed part plus a proportional part,
// seconds_r(f) = a_r + b_r · f: a_r is what the rank does whatever its share (layer norms
// and optimizer bookkeeping on replicated tensors, a dp rank's optimizer step over the
// whole model, Python and kernel-launch overhead per layer, setting up collectives),
// b_r the seconds the whole job's work would take it. One window at one split cannot
// tell a from b; splits measured earlier at the same speeds (`history`: the segments
// before a rebalance of the same schedule entry) can. The fit is anchored at the current
// split (the prediction for it is exactly its measured median, so the hysteresis below
// compares with a measurement, not with a fit): b_r is the least-squares slope of the
// (f, seconds) points of the other splits about the current point, a_r = t_r - b_r·f_r.
// A rank whose share moved by less than `min_share_change` (relative) gets no slope of
// its own and takes the median fixed fraction a/t of the ranks that have one; with no
// history the fixed part is `fixed_fraction` of the measured time (default 0: the
// proportional model, tau_r = t_r / f_r seconds per unit of work). A fit with a_r < 0
// becomes proportional (a_r = 0); one whose time does not grow with the share (b_r <= 0)
// or whose fixed part exceeds max_fixed_fraction·t_r is no fit (on a shared machine the
// load changed between the splits): such a rank gets the fallback, since extrapolating
// it would make it look free to take any work. A synchronous step lasts about as long as its
// slowest rank, so a split's predicted step time is max_r a_r + b_r·f_r.
//
// Search. One dimension at a time (tp, dp, pp; passes until one changes nothing): the target
// shares s_i of the dimension's indexes equalise the predicted times: with the other
// dimensions' shares fixed, index i's time is max over its ranks of a_r + c_r·s_i
// (c_r = b_r times their other shares), so s_i(T) = min_r (T - a_r) / c_r (at least 0)
// and T is found by bisection such that the s_i sum to 1. With no fixed part this is
// the share proportional to the speed of the index's slowest rank; with one, a slow
// rank gets less than its speed share (its fixed part does not shrink).
// Targets become integer weights by scaling with K = 1..max_weight and rounding (at least
// 1; for pp apportioning the layers, at least 1 per stage); each candidate is scored by
// its predicted step time through the shares function (which knows the granularity),
// and the best is kept, the smallest weights winning ties. Weights are reduced by their
// gcd.
//
// Cost-benefit (FlexTP's choice between doing nothing and migrating): rebalance only
// when (a) the new split differs from the current one, (b) it predicts a step at least
// `min_step_gain` (relative) faster than the current split's prediction, and (c) the
// predicted gain over the remaining steps, (current - new) · remaining, exceeds the
// measured cost of a reconfiguration (stop, transform, restart) times `cost_margin`.
// Hysteresis: (b) keeps measurement noise from flipping between near-equal splits,
// and since a balanced split predicts no gain from itself, a run with steady speeds
// rebalances once (twice when the first move, chosen without a fixed part, over- or
// undershoots and the fit from both splits predicts a gain over the threshold) and then
// stays; a change of speeds (a schedule `slowdown` entry) makes (b) and (c) true again.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tenplex/model/model.h"
#include "tenplex/ptc/config.h"
#include "tenplex/util/status.h"

namespace tenplex::runtime {

// One parallel dimension's split.
struct SplitDim {
  std::vector<int> weights;  // current: tp/dp weights, or layers per stage for pp
  int64_t total = 0;         // > 0: weights are counts that must sum to this (pp layers)
  // Share of the dimension's work per index under `weights` (sums to 1); 0 for an
  // index that would get no unit of some split (such weights are never proposed).
  std::function<std::vector<double>(const std::vector<int>&)> shares;
};

// One split and each rank's median compute seconds measured under it.
struct SplitSample {
  std::array<std::vector<int>, 3> weights;  // tp, dp weights, layers per stage
  std::vector<double> rank_seconds;         // median per rank
};

struct RebalanceInput {
  std::array<SplitDim, 3> dims;                   // tp, dp, pp (rank order: tp fastest)
  std::vector<std::vector<double>> rank_seconds;  // per step of the window, per rank
  // Earlier splits measured at the same speeds (oldest first); samples whose world or
  // dimension sizes differ from dims are ignored.
  std::vector<SplitSample> history;
  int64_t remaining_steps = 0;
  double cost_seconds = 0;  // measured (or estimated) seconds of one reconfiguration
};

struct RebalancePolicy {
  double min_step_gain = 0.08;      // relative step-time gain below which nothing changes
  double cost_margin = 1.0;         // the gain must exceed cost_seconds times this
  int max_weight = 32;              // largest weight tried when rounding target shares
  int min_window = 2;               // steps needed before any decision
  double fixed_fraction = 0.0;      // fixed part / measured time of a rank with no fit
  double max_fixed_fraction = 0.6;  // a larger fitted fixed part (x measured) is no fit
  double min_share_change = 0.1;    // relative share change a slope needs
};

// Per rank: step compute seconds = fixed_s + per_work_s · (the rank's fraction of work).
struct SpeedModel {
  std::vector<double> fixed_s, per_work_s;
  int fitted_ranks = 0;  // ranks whose slope came from measured splits
};

// The model of the ranks' speeds from `current` (the split now running) and earlier
// splits at the same speeds (see the essay above).
SpeedModel FitSpeedModel(const std::array<SplitDim, 3>& dims, const SplitSample& current,
                         const std::vector<SplitSample>& history,
                         const RebalancePolicy& policy = {});

// The ranks' predicted seconds under `weights`.
std::vector<double> PredictRankSeconds(const std::array<SplitDim, 3>& dims, const SpeedModel& model,
                                       const std::array<std::vector<int>, 3>& weights);

struct RebalanceDecision {
  bool rebalance = false;
  std::array<std::vector<int>, 3> weights;  // the proposed split (the current one if none)
  std::vector<double> rank_seconds;         // median per rank over the window
  SplitSample measured;                     // the current split and those medians
  SpeedModel speed;                         // the fitted model the prediction used
  double current_step_s = 0, predicted_step_s = 0;
  double predicted_gain_s = 0, cost_s = 0;
  std::string reason;  // why (not)
};

// The ranks' predicted seconds for `weights` given medians measured under the dims'
// current weights, by the proportional model (no fixed part).
std::vector<double> PredictRankSeconds(const std::array<SplitDim, 3>& dims,
                                       const std::vector<double>& measured,
                                       const std::array<std::vector<int>, 3>& weights);

RebalanceDecision DecideRebalance(const RebalanceInput& input, const RebalancePolicy& policy = {});

// The policy for a model and config: tp shares are the FLOP-weighted (numel-weighted)
// unit shares of every tensor-parallel split of the model (spec §9 units), dp shares
// the apportioned samples of a global batch of `global_batch`, pp shares the layers per
// stage. `to` is the proposed config, canonical (CanonicalConfig; layers= dropped when
// even), valid for the model; decision.rebalance is false when it equals `config`.
struct ConfigRebalance {
  RebalanceDecision decision;
  ParallelConfig to;
};
// `history`: earlier splits of the same config's dims at the same speeds (the
// `measured` of earlier decisions), for the fixed part.
Result<ConfigRebalance> DecideConfigRebalance(const Model& model, const ParallelConfig& config,
                                              int64_t global_batch,
                                              const std::vector<std::vector<double>>& rank_seconds,
                                              int64_t remaining_steps, double cost_seconds,
                                              const RebalancePolicy& policy = {},
                                              const std::vector<SplitSample>& history = {});

// Equal shares of `units` whole units apportioned by weights (spec §9), per index:
// the shares function of a dimension whose work is one apportioned quantity.
std::vector<double> UnitShares(int64_t units, const std::vector<int>& weights);

}  // namespace tenplex::runtime
