// The random numbers behind the global sample order. Everything here is fixed by this
// file and docs/data.md so that other implementations (python/tenplex/data.py) produce
// the same permutation bit for bit; changing any constant changes every job's order.
//
// Generator: SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number
// generators", OOPSLA 2014). State s is a 64-bit word; Next() does s += G and returns
// Mix64(s), all arithmetic modulo 2^64, where
//   G      = 0x9E3779B97F4A7C15
//   Mix64(z): z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
//             z = (z ^ (z >> 27)) * 0x94D049BB133111EB
//             return z ^ (z >> 31)
// Mix64 is a bijection of 64-bit words with Mix64(0) = 0.
//
// Stream of epoch e under seed S: initial state Mix64(Mix64(S) ^ e). For a fixed seed,
// different epochs start from different states (Mix64 is a bijection).
//
// Uniform integer in [0, n) (n >= 1), Lemire's "nearly divisionless" method (ACM TOMACS
// 2019): x = Next(); m = x * n as a 128-bit product; l = m mod 2^64; if l < n, let
// t = (2^64 - n) mod n and while l < t draw again (x = Next(), recompute m and l);
// the result is m >> 64. Exactly uniform; the rejection happens with probability < n/2^64.
//
// Permutation of epoch e over n samples (Fisher-Yates, Durstenfeld's form): start with
// a[k] = k; for i = n-1 down to 1: j = Uniform(i + 1); swap a[i] and a[j]. Exactly
// n - 1 uniform draws (plus rare rejections), so the stream position is deterministic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tenplex::data {

inline constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;

constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next() {
    state_ += kSplitMixGamma;
    return Mix64(state_);
  }
  // Uniform in [0, n). REQUIRES: n >= 1.
  uint64_t Below(uint64_t n);

 private:
  uint64_t state_;
};

// The initial state of epoch `epoch`'s stream under `seed`.
constexpr uint64_t EpochState(uint64_t seed, uint64_t epoch) { return Mix64(Mix64(seed) ^ epoch); }

// The order of one epoch: a permutation of [0, n). Stored as 32-bit ids when n fits
// (half the memory and memory traffic of 64-bit ids), 64-bit otherwise, in anonymous
// memory that asks for transparent huge pages when large (the shuffle's random swaps
// would otherwise miss the TLB on nearly every access). Move-only; immutable after
// construction, so concurrent readers are safe.
class Permutation {
 public:
  Permutation() = default;
  Permutation(Permutation&& o) noexcept;
  Permutation& operator=(Permutation&& o) noexcept;
  Permutation(const Permutation&) = delete;
  Permutation& operator=(const Permutation&) = delete;
  ~Permutation();

  // The Fisher-Yates permutation of epoch `epoch` under `seed` (see above).
  static Permutation ForEpoch(uint64_t n, uint64_t seed, uint64_t epoch);

  uint64_t size() const { return n_; }
  uint64_t operator[](uint64_t i) const {
    return wide_ ? static_cast<const uint64_t*>(mem_)[i] : static_cast<const uint32_t*>(mem_)[i];
  }

 private:
  // At least this many bytes: anonymous map with MADV_HUGEPAGE; fewer: operator new
  // (a map per small permutation would cost more in system calls than it saves).
  static constexpr std::size_t kMapBytes = 4u << 20;
  void Free();

  uint64_t n_ = 0;
  bool wide_ = false;
  void* mem_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace tenplex::data
