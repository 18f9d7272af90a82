// Bounded nesting for JSON from outside the process.
//
// nlohmann::json parses, copies, dumps and destroys nested arrays and objects by
// recursion, so a body such as {"a": [[[[...100000...]]]]} overflows the stack of the
// thread that parses it (a daemon crash from one request). Every parse of untrusted
// text (HTTP bodies, peers' replies, checkpoint and manifest files, model and config
// files) first calls CheckJsonDepth, a linear scan that counts '[' and '{' outside
// strings and refuses the text before the recursive parser sees it.
#pragma once

#include <string_view>

#include "tenplex/util/status.h"

namespace tenplex {

// Deepest nesting of arrays and objects accepted from outside (real documents of this
// project nest at most about 6 levels).
inline constexpr int kMaxJsonDepth = 128;

// OK when no array or object of `text` is nested deeper than max_depth; otherwise
// InvalidArgument naming `what` and the limit. Malformed text passes (the parser
// reports it); only the nesting is checked.
Status CheckJsonDepth(std::string_view text, std::string_view what = "JSON text",
                      int max_depth = kMaxJsonDepth);

}  // namespace tenplex
