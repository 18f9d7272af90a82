// The synthetic checkpoint content: FillSynthetic against per-element slicing of the
// global tensors, and the values themselves (finite, deterministic, per dtype).
#include "tenplex/plan/synthetic.h"

#include <gtest/gtest.h>

#include <cstring>

#include "tenplex/geometry/testing.h"
#include "tenplex/plan/planner_testing.h"

namespace tenplex::plan {
namespace {

using ::tenplex::testing::Ravel;
using ::tenplex::testing::Unravel;
using testing::kSeed;
using testing::ModelSpec;
using testing::Specs;
using testing::Tiny;

TEST(PlannerTest, SyntheticFillMatchesPerElementSlicing) {
  for (const ModelSpec& s : Specs()) {
    Model m = Tiny(s);
    for (const char* cs : {"tp=2,pp=2,dp=2,zero=1", "tp=4,pp=3,layers=2+1+1"}) {
      if (s.groups % 4 != 0 && cs[3] == '4') continue;
      auto l = MakeLayout(m, *ParseConfig(cs));
      ASSERT_TRUE(l.ok());
      for (const RankLayout& r : l->ranks) {
        for (const LocalTensor& t : *r.tensors) {
          std::vector<uint8_t> got(t.bytes(), 0xee), want(t.bytes(), 0);
          ThreadPool pool(2);
          ASSERT_TRUE(FillSynthetic(*l, t, kSeed, got.data(), &pool).ok());
          const std::size_t es = DTypeSize(t.dtype);
          for (const Piece& p : t.pieces) {
            const Shape& gs = l->globals.at(p.tensor).shape;
            const uint64_t key = SyntheticKey(p.tensor, kSeed);
            const Shape ge = p.global.extents();
            const bool flat = p.local.rank() != p.global.rank() || p.local.extents() != ge;
            for (int64_t i = 0; i < Volume(p.global); ++i) {
              auto gi = Unravel(i, ge);
              for (std::size_t k = 0; k < gi.size(); ++k) gi[k] += p.global[k].begin;
              auto li = Unravel(i, p.local.extents());
              for (std::size_t k = 0; k < li.size(); ++k) li[k] += p.local[k].begin;
              int64_t lf = flat ? p.local[0].begin + i : Ravel(li, t.shape);
              SyntheticElement(t.dtype, key, Ravel(gi, gs), &want[lf * es]);
            }
          }
          ASSERT_EQ(got, want) << cs << " rank " << r.rank << " " << t.name;
          EXPECT_TRUE(CheckSynthetic(*l, t, kSeed, got.data()).ok());
          got[got.size() - 1] ^= 1;
          EXPECT_EQ(CheckSynthetic(*l, t, kSeed, got.data()).code(), StatusCode::kDataLoss);
        }
      }
    }
  }
}

TEST(SyntheticTest, ValuesAreFiniteAndDeterministic) {
  const uint64_t key = SyntheticKey("x", 3);
  EXPECT_EQ(key, SyntheticKey("x", 3));
  EXPECT_NE(key, SyntheticKey("x", 4));
  EXPECT_NE(key, SyntheticKey("y", 3));
  for (int64_t i = 0; i < 5000; ++i) {
    float f;
    SyntheticElement(DType::kF32, key, i, &f);
    EXPECT_GE(f, -1.0f);
    EXPECT_LT(f, 1.0f);
    uint16_t bf, h;
    SyntheticElement(DType::kBF16, key, i, &bf);
    uint32_t fu;
    std::memcpy(&fu, &f, 4);
    EXPECT_EQ(bf, fu >> 16);
    SyntheticElement(DType::kF16, key, i, &h);
    EXPECT_NE((h >> 10) & 0x1f, 0x1f) << "F16 must be finite";
    uint8_t b;
    SyntheticElement(DType::kBool, key, i, &b);
    EXPECT_LE(b, 1);
  }
}

}  // namespace
}  // namespace tenplex::plan
