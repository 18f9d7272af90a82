#include "tenplex/data/prng.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>
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

// Fisher-Yates as defined in prng.h. For large n the swaps are random accesses that
// miss the cache, so the draws are made kPrefetch steps ahead (the stream does not
// depend on the array, so the draw order and results are unchanged) and the target
// element is prefetched while the earlier swaps proceed.
template <typename T>
void FisherYates(T* a, uint64_t n, SplitMix64& rng) {
  std::iota(a, a + n, T{0});
  if (n < 2) return;
  constexpr uint64_t kPrefetch = 64;
  const uint64_t draws = n - 1;  // draw k is for i = n-1-k, bound i+1 = n-k
  uint64_t ahead[kPrefetch];
  const uint64_t first = std::min(kPrefetch, draws);
  for (uint64_t k = 0; k < first; ++k) {
    ahead[k] = rng.Below(n - k);
    __builtin_prefetch(&a[ahead[k]], 1);
  }
  for (uint64_t k = 0; k < draws; ++k) {
    const uint64_t slot = k % kPrefetch;
    const uint64_t j = ahead[slot];
    if (k + kPrefetch < draws) {
      ahead[slot] = rng.Below(n - (k + kPrefetch));
      __builtin_prefetch(&a[ahead[slot]], 1);
    }
    std::swap(a[n - 1 - k], a[j]);
  }
}

}  // namespace

Permutation::Permutation(Permutation&& o) noexcept
    : n_(std::exchange(o.n_, 0)),
      wide_(o.wide_),
      mem_(std::exchange(o.mem_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)) {}

Permutation& Permutation::operator=(Permutation&& o) noexcept {
  if (this != &o) {
    Free();
    n_ = std::exchange(o.n_, 0);
    wide_ = o.wide_;
    mem_ = std::exchange(o.mem_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

Permutation::~Permutation() { Free(); }

void Permutation::Free() {
  if (!mem_) return;
  if (bytes_ < kMapBytes) {
    ::operator delete(mem_);
  } else {
    ::munmap(mem_, bytes_);
  }
  mem_ = nullptr;
}

Permutation Permutation::ForEpoch(uint64_t n, uint64_t seed, uint64_t epoch) {
  Permutation p;
  p.n_ = n;
  p.wide_ = n > (uint64_t{1} << 32);
  if (n == 0) return p;
  p.bytes_ = n * (p.wide_ ? 8 : 4);
  if (p.bytes_ < kMapBytes) {
    p.mem_ = ::operator new(p.bytes_);
  } else {
    p.mem_ = ::mmap(nullptr, p.bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p.mem_ == MAP_FAILED) {
      p.mem_ = nullptr;
      throw std::bad_alloc();  // as std::vector would: running out of memory is not an input error
    }
    ::madvise(p.mem_, p.bytes_, MADV_HUGEPAGE);  // a hint; ignored where unsupported
  }
  SplitMix64 rng(EpochState(seed, epoch));
  if (p.wide_) {
    FisherYates(static_cast<uint64_t*>(p.mem_), n, rng);
  } else {
    FisherYates(static_cast<uint32_t*>(p.mem_), n, rng);
  }
  return p;
}

}  // namespace tenplex::data
