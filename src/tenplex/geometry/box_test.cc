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

}  // namespace
}  // namespace tenplex
