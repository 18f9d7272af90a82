// libFuzzer target for the `tenplex simulate` scenario parser (scenario.h). Besides "no
// crash, no sanitizer report": an accepted scenario names a model, has configs within
// the rank bound, positive rates, straggler factors of at least 1 and no negative host.
// The simulation itself is not run (an accepted scenario may describe 100,000 GPUs).
#include <cstdint>
#include <string>

#include "tenplex/sim/scenario.h"
#include "tenplex/util/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tenplex::FuzzRequire;
  const std::string in(reinterpret_cast<const char*>(data), size);
  auto s = tenplex::sim::ParseScenario(in);
  if (!s.ok()) {
    FuzzRequire(!s.status().message().empty());
    return 0;
  }
  FuzzRequire(!s->model_spec.empty() || s->inline_model.has_value());
  FuzzRequire(s->from.world_size() >= 1 && s->from.world_size() <= tenplex::sim::kMaxSimRanks);
  FuzzRequire(s->to.world_size() >= 1 && s->to.world_size() <= tenplex::sim::kMaxSimRanks);
  FuzzRequire(s->from_gpus_per_host >= 1 && s->to_gpus_per_host >= 1 && s->to_hosts >= 0);
  const tenplex::sim::ClusterModel& c = s->cluster;
  FuzzRequire(c.nic_gbit_s > 0 && c.copy_gbyte_s > 0 && c.memory_gbyte_s > 0 && c.map_gbyte_s > 0 &&
              c.latency_us >= 0 && c.rpc_us >= 0 && c.json_gbyte_s >= 0 && c.hash_gbyte_s >= 0);
  for (double f : c.straggler) FuzzRequire(f >= 1 && f <= tenplex::sim::kMaxStraggler);
  for (int h : c.lost_hosts) FuzzRequire(h >= 0);
  return 0;
}
