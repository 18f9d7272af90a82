// libFuzzer target for the control-plane prepare decoder (control_protocol.h), the
// body every daemon's agent accepts from the network. Besides "no crash, no sanitizer
// report": an accepted request re-encodes to a request that decodes to the same
// fields, its host indexes lie inside its address list, and its "served" entries are
// old ranks of the receiver read by other hosts.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tenplex/cluster/control_protocol.h"
#include "tenplex/util/fuzz.h"

namespace tc = tenplex::cluster;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto d = tc::DecodePrepare(in);
  if (!d.ok()) return 0;
  const tc::PrepareRequest& r = d->request;
  const int hosts = static_cast<int>(r.addresses.size());
  tenplex::FuzzRequire(r.host >= 0 && r.host < hosts && r.to_version > r.from_version);
  for (int h : r.from_hosts) tenplex::FuzzRequire(h >= -1 && h < hosts);
  for (int h : r.to_hosts) tenplex::FuzzRequire(h >= 0 && h < hosts && !r.addresses[h].empty());
  auto again = tc::DecodePrepare(tc::EncodePrepare(r));
  tenplex::FuzzRequire(again.ok());
  tenplex::FuzzRequire(
      again->request.job == r.job && again->request.from_hosts == r.from_hosts &&
      again->request.to_hosts == r.to_hosts && again->request.addresses == r.addresses &&
      again->request.to_config == r.to_config &&
      again->request.host_plan_digest == r.host_plan_digest && again->request.served == r.served &&
      again->from.config() == d->from.config());
  for (const tc::ServedTensor& s : r.served) {
    tenplex::FuzzRequire(s.rank >= 0 && s.rank < static_cast<int>(r.from_hosts.size()) &&
                         r.from_hosts[s.rank] == r.host && s.reader >= 0 && s.reader < hosts &&
                         s.reader != r.host && s.tensor >= 0);
  }
  return 0;
}
