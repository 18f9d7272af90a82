#include "tenplex/util/hash.h"

#include <gtest/gtest.h>

#include <string>

namespace tenplex {
namespace {

// Reference values of XXH64 with seed 0 (the xxHash specification's test vectors).
TEST(Hash, Xxh64KnownValues) {
  EXPECT_EQ(Xxh64Hex("", 0), "ef46db3751d8e999");
  const std::string abc = "abc";
  EXPECT_EQ(Xxh64Hex(abc.data(), abc.size()), "44bc2cf5ad770999");
}

TEST(Hash, Xxh64DiffersOnOneBit) {
  std::string a(4096, 'x'), b = a;
  b[1234] ^= 1;
  EXPECT_NE(Xxh64Hex(a.data(), a.size()), Xxh64Hex(b.data(), b.size()));
  EXPECT_EQ(Xxh64Hex(a.data(), a.size()).size(), 16u);
}

}  // namespace
}  // namespace tenplex
