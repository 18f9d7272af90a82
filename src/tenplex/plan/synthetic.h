// Deterministic synthetic PTC contents: an oracle for tests and benchmarks.
//
// Element i (row-major flat index) of global tensor T holds bytes computed from
// (T's name, i, seed) alone, so the expected content of any local tensor of any layout
// follows from the spec without running the planner:
//   key = xxh64(name, seed);  x = mix64(key + i · 0x9E3779B97F4A7C15)   (splitmix64)
//   F64: (x >> 11) · 2^-52 − 1;  F32: (x >> 40) · 2^-23 − 1   (exact, in [−1, 1))
//   BF16: the upper 16 bits of that F32;  F16: sign x>>63, exponent 1 + (x>>50) % 15,
//   mantissa x & 0x3ff (always finite);  integers: the low bytes of x;  BOOL: x & 1.
// Padding is zero.
#pragma once

#include <cstdint>
#include <string_view>

#include "tenplex/geometry/dtype.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/util/status.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::plan {

uint64_t SyntheticKey(std::string_view tensor, uint64_t seed);
// Writes the DTypeSize(dtype) bytes of element `index` of the tensor with this key.
void SyntheticElement(DType dtype, uint64_t key, int64_t index, void* out);

// Fills local tensor t of `layout` (Volume(t.shape) elements at data): every piece's
// elements from their global indices, padding zero.
Status FillSynthetic(const Layout& layout, const LocalTensor& t, uint64_t seed, void* data,
                     ThreadPool* pool = nullptr);

// Checks data against FillSynthetic; DataLoss naming the first differing element.
Status CheckSynthetic(const Layout& layout, const LocalTensor& t, uint64_t seed, const void* data,
                      ThreadPool* pool = nullptr);

}  // namespace tenplex::plan
