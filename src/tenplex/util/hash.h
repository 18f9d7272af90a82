// Content hashes of byte buffers: the xxh64 checksums that checkpoint directories
// record for their rank files (spec §7) and the store reports for its tensors.
#pragma once

#include <cstddef>
#include <string>

namespace tenplex {

// xxh64 (seed 0) of a buffer, as 16 lower-case hex digits.
std::string Xxh64Hex(const void* data, std::size_t size);

}  // namespace tenplex
