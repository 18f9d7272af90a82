// Strided box copy: the hot loop of every reconfiguration.
//
// A copy moves the elements of a box of one row-major tensor into a box of another,
// element i of the source box (in row-major order over the box) to element i of the
// destination box. Both boxes have the same extents E, or one side is a 1-D range of
// the same volume (a flat ZeRO shard), which is the same as a dense tensor of extents E
// starting at the range's first element.
//
// With element strides s (source) and t (destination) for E, the copy is
//   dst[t0 + sum_k i_k t_k] = src[s0 + sum_k i_k s_k]  for all i < E.
// Dimensions of extent 1 are dropped. Starting from the innermost dimension, a
// dimension k joins the contiguous run while s_k == t_k == (product of E over the
// dimensions already in the run): the run is then one memcpy of run*elem bytes, and
// the remaining outer dimensions are walked with an odometer. A copy is thus
// prod(outer E) memcpy calls and never a per-element loop unless the innermost
// dimension itself is strided on a side (it never is for row-major boxes).
//
// Large copies are split across a thread pool: by outer index when there are enough
// runs, otherwise by cutting the single run into chunks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tenplex/geometry/box.h"
#include "tenplex/util/status.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex {

// A region of a row-major tensor in memory: the tensor's shape and a box in it.
struct ConstRegion {
  const void* data;
  Shape shape;
  Box box;
};
struct MutRegion {
  void* data;
  Shape shape;
  Box box;
};

// Copies src.box into dst.box (see above). Checks that the boxes lie inside their
// shapes and correspond (same extents, or one side 1-D of equal volume). With a pool,
// copies larger than `parallel_threshold` bytes are split across it.
Status CopyBox(const ConstRegion& src, const MutRegion& dst, std::size_t elem_size,
               ThreadPool* pool = nullptr, std::size_t parallel_threshold = 1 << 20);

// Sets every byte of the box to zero.
Status ZeroBox(const MutRegion& dst, std::size_t elem_size);

}  // namespace tenplex
