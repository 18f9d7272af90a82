// Parallel configurations: "tp=2,pp=2,dp=2[,zero=1][,layers=6+4]" (spec §3).
// Rank order is Megatron's, tensor-parallel fastest:
//   tp_rank = r % tp;  dp_rank = (r / tp) % dp;  pp_rank = r / (tp * dp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tenplex/model/model.h"
#include "tenplex/util/status.h"

namespace tenplex {

struct ParallelConfig {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  bool zero = false;        // ZeRO-1: flat-sharded optimizer state
  std::vector<int> layers;  // layers per pipeline stage; empty means L / pp each

  int world_size() const { return tp * pp * dp; }
  int TpRank(int r) const { return r % tp; }
  int DpRank(int r) const { return (r / tp) % dp; }
  int PpRank(int r) const { return r / (tp * dp); }
  int RankOf(int tp_rank, int dp_rank, int pp_rank) const {
    return tp_rank + tp * (dp_rank + dp * pp_rank);
  }
  // Canonical form: "tp=2,pp=2,dp=1" plus ",zero=1" and ",layers=a+b" when set.
  std::string ToString() const;
  friend bool operator==(const ParallelConfig&, const ParallelConfig&) = default;
};

// Parses a config string. Syntax errors (unknown or repeated keys, non-integers,
// degrees < 1, zero other than 0/1) are InvalidArgument naming the offending part.
Result<ParallelConfig> ParseConfig(std::string_view text);

// The first layer of each stage plus the end: stage s holds layers
// [bounds[s], bounds[s+1]). Fails when L % pp != 0 without layers=, or when layers=
// has the wrong count or sum.
Result<std::vector<int>> StageBounds(const Model& model, const ParallelConfig& config);

// Checks config against model: stage partition, and that tp divides every tensor it
// splits (naming the tensor and the rule, e.g. g % tp for query groups).
Status ValidateConfig(const Model& model, const ParallelConfig& config);

}  // namespace tenplex
