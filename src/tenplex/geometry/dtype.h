// Element types, named as safetensors names them.
#pragma once

#include <cstddef>
#include <string_view>

#include "tenplex/util/status.h"

namespace tenplex {

enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

inline constexpr DType kAllDTypes[] = {DType::kF64, DType::kF32, DType::kF16, DType::kBF16,
                                       DType::kI64, DType::kI32, DType::kI16, DType::kI8,
                                       DType::kU8,  DType::kBool};

// "F32", "BF16", ...
std::string_view DTypeName(DType dtype);
// Bytes per element.
std::size_t DTypeSize(DType dtype);
// Parses a safetensors dtype name; unknown names are InvalidArgument.
Result<DType> ParseDType(std::string_view name);

}  // namespace tenplex
