// Deterministic region contents for tests and benchmarks. A region named
// "pattern-<seed>-<bytes>" holds PatternByte(seed, i) at offset i; PatternLookup serves
// such regions (built on first use, kept for the lookup's lifetime), so a test in one
// process can check bytes fetched from a peer process without shipping them.
#pragma once

#include <cstdint>
#include <string>

#include "tenplex/transport/transport.h"

namespace tenplex::transport {

inline uint8_t PatternByte(uint64_t seed, uint64_t i) {
  uint64_t x = (i >> 3) * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint8_t>((x >> ((i & 7) * 8)) ^ (x >> 32));
}

std::string PatternName(uint64_t seed, uint64_t bytes);

// Serves pattern regions up to max_bytes each; NotFound for other names.
RegionLookup PatternLookup(uint64_t max_bytes = 1ull << 30);

}  // namespace tenplex::transport
