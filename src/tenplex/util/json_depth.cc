#include "tenplex/util/json_depth.h"

#include <string>

namespace tenplex {

Status CheckJsonDepth(std::string_view text, std::string_view what, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character (a quote or a backslash) never ends the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return InvalidArgument(std::string(what) + " nests arrays or objects deeper than " +
                               std::to_string(max_depth) + " levels");
      }
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
  return Status::Ok();
}

}  // namespace tenplex
