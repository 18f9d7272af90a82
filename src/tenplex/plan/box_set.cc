#include "tenplex/plan/box_set.h"

#include <algorithm>

namespace tenplex::plan {

bool Intersects(const Box& a, const Box& b) {
  for (std::size_t k = 0; k < a.rank(); ++k) {
    if (std::max(a[k].begin, b[k].begin) >= std::min(a[k].end, b[k].end)) return false;
  }
  return true;
}

std::vector<Box> Subtract(const Box& a, const Box& b) {
  std::vector<Box> out;
  if (IsEmpty(a)) return out;
  const Box inter = Intersect(a, b);
  if (IsEmpty(inter)) {
    out.push_back(a);
    return out;
  }
  Box cur = a;
  for (std::size_t k = 0; k < a.rank(); ++k) {
    if (cur[k].begin < inter[k].begin) {
      Box lo = cur;
      lo[k].end = inter[k].begin;
      out.push_back(std::move(lo));
    }
    if (inter[k].end < cur[k].end) {
      Box hi = cur;
      hi[k].begin = inter[k].end;
      out.push_back(std::move(hi));
    }
    cur[k] = inter[k];
  }
  return out;
}

void SubtractFrom(std::vector<Box>& boxes, const Box& b) {
  std::vector<Box> out;
  bool changed = false;
  for (const Box& a : boxes) {
    if (IsEmpty(a) || !Intersects(a, b)) continue;
    changed = true;
    break;
  }
  if (!changed) return;
  out.reserve(boxes.size() + 2 * b.rank());
  for (const Box& a : boxes) {
    for (Box& part : Subtract(a, b)) out.push_back(std::move(part));
  }
  boxes = std::move(out);
}

namespace {

int64_t UnionRec(const std::vector<const Box*>& boxes, std::size_t dim) {
  if (boxes.empty()) return 0;
  const std::size_t rank = boxes[0]->rank();
  if (dim == rank) return 1;
  std::vector<int64_t> coords;
  coords.reserve(boxes.size() * 2);
  for (const Box* b : boxes) {
    coords.push_back((*b)[dim].begin);
    coords.push_back((*b)[dim].end);
  }
  std::sort(coords.begin(), coords.end());
  coords.erase(std::unique(coords.begin(), coords.end()), coords.end());
  int64_t total = 0, inner = 0;
  std::vector<const Box*> active, prev;
  for (std::size_t i = 0; i + 1 < coords.size(); ++i) {
    const int64_t lo = coords[i], hi = coords[i + 1];
    active.clear();
    for (const Box* b : boxes) {
      if ((*b)[dim].begin <= lo && (*b)[dim].end >= hi) active.push_back(b);
    }
    if (active.empty()) {
      prev.clear();
      continue;
    }
    if (active != prev) {
      inner = dim + 1 == rank ? 1 : UnionRec(active, dim + 1);
      prev = active;
    }
    total += (hi - lo) * inner;
  }
  return total;
}

}  // namespace

int64_t UnionVolume(const std::vector<Box>& boxes) {
  std::vector<const Box*> ptrs;
  ptrs.reserve(boxes.size());
  for (const Box& b : boxes) ptrs.push_back(&b);
  return UnionVolume(ptrs);
}

int64_t UnionVolume(const std::vector<const Box*>& boxes) {
  std::vector<const Box*> live;
  live.reserve(boxes.size());
  for (const Box* b : boxes) {
    if (!IsEmpty(*b)) live.push_back(b);
  }
  if (live.empty()) return 0;
  // Identical boxes (replicas) count once; dropping them keeps the sweep small.
  std::sort(live.begin(), live.end(), [](const Box* a, const Box* b) { return *a < *b; });
  live.erase(
      std::unique(live.begin(), live.end(), [](const Box* a, const Box* b) { return *a == *b; }),
      live.end());
  // Few pairwise disjoint boxes (tensor-parallel shards): the sum of their volumes.
  constexpr std::size_t kPairwise = 32;
  bool disjoint = live.size() <= kPairwise;
  for (std::size_t x = 0; disjoint && x < live.size(); ++x) {
    for (std::size_t y = x + 1; disjoint && y < live.size(); ++y)
      disjoint = !Intersects(*live[x], *live[y]);
  }
  if (disjoint) {
    int64_t total = 0;
    for (const Box* b : live) total += Volume(*b);
    return total;
  }
  return UnionRec(live, 0);
}

}  // namespace tenplex::plan
