// libFuzzer target for the control-plane probe reply decoder (control_replies.h), which
// reads what a daemon's agent answers (reply_fuzzing.h: round trip of accepted input).
#include <cstddef>
#include <cstdint>

#include "tenplex/cluster/control_replies.h"
#include "tenplex/cluster/reply_fuzzing.h"

namespace tc = tenplex::cluster;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return tc::FuzzReplyRoundTrip(data, size, tc::DecodeProbeReply, tc::EncodeProbeReply);
}
