#include "tenplex/geometry/copy.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "tenplex/geometry/testing.h"

namespace tenplex {
namespace {

Box RandomBox(std::mt19937& rng, const Shape& shape) {
  Box b;
  for (int64_t d : shape) {
    int64_t s = rng() % d, e = s + 1 + rng() % (d - s);
    b.dims.push_back({s, e});
  }
  return b;
}

TEST(CopyTest, RandomBoxesMatchPerElementReference) {
  std::mt19937 rng(7);
  ThreadPool pool(3);
  for (int iter = 0; iter < 400; ++iter) {
    int rank = 1 + rng() % 4;
    Shape ss, ds;
    for (int k = 0; k < rank; ++k) ss.push_back(1 + rng() % 9);
    Box sb = RandomBox(rng, ss);
    Shape e = sb.extents();
    Box db;
    for (int k = 0; k < rank; ++k) {
      ds.push_back(e[k] + rng() % 4);
      int64_t off = rng() % (ds[k] - e[k] + 1);
      db.dims.push_back({off, off + e[k]});
    }
    std::vector<uint16_t> src(Volume(ss));
    std::iota(src.begin(), src.end(), 1);
    std::vector<uint16_t> dst(Volume(ds), 0), want(Volume(ds), 0);
    auto se = testing::BoxOffsets(ss, sb), de = testing::BoxOffsets(ds, db);
    for (std::size_t i = 0; i < se.size(); ++i) want[de[i]] = src[se[i]];
    ASSERT_TRUE(
        CopyBox({src.data(), ss, sb}, {dst.data(), ds, db}, 2, iter % 2 ? &pool : nullptr, 16)
            .ok());
    EXPECT_EQ(dst, want) << ToString(sb) << " -> " << ToString(db);
  }
}

// The runs, expanded element by element in order, are exactly the per-element mapping
// (i-th element of the source box -> i-th element of the destination box), and the
// random-access offsets agree with the odometer walk.
TEST(CopyTest, PlanCopyRunsMatchPerElementReference) {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 400; ++iter) {
    const int rank = 1 + rng() % 4;
    const int64_t es = 1 + rng() % 4;
    Shape ss, ds;
    for (int k = 0; k < rank; ++k) ss.push_back(1 + rng() % 7);
    Box sb = RandomBox(rng, ss);
    Box db;
    if (iter % 4 == 3) {  // flat destination range
      const int64_t vol = Volume(sb), off = rng() % 5;
      ds = {vol + off + static_cast<int64_t>(rng() % 3)};
      db = Box({{off, off + vol}});
    } else {
      Shape e = sb.extents();
      for (int k = 0; k < rank; ++k) {
        ds.push_back(e[k] + rng() % 3);
        int64_t off = rng() % (ds[k] - e[k] + 1);
        db.dims.push_back({off, off + e[k]});
      }
    }
    auto runs = PlanCopyRuns(ss, sb, ds, db, static_cast<std::size_t>(es));
    ASSERT_TRUE(runs.ok()) << runs.status().ToString();
    EXPECT_EQ(runs->run_bytes * runs->count, Volume(sb) * es);
    std::vector<int64_t> got_src, got_dst;
    int64_t r = 0;
    runs->ForEach(0, runs->count, [&](int64_t so, int64_t dof) {
      EXPECT_EQ(so, runs->SrcOffset(r));
      EXPECT_EQ(dof, runs->DstOffset(r));
      ++r;
      ASSERT_EQ(so % es, 0);
      ASSERT_EQ(dof % es, 0);
      for (int64_t j = 0; j < runs->run_bytes / es; ++j) {
        got_src.push_back(so / es + j);
        got_dst.push_back(dof / es + j);
      }
    });
    EXPECT_EQ(r, runs->count);
    EXPECT_EQ(got_src, testing::BoxOffsets(ss, sb)) << ToString(sb);
    EXPECT_EQ(got_dst, testing::BoxOffsets(ds, db)) << ToString(db);
    // A sub-range of runs walks the same offsets.
    if (runs->count > 2) {
      int64_t first = 1, seen = 0;
      runs->ForEach(first, runs->count - 1, [&](int64_t so, int64_t dof) {
        EXPECT_EQ(so, runs->SrcOffset(first + seen));
        EXPECT_EQ(dof, runs->DstOffset(first + seen));
        ++seen;
      });
      EXPECT_EQ(seen, runs->count - 2);
    }
  }
  // Errors are those of CopyBox.
  EXPECT_EQ(PlanCopyRuns({3, 4}, Box({{0, 4}, {0, 4}}), {3, 4}, BoxOf({3, 4}), 4).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(
      PlanCopyRuns({4, 4}, Box({{0, 2}, {0, 4}}), {4, 4}, Box({{0, 4}, {0, 2}}), 4).status().code(),
      StatusCode::kInvalidArgument);
  auto empty = PlanCopyRuns({3, 4}, Box({{1, 1}, {0, 4}}), {3, 4}, Box({{0, 0}, {0, 4}}), 4);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->count, 0);
}

TEST(CopyTest, FlatRangeEitherSide) {
  std::mt19937 rng(9);
  for (int iter = 0; iter < 200; ++iter) {
    Shape ss = {static_cast<int64_t>(1 + rng() % 6), static_cast<int64_t>(1 + rng() % 6),
                static_cast<int64_t>(1 + rng() % 6)};
    Box sb = RandomBox(rng, ss);
    int64_t vol = Volume(sb);
    Shape flat = {vol + 5};
    int64_t off = rng() % 6;
    std::vector<float> src(Volume(ss));
    std::iota(src.begin(), src.end(), 0.5f);
    std::vector<float> dst(flat[0], -1.f);
    ASSERT_TRUE(CopyBox({src.data(), ss, sb}, {dst.data(), flat, Box({{off, off + vol}})}, 4).ok());
    auto se = testing::BoxOffsets(ss, sb);
    for (int64_t i = 0; i < vol; ++i) EXPECT_EQ(dst[off + i], src[se[i]]);
    // And back into a zeroed tensor.
    std::vector<float> back(Volume(ss), 0.f);
    ASSERT_TRUE(
        CopyBox({dst.data(), flat, Box({{off, off + vol}})}, {back.data(), ss, sb}, 4).ok());
    for (int64_t i = 0; i < vol; ++i) EXPECT_EQ(back[se[i]], src[se[i]]);
  }
}

TEST(CopyTest, LargeContiguousSplitAcrossThreads) {
  ThreadPool pool(2);
  Shape s = {3, 1 << 18};
  std::vector<uint8_t> src(Volume(s)), dst(Volume(s), 0);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 31 + 7);
  ASSERT_TRUE(CopyBox({src.data(), s, BoxOf(s)}, {dst.data(), s, BoxOf(s)}, 1, &pool, 1024).ok());
  EXPECT_EQ(src, dst);
}

TEST(CopyTest, RejectsBadBoxes) {
  std::vector<float> a(12), b(12);
  Shape s = {3, 4};
  EXPECT_EQ(CopyBox({a.data(), s, Box({{0, 4}, {0, 4}})}, {b.data(), s, BoxOf(s)}, 4).code(),
            StatusCode::kOutOfRange);
  EXPECT_FALSE(
      CopyBox({a.data(), s, Box({{0, 2}, {0, 4}})}, {b.data(), s, Box({{0, 4}, {0, 2}})}, 4).ok());
  EXPECT_FALSE(CopyBox({a.data(), s, Box({{0, 2}})}, {b.data(), s, BoxOf(s)}, 4).ok());
}

TEST(CopyTest, ZeroBox) {
  std::vector<int32_t> a(12, 5);
  ASSERT_TRUE(ZeroBox({a.data(), {3, 4}, Box({{1, 3}, {1, 3}})}, 4).ok());
  std::vector<int32_t> want = {5, 5, 5, 5, 5, 0, 0, 5, 5, 0, 0, 5};
  EXPECT_EQ(a, want);
}

}  // namespace
}  // namespace tenplex
