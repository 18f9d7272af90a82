#include "tenplex/store/manifest.h"

#include <gtest/gtest.h>

namespace tenplex::store {
namespace {

TEST(ManifestTest, ParsesAVersion) {
  auto m = ParseManifest(
      R"({"format": "tenplex.store.version.v1", "job": "j", "version": 3, "info": {"step": 7},
          "tensors": [{"key": "rank-00000/w", "dtype": "F32", "shape": [2, 3],
                       "xxh64": "0123456789abcdef"},
                      {"key": "rank-00001/s", "dtype": "I64", "shape": []}]})",
      "j", "3");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->info, R"({"step":7})");
  ASSERT_EQ(m->tensors.size(), 2u);
  EXPECT_EQ(m->tensors[0].key, "rank-00000/w");
  EXPECT_EQ(m->tensors[0].shape, (Shape{2, 3}));
  EXPECT_EQ(m->tensors[0].bytes, 24u);
  EXPECT_EQ(m->tensors[1].bytes, 8u);
  EXPECT_EQ(m->tensors[0].xxh64, "0123456789abcdef");
  EXPECT_EQ(m->tensors[1].xxh64, "");  // manifests of older builds have none
}

TEST(ManifestTest, RefusesMalformedManifests) {
  for (
      const char* bad :
      {"", "[]", R"({"format": "other", "tensors": []})",
       R"({"format": "tenplex.store.version.v1"})",
       R"({"format": "tenplex.store.version.v1", "tensors": [1]})",
       R"({"format": "tenplex.store.version.v1", "tensors": [{"key": "../x", "dtype": "F32", "shape": []}]})",
       R"({"format": "tenplex.store.version.v1", "tensors": [{"key": "rank-00000/w", "dtype": "F99", "shape": []}]})",
       R"({"format": "tenplex.store.version.v1", "tensors": [{"key": "rank-00000/w", "dtype": "F32", "shape": [1.5]}]})",
       R"({"format": "tenplex.store.version.v1", "tensors": [{"key": "rank-00000/w", "dtype": "F32", "shape": [-1]}]})",
       R"({"format": "tenplex.store.version.v1", "tensors": [{"key": "rank-00000/w", "dtype": "F32",
               "shape": [4294967296, 4294967296]}]})",
       R"({"format": "tenplex.store.version.v1", "tensors": [{"key": "rank-00000/w", "dtype": "F32",
               "shape": [], "xxh64": "0123"}]})",
       R"({"format": "tenplex.store.version.v1", "tensors": [{"key": "rank-00000/w", "dtype": "F32",
               "shape": [], "xxh64": "0123456789ABCDEF"}]})",
       R"({"format": "tenplex.store.version.v1", "tensors": [{"key": "rank-00000/w", "dtype": "F32",
               "shape": [], "xxh64": 7}]})"}) {
    auto m = ParseManifest(bad, "j", "3");
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << bad;
  }
}

}  // namespace
}  // namespace tenplex::store
