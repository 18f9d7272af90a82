// Shared by the libFuzzer targets (*_fuzz.cc): a property that must hold for every
// accepted input. A violation aborts, which libFuzzer reports as a crash with the input.
#pragma once

#include <cstdlib>

namespace tenplex {

inline void FuzzRequire(bool cond) {
  if (!cond) std::abort();
}

}  // namespace tenplex
