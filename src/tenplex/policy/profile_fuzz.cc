// libFuzzer target for device profile files (policy.h: DeviceProfileFromJson, read by
// `config suggest --device-profile FILE` and schedule "device_profile" entries). Besides
// "no crash, no sanitizer report": an accepted profile has every field in its range, so
// the cost model never divides by zero or goes negative.
#include <cmath>
#include <cstdint>
#include <string>

#include "tenplex/policy/policy.h"
#include "tenplex/util/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  auto p = tenplex::policy::DeviceProfileFromJson(in);
  if (!p.ok()) return 0;
  auto unit = [](double x) { return std::isfinite(x) && x >= 0 && x <= 1; };
  auto positive = [](double x) { return std::isfinite(x) && x > 0; };
  tenplex::FuzzRequire(positive(p->peak_flops) && p->efficiency > 0 && unit(p->efficiency));
  tenplex::FuzzRequire(positive(p->intra_bw) && positive(p->inter_bw) &&
                       positive(p->intra_latency) && positive(p->inter_latency));
  tenplex::FuzzRequire(p->gpus_per_host >= 1 && p->memory_bytes >= 0 && p->reserve_bytes >= 0);
  tenplex::FuzzRequire(unit(p->reserve_fraction) && unit(p->dp_overlap) && unit(p->tp_overlap));
  tenplex::FuzzRequire(std::isfinite(p->layer_overhead) && p->layer_overhead >= 0);
  return 0;
}
