// Small formatting helpers for tables a person reads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tenplex {

// "1.50 GiB", "512 B".
std::string HumanBytes(int64_t bytes);

// Splits s at every sep: "a,,b" -> {"a", "", "b"}, "" -> {""}.
std::vector<std::string_view> SplitString(std::string_view s, char sep);

// 16 random hex digits (std::random_device): ids of store instances, coordinators.
std::string RandomHex();

}  // namespace tenplex
