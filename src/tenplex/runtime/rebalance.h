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
// Model. Rank r = (t, d, p) does the fraction s_tp[t]·s_dp[d]·s_pp[p] of the job's work;
// its measured seconds per unit of work is tau_r = median(rank_seconds_r) / that
// fraction (the median over the window resists a noisy step). A synchronous step lasts
// about as long as its slowest rank, so a split's predicted step time is
// max_r tau_r · share_r. The ideal bound (every device busy all the time) is
// 1 / sum_r (1 / tau_r) times the world's replicated structure; the policy does not need
// it, the benchmark reports it.
//
// Search. One dimension at a time (tp, then dp, then pp, then tp again): the target share
// of index i is proportional to 1 / max over the ranks at index i of tau_r times their
// shares in the other dimensions (the slowest device at that index sets its pace).
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
// rebalances once and then stays; a change of speeds (a schedule `slowdown` entry)
// makes (b) and (c) true again.
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

struct RebalanceInput {
  std::array<SplitDim, 3> dims;                   // tp, dp, pp (rank order: tp fastest)
  std::vector<std::vector<double>> rank_seconds;  // per step of the window, per rank
  int64_t remaining_steps = 0;
  double cost_seconds = 0;  // measured (or estimated) seconds of one reconfiguration
};

struct RebalancePolicy {
  double min_step_gain = 0.08;  // relative step-time gain below which nothing changes
  double cost_margin = 1.0;     // the gain must exceed cost_seconds times this
  int max_weight = 32;          // largest weight tried when rounding target shares
  int min_window = 2;           // steps needed before any decision
};

struct RebalanceDecision {
  bool rebalance = false;
  std::array<std::vector<int>, 3> weights;  // the proposed split (the current one if none)
  std::vector<double> rank_seconds;         // median per rank over the window
  double current_step_s = 0, predicted_step_s = 0;
  double predicted_gain_s = 0, cost_s = 0;
  std::string reason;  // why (not)
};

// The ranks' predicted seconds for `weights` given measured medians under `current`.
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
Result<ConfigRebalance> DecideConfigRebalance(const Model& model, const ParallelConfig& config,
                                              int64_t global_batch,
                                              const std::vector<std::vector<double>>& rank_seconds,
                                              int64_t remaining_steps, double cost_seconds,
                                              const RebalancePolicy& policy = {});

// Equal shares of `units` whole units apportioned by weights (spec §9), per index:
// the shares function of a dimension whose work is one apportioned quantity.
std::vector<double> UnitShares(int64_t units, const std::vector<int>& weights);

}  // namespace tenplex::runtime
