// Parallel configurations: "tp=2,pp=2,dp=2[,zero=1][,layers=6+4]" (spec §3), and the
// uneven splits of spec §9: "tp_weights=3+1" (tp rank t's share of every tensor-parallel
// split is proportional to w_t, by largest-remainder apportionment, util/apportion.h)
// and "dp_weights=2+1+1" (dp rank j's share of every global batch).
// Rank order is Megatron's, tensor-parallel fastest:
//   tp_rank = r % tp;  dp_rank = (r / tp) % dp;  pp_rank = r / (tp * dp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tenplex/model/model.h"
#include "tenplex/util/apportion.h"
#include "tenplex/util/status.h"

namespace tenplex {

struct ParallelConfig {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  bool zero = false;            // ZeRO-1: flat-sharded optimizer state
  std::vector<int> layers;      // layers per pipeline stage; empty means L / pp each
  std::vector<int> tp_weights;  // spec §9: tp positive weights; empty means all equal
  std::vector<int> dp_weights;  // spec §9: dp positive weights; empty means all equal

  int world_size() const { return tp * pp * dp; }
  int TpRank(int r) const { return r % tp; }
  int DpRank(int r) const { return (r / tp) % dp; }
  int PpRank(int r) const { return r / (tp * dp); }
  int RankOf(int tp_rank, int dp_rank, int pp_rank) const {
    return tp_rank + tp * (dp_rank + dp * pp_rank);
  }
  // "tp=2,pp=2,dp=1" plus ",zero=1", ",layers=a+b", ",tp_weights=..." and
  // ",dp_weights=..." when set (weights as given; CanonicalConfig drops redundant ones).
  std::string ToString() const;
  // Weights of the tp (dp) ranks, all 1 when none are given.
  std::vector<int> TpWeights() const;
  std::vector<int> DpWeights() const;
  friend bool operator==(const ParallelConfig&, const ParallelConfig&) = default;
};

// Parses a config string. Syntax errors (unknown or repeated keys, non-integers,
// degrees < 1, zero other than 0/1, weights < 1 or not exactly tp (dp) of them) are
// InvalidArgument naming the offending part.
Result<ParallelConfig> ParseConfig(std::string_view text);

// The first layer of each stage plus the end: stage s holds layers
// [bounds[s], bounds[s+1]). Fails when L % pp != 0 without layers=, or when layers=
// has the wrong count or sum.
Result<std::vector<int>> StageBounds(const Model& model, const ParallelConfig& config);

// Checks config against model: stage partition, and that tp divides every tensor it
// splits (naming the tensor and the rule, e.g. g % tp for query groups); with
// tp_weights instead, that every tp rank gets at least one unit of every split tensor
// (naming the tensor and the rank).
Status ValidateConfig(const Model& model, const ParallelConfig& config);

// Spec §9 canonical form: drops dp_weights when all equal, and tp_weights when all
// equal and the v1 even split applies (every split divisible by tp); the layout is the
// same either way.
ParallelConfig CanonicalConfig(const Model& model, const ParallelConfig& config);

// The units of tensor t's tensor-parallel split (spec §9 table): `units` along the
// split dim per block, `unit` elements of that dim each. Replicated tensors: 0 units.
struct TpUnits {
  int64_t units = 0;
  int64_t unit = 1;
  const char* what = "rows";  // for messages: "query groups", "vocabulary units", ...
};
TpUnits TpUnitsOf(const TensorDesc& t, int tp);

// Tp rank `tp_rank`'s units [begin, end) of tensor t under config: the even split
// without tp_weights, else Apportion(units, tp_weights).
UnitRange TpUnitRange(const TensorDesc& t, const ParallelConfig& config, int tp_rank);

}  // namespace tenplex
