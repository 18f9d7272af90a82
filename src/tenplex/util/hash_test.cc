#include "tenplex/util/hash.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "tenplex/util/fd.h"
#include "tenplex/util/file.h"

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

// The file's streamed hash (1 MiB pieces) against the one-buffer hash of the same bytes:
// empty, a piece and one byte, several pieces and a tail, a prefix of the file; a file
// shorter than asked is DataLoss naming it.
TEST(Hash, Xxh64OfAFileEqualsTheBuffers) {
  char path[] = "/tmp/tenplex-hash-XXXXXX";
  Fd fd(::mkstemp(path));
  ASSERT_GE(fd.get(), 0);
  std::string bytes(3 * (1 << 20) + 12345, '\0');
  uint64_t x = 88172645463325252ull;
  for (char& c : bytes) {  // xorshift: no repeating pattern across pieces
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  ASSERT_TRUE(PwriteExact(fd.get(), bytes.data(), bytes.size(), 0, path).ok());
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 20, (uint64_t{1} << 20) + 1,
                     uint64_t{bytes.size()} - 7, uint64_t{bytes.size()}}) {
    Result<std::string> got = Xxh64HexOfFile(fd.get(), n, path);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, Xxh64Hex(bytes.data(), n)) << n << " bytes";
  }
  Result<std::string> shorter = Xxh64HexOfFile(fd.get(), bytes.size() + 1, path);
  EXPECT_EQ(shorter.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(shorter.status().message().find(path), std::string::npos)
      << shorter.status().ToString();
  ::unlink(path);
}

}  // namespace
}  // namespace tenplex
