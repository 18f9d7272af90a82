#include "tenplex/util/hash.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "tenplex/util/file.h"

namespace tenplex {

std::string HashHex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string Xxh64Hex(const void* data, std::size_t size) { return HashHex(XXH64(data, size, 0)); }

Result<std::string> Xxh64HexOfFile(int fd, uint64_t bytes, const std::string& name) {
  constexpr uint64_t kPiece = 1ull << 20;
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(),
                                                                   &XXH64_freeState);
  if (state == nullptr) return ResourceExhausted("xxh64 state for " + name);
  XXH64_reset(state.get(), 0);
  std::vector<char> buf(static_cast<std::size_t>(std::min(bytes, kPiece)));
  for (uint64_t off = 0; off < bytes;) {
    const uint64_t n = std::min(kPiece, bytes - off);
    TP_RETURN_IF_ERROR(PreadExact(fd, buf.data(), n, off, name));
    XXH64_update(state.get(), buf.data(), static_cast<std::size_t>(n));
    off += n;
  }
  return HashHex(XXH64_digest(state.get()));
}

}  // namespace tenplex
