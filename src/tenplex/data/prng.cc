#include "tenplex/data/prng.h"

#include <numeric>
#include <utility>

namespace tenplex::data {

uint64_t SplitMix64::Below(uint64_t n) {
  unsigned __int128 m = static_cast<unsigned __int128>(Next()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    while (low < threshold) {
      m = static_cast<unsigned __int128>(Next()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

namespace {

template <typename T>
void FisherYates(std::vector<T>& a, uint64_t n, SplitMix64& rng) {
  a.resize(n);
  std::iota(a.begin(), a.end(), T{0});
  for (uint64_t i = n; i-- > 1;) {
    uint64_t j = rng.Below(i + 1);
    std::swap(a[i], a[j]);
  }
}

}  // namespace

Permutation Permutation::ForEpoch(uint64_t n, uint64_t seed, uint64_t epoch) {
  Permutation p;
  p.n_ = n;
  p.wide_ = n > (uint64_t{1} << 32);
  SplitMix64 rng(EpochState(seed, epoch));
  if (p.wide_) {
    FisherYates(p.p64_, n, rng);
  } else {
    FisherYates(p.p32_, n, rng);
  }
  return p;
}

}  // namespace tenplex::data
