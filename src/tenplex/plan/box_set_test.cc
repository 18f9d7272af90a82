// The box-set maths (Subtract, UnionVolume) against brute force over a small grid.
#include "tenplex/plan/box_set.h"

#include <gtest/gtest.h>

#include <random>

#include "tenplex/geometry/testing.h"

namespace tenplex::plan {
namespace {

using ::tenplex::testing::Unravel;

// Brute force over a small grid for the box-set maths.
TEST(BoxSetTest, SubtractAndUnionMatchBruteForce) {
  std::mt19937 rng(5);
  auto random_box = [&](int rank) {
    Box b;
    for (int k = 0; k < rank; ++k) {
      int64_t x = rng() % 7, y = rng() % 7;
      b.dims.push_back({std::min(x, y), std::max(x, y) + static_cast<int64_t>(rng() % 2)});
    }
    return b;
  };
  auto inside = [](const Box& b, const std::vector<int64_t>& p) {
    for (std::size_t k = 0; k < p.size(); ++k) {
      if (p[k] < b[k].begin || p[k] >= b[k].end) return false;
    }
    return true;
  };
  for (int n = 0; n < 400; ++n) {
    const int rank = 1 + static_cast<int>(rng() % 3);
    const Shape grid(rank, 8);
    Box a = random_box(rank), b = random_box(rank);
    std::vector<Box> diff = Subtract(a, b);
    std::vector<Box> many;
    for (int i = 0; i < 1 + static_cast<int>(rng() % 5); ++i) many.push_back(random_box(rank));
    int64_t uv = 0;
    for (int64_t f = 0; f < Volume(grid); ++f) {
      auto p = Unravel(f, grid);
      int hits = 0;
      for (const Box& d : diff) hits += inside(d, p);
      EXPECT_EQ(hits, inside(a, p) && !inside(b, p) ? 1 : 0)
          << ToString(a) << " \\ " << ToString(b);
      bool any = false;
      for (const Box& m : many) any = any || inside(m, p);
      uv += any;
    }
    for (const Box& d : diff) EXPECT_FALSE(IsEmpty(d));
    EXPECT_LE(diff.size(), 2u * rank);
    EXPECT_EQ(UnionVolume(many), uv);
  }
}

}  // namespace
}  // namespace tenplex::plan
