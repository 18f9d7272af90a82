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
#include <vector>

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

// The runs of a box copy (see above): `count` runs of `run_bytes` contiguous bytes each.
// Run r (in row-major order over the outer dimensions) starts `SrcOffset(r)` bytes after
// the source tensor's first byte and `DstOffset(r)` bytes after the destination's. This
// is the one place that decomposes a box copy: CopyBox walks it with memcpy, and the
// transport turns it into remote reads.
struct CopyRuns {
  int64_t run_bytes = 0;
  int64_t count = 0;                              // 0 when the boxes are empty
  int64_t src_begin = 0, dst_begin = 0;           // byte offsets of run 0
  std::vector<int64_t> extents;                   // outer dimensions, outermost first
  std::vector<int64_t> src_strides, dst_strides;  // bytes per step of each outer dimension

  // Calls fn(src_offset, dst_offset) for runs [first, last) in order, with an odometer
  // (no division per run). REQUIRES: 0 <= first <= last <= count.
  template <typename Fn>
  void ForEach(int64_t first, int64_t last, Fn&& fn) const;
  int64_t SrcOffset(int64_t r) const;
  int64_t DstOffset(int64_t r) const;
};

// Plans the copy of src_box (in a row-major tensor of src_shape) into dst_box, with the
// checks of CopyBox: boxes inside their shapes, same extents or one side a 1-D range of
// equal volume.
Result<CopyRuns> PlanCopyRuns(const Shape& src_shape, const Box& src_box, const Shape& dst_shape,
                              const Box& dst_box, std::size_t elem_size);

// Copies src.box into dst.box (see above). Checks that the boxes lie inside their
// shapes and correspond (same extents, or one side 1-D of equal volume). With a pool,
// copies larger than `parallel_threshold` bytes are split across it.
Status CopyBox(const ConstRegion& src, const MutRegion& dst, std::size_t elem_size,
               ThreadPool* pool = nullptr, std::size_t parallel_threshold = 1 << 20);

// Sets every byte of the box to zero.
Status ZeroBox(const MutRegion& dst, std::size_t elem_size);

template <typename Fn>
void CopyRuns::ForEach(int64_t first, int64_t last, Fn&& fn) const {
  if (first >= last) return;
  const std::size_t n = extents.size();
  std::vector<int64_t> idx(n, 0);
  int64_t rem = first, so = src_begin, dof = dst_begin;
  for (std::size_t k = n; k > 0; --k) {
    idx[k - 1] = rem % extents[k - 1];
    rem /= extents[k - 1];
    so += idx[k - 1] * src_strides[k - 1];
    dof += idx[k - 1] * dst_strides[k - 1];
  }
  for (int64_t r = first; r < last; ++r) {
    fn(so, dof);
    for (std::size_t k = n; k > 0; --k) {
      so += src_strides[k - 1];
      dof += dst_strides[k - 1];
      if (++idx[k - 1] < extents[k - 1]) break;
      so -= src_strides[k - 1] * extents[k - 1];
      dof -= dst_strides[k - 1] * extents[k - 1];
      idx[k - 1] = 0;
    }
  }
}

}  // namespace tenplex
