// Sets of boxes for the planner: difference and the volume of a union.
//
// Difference. For boxes A and B with I = A ∩ B non-empty, A \ B is cut dimension by
// dimension: in dimension k (A already clipped to I in dimensions < k) the slab of A
// below I and the slab above I, so at most 2·rank disjoint boxes whose union is A \ B.
//
// Union volume (Klee's measure by a coordinate sweep). The distinct begin/end
// coordinates of all boxes in dimension 0 cut the axis into slabs; inside a slab the
// same boxes are active everywhere, so the measure is width × the union volume of the
// active boxes projected on the remaining dimensions (recursively). Consecutive slabs
// with the same active set reuse the inner volume. Cost O(n^rank) in the worst case,
// a few microseconds for the handful of boxes a host holds of one tensor.
#pragma once

#include <cstdint>
#include <vector>

#include "tenplex/geometry/box.h"

namespace tenplex::plan {

// True when a ∩ b is non-empty (same rank).
bool Intersects(const Box& a, const Box& b);

// a \ b as at most 2·rank disjoint non-empty boxes; {a} when they do not intersect
// (an empty a gives {}).
std::vector<Box> Subtract(const Box& a, const Box& b);

// Removes b from every box of the disjoint set `boxes` (kept disjoint).
void SubtractFrom(std::vector<Box>& boxes, const Box& b);

// Number of elements in the union of the boxes (all of one rank; empty boxes ignored).
// Identical boxes count once; pairwise disjoint ones are summed without a sweep.
int64_t UnionVolume(const std::vector<Box>& boxes);
int64_t UnionVolume(const std::vector<const Box*>& boxes);

}  // namespace tenplex::plan
