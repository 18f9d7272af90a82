// Content hashes of byte buffers: the xxh64 checksums that checkpoint directories
// record for their rank files (spec §7) and the store reports for its tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tenplex {

// xxh64 (seed 0) of a buffer, as 16 lower-case hex digits.
std::string Xxh64Hex(const void* data, std::size_t size);
// A 64-bit hash (e.g. a streamed XXH64 digest) as 16 lower-case hex digits.
std::string HashHex(uint64_t h);

}  // namespace tenplex
