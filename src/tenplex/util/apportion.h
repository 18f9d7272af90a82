// Largest-remainder apportionment (spec ptc-layout.md §9): how U whole units are split
// over ranks in proportion to positive integer weights w.
//
// With W = sum(w), rank i first gets floor(U * w_i / W) units. The R = U - sum(floors)
// units left over (R < number of ranks) go one each to the R ranks with the largest
// remainders (U * w_i mod W), ties to the lower rank. Rank i holds the contiguous units
// [offset_i, offset_i + n_i) with offsets the prefix sums of the counts. Weights are
// not reduced: 6+2 and 3+1 give the same counts, since remainders scale with W. With
// equal weights this is the even split when ranks divide U, and otherwise gives the
// first U mod n ranks one unit more.
//
// Products U * w_i are computed in 128 bits, so any int64 U and int weights are exact.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tenplex/util/status.h"

namespace tenplex {

// Unit counts per rank. REQUIRES: units >= 0, weights non-empty and all >= 1.
std::vector<int64_t> Apportion(int64_t units, const std::vector<int>& weights);

// Rank i's units [begin, end) of Apportion(units, weights).
struct UnitRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
UnitRange ApportionRange(int64_t units, const std::vector<int>& weights, int rank);

// "3+1": weights joined by '+', as in config strings.
std::string JoinWeights(const std::vector<int>& weights);

// Parses "3+1" into weights, each an integer in [1, kMaxWeight]; errors name `what`
// ("config: tp_weights", "--dp-weights").
inline constexpr int kMaxWeight = 1000000;
Result<std::vector<int>> ParseWeights(std::string_view text, const std::string& what);

}  // namespace tenplex
