#include "tenplex/util/apportion.h"

#include <algorithm>
#include <charconv>
#include <numeric>

#include "tenplex/util/format.h"

namespace tenplex {

std::vector<int64_t> Apportion(int64_t units, const std::vector<int>& weights) {
  const std::size_t n = weights.size();
  __int128 total = 0;
  for (int w : weights) total += w;
  std::vector<int64_t> count(n);
  std::vector<__int128> rem(n);
  int64_t given = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const __int128 q = static_cast<__int128>(units) * weights[i];
    count[i] = static_cast<int64_t>(q / total);
    rem[i] = q % total;
    given += count[i];
  }
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Largest remainder first; stable keeps the lower rank first on ties.
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return rem[a] > rem[b]; });
  for (int64_t k = 0; k < units - given; ++k) ++count[order[k]];
  return count;
}

UnitRange ApportionRange(int64_t units, const std::vector<int>& weights, int rank) {
  const std::vector<int64_t> count = Apportion(units, weights);
  UnitRange r;
  for (int i = 0; i < rank; ++i) r.begin += count[i];
  r.end = r.begin + count[rank];
  return r;
}

std::string JoinWeights(const std::vector<int>& weights) {
  std::string s;
  for (std::size_t i = 0; i < weights.size(); ++i) s += (i ? "+" : "") + std::to_string(weights[i]);
  return s;
}

Result<std::vector<int>> ParseWeights(std::string_view text, const std::string& what) {
  std::vector<int> w;
  for (std::string_view part : SplitString(text, '+')) {
    int v = 0;
    auto [p, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc() || p != part.data() + part.size() || v < 1 ||
        v > kMaxWeight) {
      return InvalidArgument(what + "=" + std::string(text) + ": weights must be integers in [1, " +
                             std::to_string(kMaxWeight) + "] joined by '+' (got '" +
                             std::string(part) + "')");
    }
    w.push_back(v);
  }
  return w;
}

}  // namespace tenplex
