#include "tenplex/util/hash.h"

#include <xxhash.h>

#include <cstdio>

namespace tenplex {

std::string HashHex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string Xxh64Hex(const void* data, std::size_t size) { return HashHex(XXH64(data, size, 0)); }

}  // namespace tenplex
