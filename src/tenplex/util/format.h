// Small formatting helpers for tables a person reads.
#pragma once

#include <cstdint>
#include <string>

namespace tenplex {

// "1.50 GiB", "512 B".
std::string HumanBytes(int64_t bytes);

}  // namespace tenplex
