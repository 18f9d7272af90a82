// Brute-force index helpers for tests: independent of the box maths they check.
#pragma once

#include <cstdint>
#include <vector>

#include "tenplex/geometry/box.h"

namespace tenplex::testing {

// Multi-index of row-major flat index `flat` in `shape`.
inline std::vector<int64_t> Unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (std::size_t k = shape.size(); k > 0; --k) {
    idx[k - 1] = flat % shape[k - 1];
    flat /= shape[k - 1];
  }
  return idx;
}

// Row-major flat index of a multi-index.
inline int64_t Ravel(const std::vector<int64_t>& idx, const Shape& shape) {
  int64_t f = 0;
  for (std::size_t k = 0; k < shape.size(); ++k) f = f * shape[k] + idx[k];
  return f;
}

// Flat offsets in `shape` of the elements of `box`, in row-major order over the box,
// enumerated one element at a time.
inline std::vector<int64_t> BoxOffsets(const Shape& shape, const Box& box) {
  std::vector<int64_t> out;
  if (IsEmpty(box)) return out;
  std::vector<int64_t> idx(shape.size());
  for (std::size_t k = 0; k < shape.size(); ++k) idx[k] = box[k].begin;
  for (;;) {
    out.push_back(Ravel(idx, shape));
    std::size_t k = shape.size();
    for (;;) {
      if (k == 0) return out;
      --k;
      if (++idx[k] < box[k].end) break;
      idx[k] = box[k].begin;
    }
  }
}

}  // namespace tenplex::testing
