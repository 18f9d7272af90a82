#include "tenplex/plan/regions.h"

#include <algorithm>

namespace tenplex::plan {
namespace {

// Row-major offset of part's first element inside the dense extents of `outer`.
int64_t RelOffset(const Box& part, const Box& outer) {
  int64_t off = 0;
  for (std::size_t k = 0; k < outer.rank(); ++k)
    off = off * outer[k].size() + (part[k].begin - outer[k].begin);
  return off;
}

}  // namespace

bool IsFlat(const Box& global, const Box& local) {
  if (local.rank() != global.rank()) return true;
  for (std::size_t k = 0; k < global.rank(); ++k) {
    if (local[k].size() != global[k].size()) return true;
  }
  return false;
}

Site MakeSite(const Box& global, const Box& local, int32_t rank, int32_t tensor, int32_t host,
              bool is_new, int64_t after) {
  return {&global, &local, rank, tensor, host, is_new, after, IsFlat(global, local)};
}

Box RegionOf(const Box& part, const Site& s) {
  if (!s.flat) return MapBox(part, *s.global, *s.local);
  const int64_t off = (*s.local)[0].begin + RelOffset(part, *s.global);
  return Box({{off, off + Volume(part)}});
}

void SplitFor(const Box& box, const Site& s, std::vector<Box>& out) {
  if (!s.flat) {
    out.push_back(box);
    return;
  }
  const Box& g = *s.global;
  Shape ext = g.extents();
  std::vector<int64_t> neg(g.rank());
  for (std::size_t k = 0; k < g.rank(); ++k) neg[k] = -g[k].begin;
  std::vector<int64_t> pos(g.rank());
  for (std::size_t k = 0; k < g.rank(); ++k) pos[k] = g[k].begin;
  for (const Box& p : ContiguousParts(ext, Translate(box, neg))) out.push_back(Translate(p, pos));
}

}  // namespace tenplex::plan
