#include "tenplex/geometry/box.h"

#include <gtest/gtest.h>

#include <random>

#include "tenplex/geometry/dtype.h"
#include "tenplex/geometry/testing.h"

namespace tenplex {
namespace {

TEST(DTypeTest, NamesAndSizes) {
  for (DType d : kAllDTypes) EXPECT_EQ(*ParseDType(DTypeName(d)), d);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  auto bad = ParseDType("float32");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("float32"), std::string::npos);
}

TEST(BoxTest, IntersectContainsVolume) {
  Box a({{0, 4}, {2, 8}});
  Box b({{2, 6}, {0, 3}});
  Box i = Intersect(a, b);
  EXPECT_EQ(i, Box({{2, 4}, {2, 3}}));
  EXPECT_EQ(Volume(i), 2);
  EXPECT_TRUE(Contains(a, i));
  EXPECT_TRUE(Contains(b, i));
  EXPECT_FALSE(Contains(i, a));
  EXPECT_TRUE(IsEmpty(Intersect(a, Box({{5, 6}, {0, 8}}))));
  EXPECT_EQ(Volume(Box()), 1);  // scalar
  EXPECT_EQ(ToString(a), "[[0,4],[2,8]]");
}

TEST(BoxTest, CheckedVolumeRejectsNegativeAndOverflow) {
  EXPECT_EQ(*CheckedVolume({3, 4}, 4), 12);
  EXPECT_FALSE(CheckedVolume({3, -1}).ok());
  EXPECT_FALSE(CheckedVolume({1LL << 40, 1LL << 30}).ok());
  EXPECT_FALSE(CheckedVolume({1LL << 31, 1LL << 31}, 8).ok());
}

TEST(BoxTest, FlatRangeToBoxesMatchesBruteForce) {
  std::mt19937 rng(1);
  for (int iter = 0; iter < 500; ++iter) {
    Shape shape;
    int rank = 1 + rng() % 4;
    for (int k = 0; k < rank; ++k) shape.push_back(1 + rng() % 5);
    int64_t n = Volume(shape);
    int64_t b = rng() % (n + 1), e = rng() % (n + 1);
    if (b > e) std::swap(b, e);
    std::vector<int64_t> got;
    auto boxes = FlatRangeToBoxes(shape, b, e);
    EXPECT_LE(boxes.size(), static_cast<std::size_t>(2 * rank - 1));
    for (const Box& box : boxes) {
      EXPECT_TRUE(IsContiguous(shape, box)) << ToString(box);
      EXPECT_EQ(FlatOffset(shape, box), got.empty() ? b : got.back() + 1);
      for (int64_t o : testing::BoxOffsets(shape, box)) got.push_back(o);
    }
    std::vector<int64_t> want;
    for (int64_t o = b; o < e; ++o) want.push_back(o);
    EXPECT_EQ(got, want);
  }
}

TEST(BoxTest, ContiguousPartsCoverBoxInOrder) {
  std::mt19937 rng(2);
  for (int iter = 0; iter < 500; ++iter) {
    Shape shape;
    Box box;
    int rank = 1 + rng() % 4;
    for (int k = 0; k < rank; ++k) {
      shape.push_back(1 + rng() % 5);
      int64_t b = rng() % shape.back(), e = b + 1 + rng() % (shape.back() - b);
      box.dims.push_back({b, e});
    }
    std::vector<int64_t> got;
    for (const Box& part : ContiguousParts(shape, box)) {
      EXPECT_TRUE(IsContiguous(shape, part));
      for (int64_t o : testing::BoxOffsets(shape, part)) got.push_back(o);
    }
    EXPECT_EQ(got, testing::BoxOffsets(shape, box));
    auto offs = testing::BoxOffsets(shape, box);
    bool contiguous = true;
    for (std::size_t i = 1; i < offs.size(); ++i) contiguous &= offs[i] == offs[i - 1] + 1;
    EXPECT_EQ(IsContiguous(shape, box), contiguous) << ToString(box);
  }
}

// IntervalVec against std::vector<Interval> as the reference: random push_back, resize,
// copies, moves and comparisons across the inline/heap boundary (ranks 0..8).
TEST(IntervalVecTest, BehavesAsStdVector) {
  std::mt19937 rng(7);
  auto iv = [&] {
    int64_t b = static_cast<int64_t>(rng() % 5);
    return Interval{b, b + static_cast<int64_t>(rng() % 4)};
  };
  auto same = [](const IntervalVec& a, const std::vector<Interval>& r) {
    return std::vector<Interval>(a.begin(), a.end()) == r && a.size() == r.size() &&
           a.empty() == r.empty();
  };
  for (int trial = 0; trial < 2000; ++trial) {
    IntervalVec a;
    std::vector<Interval> ra;
    IntervalVec b;
    std::vector<Interval> rb;
    for (int step = 0; step < 12; ++step) {
      switch (rng() % 7) {
        case 0:
        case 1: {
          Interval x = iv();
          if (ra.size() < 8) a.push_back(x), ra.push_back(x);
          break;
        }
        case 2: {
          std::size_t n = rng() % 9;
          a.resize(n);
          ra.resize(n);
          break;
        }
        case 3:
          b = a, rb = ra;  // copy
          break;
        case 4: {
          IntervalVec moved(std::move(a));
          a = IntervalVec();
          b = std::move(moved), rb = ra, ra.clear();
          break;
        }
        case 5:
          std::swap(a, b), std::swap(ra, rb);
          break;
        case 6:
          a = IntervalVec(ra);  // from a std::vector
          break;
      }
      ASSERT_TRUE(same(a, ra)) << "trial " << trial << " step " << step;
      ASSERT_TRUE(same(b, rb)) << "trial " << trial << " step " << step;
      EXPECT_EQ(a == b, ra == rb);
      EXPECT_EQ(a < b, ra < rb);
      EXPECT_EQ(Box(a) == Box(b), ra == rb);
    }
  }
  // Writes through [] and iteration land in the storage that is read back.
  IntervalVec c = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
  for (Interval& x : c) x.end += 10;
  EXPECT_EQ(c[3], (Interval{6, 17}));
  EXPECT_EQ(c.back(), (Interval{6, 17}));
  EXPECT_EQ(c.size(), 4u);
}

}  // namespace
}  // namespace tenplex
