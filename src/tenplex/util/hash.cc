#include "tenplex/util/hash.h"

#include <xxhash.h>

#include <cstdio>

namespace tenplex {

std::string Xxh64Hex(const void* data, std::size_t size) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(XXH64(data, size, 0)));
  return buf;
}

}  // namespace tenplex
