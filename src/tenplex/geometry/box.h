// Shapes and boxes. A box is a half-open interval [begin, end) per dimension of a
// row-major tensor; the maths lives in free functions (Intersect, Contains, Volume)
// as in tensorstore. A box of rank 0 is the single element of a scalar.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tenplex/util/status.h"

namespace tenplex {

using Shape = std::vector<int64_t>;

struct Interval {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  friend bool operator==(const Interval&, const Interval&) = default;
  friend auto operator<=>(const Interval&, const Interval&) = default;
};

struct Box {
  std::vector<Interval> dims;

  Box() = default;
  explicit Box(std::vector<Interval> d) : dims(std::move(d)) {}
  std::size_t rank() const { return dims.size(); }
  const Interval& operator[](std::size_t i) const { return dims[i]; }
  Interval& operator[](std::size_t i) { return dims[i]; }
  // Extents per dimension.
  Shape extents() const;
  friend bool operator==(const Box&, const Box&) = default;
  friend auto operator<=>(const Box&, const Box&) = default;
};

// Number of elements; 1 for rank 0. Overflow-checked shapes only (see CheckedVolume).
int64_t Volume(const Shape& shape);
int64_t Volume(const Box& box);
// Volume with checks: every dim >= 0 and the product (times elem_size) fits int64.
Result<int64_t> CheckedVolume(const Shape& shape, int64_t elem_size = 1);
bool IsEmpty(const Box& box);
// The box [0, shape).
Box BoxOf(const Shape& shape);
// The intersection; empty (some dim with end <= begin) when disjoint. Same rank required.
Box Intersect(const Box& a, const Box& b);
// The same into out, reusing its storage (a loop's scratch box).
void IntersectInto(const Box& a, const Box& b, Box& out);
// True when inner lies inside outer (an empty inner is contained everywhere).
bool Contains(const Box& outer, const Box& inner);
// box translated by delta per dimension.
Box Translate(const Box& box, const std::vector<int64_t>& delta);
// Maps sub, a sub-box of `from`, to the box with the same offsets inside `to` (which
// has the same extents as `from`).
Box MapBox(const Box& sub, const Box& from, const Box& to);

// Row-major element offset of the first element of `box` within `shape`.
int64_t FlatOffset(const Shape& shape, const Box& box);
// True when the elements of box are one contiguous run in row-major order of shape.
bool IsContiguous(const Shape& shape, const Box& box);
// Splits the flat range [begin, end) of a tensor of `shape` into boxes that are each
// contiguous in row-major order, in increasing order (at most 2*rank-1 boxes).
std::vector<Box> FlatRangeToBoxes(const Shape& shape, int64_t begin, int64_t end);
// Splits box into boxes that are each contiguous in shape, in row-major order.
std::vector<Box> ContiguousParts(const Shape& shape, const Box& box);

// "[[0,4],[2,8]]"
std::string ToString(const Box& box);
// "4,8"
std::string ShapeToString(const Shape& shape);

}  // namespace tenplex
