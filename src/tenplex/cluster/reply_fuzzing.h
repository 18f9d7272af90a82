// Shared by the libFuzzer targets of the control-plane replies (control_replies.h): one
// decoder fed arbitrary bytes. Besides "no crash, no sanitizer report": an accepted
// reply encodes to one that decodes to equal fields (nothing is lost or changed on the
// way between an agent and its reader).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tenplex/util/fuzz.h"

namespace tenplex::cluster {

template <class Decode, class Encode>
int FuzzReplyRoundTrip(const uint8_t* data, size_t size, Decode decode, Encode encode) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto r = decode(in);
  if (!r.ok()) return 0;
  auto again = decode(encode(*r));
  FuzzRequire(again.ok() && *again == *r);
  return 0;
}

}  // namespace tenplex::cluster
