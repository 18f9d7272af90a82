#include "tenplex/geometry/box.h"

#include <algorithm>
#include <limits>

namespace tenplex {

Shape Box::extents() const {
  Shape s(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) s[i] = std::max<int64_t>(0, dims[i].size());
  return s;
}

int64_t Volume(const Shape& shape) {
  int64_t v = 1;
  for (int64_t d : shape) v *= std::max<int64_t>(0, d);
  return v;
}

int64_t Volume(const Box& box) {
  int64_t v = 1;
  for (const Interval& d : box.dims) v *= std::max<int64_t>(0, d.size());
  return v;
}

Result<int64_t> CheckedVolume(const Shape& shape, int64_t elem_size) {
  int64_t v = elem_size;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    int64_t d = shape[i];
    if (d < 0) {
      return InvalidArgument("negative dimension " + std::to_string(d) + " in shape [" +
                             ShapeToString(shape) + "]");
    }
    if (d != 0 && v > std::numeric_limits<int64_t>::max() / d) {
      return InvalidArgument("shape [" + ShapeToString(shape) + "] overflows 64-bit sizes");
    }
    v *= d;
  }
  return elem_size == 0 ? 0 : v / elem_size;
}

bool IsEmpty(const Box& box) {
  for (const Interval& d : box.dims) {
    if (d.empty()) return true;
  }
  return false;
}

Box BoxOf(const Shape& shape) {
  Box b;
  b.dims.reserve(shape.size());
  for (int64_t d : shape) b.dims.push_back({0, d});
  return b;
}

void IntersectInto(const Box& a, const Box& b, Box& out) {
  out.dims.resize(a.rank());
  for (std::size_t i = 0; i < a.rank(); ++i) {
    out.dims[i].begin = std::max(a[i].begin, b[i].begin);
    out.dims[i].end = std::max(out.dims[i].begin, std::min(a[i].end, b[i].end));
  }
}

Box Intersect(const Box& a, const Box& b) {
  Box r;
  IntersectInto(a, b, r);
  return r;
}

bool Contains(const Box& outer, const Box& inner) {
  if (IsEmpty(inner)) return true;
  if (outer.rank() != inner.rank()) return false;
  for (std::size_t i = 0; i < outer.rank(); ++i) {
    if (inner[i].begin < outer[i].begin || inner[i].end > outer[i].end) return false;
  }
  return true;
}

Box Translate(const Box& box, const std::vector<int64_t>& delta) {
  Box r = box;
  for (std::size_t i = 0; i < r.rank(); ++i) {
    r.dims[i].begin += delta[i];
    r.dims[i].end += delta[i];
  }
  return r;
}

Box MapBox(const Box& sub, const Box& from, const Box& to) {
  Box r = sub;
  for (std::size_t i = 0; i < r.rank(); ++i) {
    int64_t d = to[i].begin - from[i].begin;
    r.dims[i].begin += d;
    r.dims[i].end += d;
  }
  return r;
}

int64_t FlatOffset(const Shape& shape, const Box& box) {
  int64_t off = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) off = off * shape[i] + box[i].begin;
  return off;
}

namespace {

// Index of the outermost dimension from which on (exclusive) every dimension is full.
// Dimensions after the returned index cover all of shape.
std::size_t FirstPartialFromInside(const Shape& shape, const Box& box) {
  std::size_t j = shape.size();
  while (j > 0 && box[j - 1].begin == 0 && box[j - 1].end == shape[j - 1]) --j;
  // dims j.. are full; the run dimension is j-1 (or none if j == 0).
  return j;
}

void FlatRangeRec(const Shape& shape, std::size_t dim, int64_t begin, int64_t end,
                  std::vector<Interval>& prefix, std::vector<Box>& out) {
  if (begin >= end) return;
  std::size_t n = shape.size();
  if (dim == n) {
    out.push_back(Box(prefix));
    return;
  }
  auto full_rest = [&](Interval iv) {
    Box b(prefix);
    b.dims.push_back(iv);
    for (std::size_t k = dim + 1; k < n; ++k) b.dims.push_back({0, shape[k]});
    out.push_back(std::move(b));
  };
  if (dim + 1 == n) {
    full_rest({begin, end});
    return;
  }
  int64_t inner = 1;
  for (std::size_t k = dim + 1; k < n; ++k) inner *= shape[k];
  if (inner == 0) return;
  int64_t rb = begin / inner, ob = begin % inner;
  int64_t re = end / inner, oe = end % inner;
  auto sub = [&](int64_t row, int64_t b, int64_t e) {
    prefix.push_back({row, row + 1});
    FlatRangeRec(shape, dim + 1, b, e, prefix, out);
    prefix.pop_back();
  };
  if (rb == re) {
    sub(rb, ob, oe);
    return;
  }
  if (ob != 0) {
    sub(rb, ob, inner);
    ++rb;
  }
  if (rb < re) full_rest({rb, re});
  if (oe != 0) sub(re, 0, oe);
}

}  // namespace

bool IsContiguous(const Shape& shape, const Box& box) {
  if (IsEmpty(box)) return true;
  std::size_t j = FirstPartialFromInside(shape, box);
  for (std::size_t i = 0; i + 1 < j; ++i) {
    if (box[i].size() != 1) return false;
  }
  return true;
}

std::vector<Box> FlatRangeToBoxes(const Shape& shape, int64_t begin, int64_t end) {
  std::vector<Box> out;
  std::vector<Interval> prefix;
  if (shape.empty()) {
    if (begin < end) out.push_back(Box());
    return out;
  }
  FlatRangeRec(shape, 0, begin, end, prefix, out);
  return out;
}

std::vector<Box> ContiguousParts(const Shape& shape, const Box& box) {
  std::vector<Box> out;
  if (IsEmpty(box)) return out;
  if (IsContiguous(shape, box)) {
    out.push_back(box);
    return out;
  }
  std::size_t j = FirstPartialFromInside(shape, box);
  // Dimensions [0, j-1) are iterated one index at a time; dim j-1 and beyond form runs.
  std::size_t outer = j - 1;
  std::vector<int64_t> idx(outer);
  for (std::size_t i = 0; i < outer; ++i) idx[i] = box[i].begin;
  for (;;) {
    Box b = box;
    for (std::size_t i = 0; i < outer; ++i) b.dims[i] = {idx[i], idx[i] + 1};
    out.push_back(std::move(b));
    std::size_t k = outer;
    while (k > 0) {
      --k;
      if (++idx[k] < box[k].end) break;
      idx[k] = box[k].begin;
      if (k == 0) return out;
    }
    if (outer == 0) return out;
  }
}

std::string ToString(const Box& box) {
  std::string s = "[";
  for (std::size_t i = 0; i < box.rank(); ++i) {
    if (i) s += ',';
    s += '[';
    s += std::to_string(box[i].begin);
    s += ',';
    s += std::to_string(box[i].end);
    s += ']';
  }
  return s + "]";
}

std::string ShapeToString(const Shape& shape) {
  std::string s;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s;
}

}  // namespace tenplex
