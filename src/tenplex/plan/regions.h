// Regions of the planner: where a sub-box of a piece's global box sits in its local tensor.
//
// A piece maps a global box G onto a local region of the same extents (a box), or, in a
// ZeRO-1 flat shard, onto a 1-D range in row-major order over G (spec §6). A sub-box of
// G is one range only when it is contiguous in G's dense extents, so a part is cut into
// ContiguousParts relative to G whenever its source or destination side is flat; every
// op's region is then one box or one range. A Site is one side of a copy: a piece's
// global box and local region in (layout, rank, local tensor).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tenplex/geometry/box.h"

namespace tenplex::plan {

// True when a (global, local) pair maps a box onto a 1-D range of a flat local tensor
// rather than onto a box of the same extents.
bool IsFlat(const Box& global, const Box& local);

// Where elements live: a global box and its local region in (layout, rank, tensor).
struct Site {
  const Box* global;
  const Box* local;
  int32_t rank;
  int32_t tensor;
  int32_t host;
  bool is_new;
  int64_t after;  // is_new: the op that filled the region
  bool flat;
};

Site MakeSite(const Box& global, const Box& local, int32_t rank, int32_t tensor, int32_t host,
              bool is_new, int64_t after);

// The local region of `part` (a sub-box of site.global, contiguous in it when flat).
Box RegionOf(const Box& part, const Site& s);

// Appends to `out` the parts of box (inside site.global) that are one region each on the
// site: box itself unless the site is flat.
void SplitFor(const Box& box, const Site& s, std::vector<Box>& out);

// Calls fn(part) for the parts of box that are one region on both sites (box itself
// unless a side is flat), in row-major order.
template <typename Fn>
void ForEachPart(Box box, const Site& a, const Site& b, Fn&& fn) {
  if (!a.flat && !b.flat) {
    fn(std::move(box));
    return;
  }
  std::vector<Box> first, out;
  SplitFor(box, a, first);
  for (const Box& p : first) SplitFor(p, b, out);
  for (Box& p : out) fn(std::move(p));
}

}  // namespace tenplex::plan
