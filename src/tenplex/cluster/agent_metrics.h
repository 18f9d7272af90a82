// The transform agent's counters (agent.h) and their Prometheus text, part of the
// daemon's GET /metrics.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "tenplex/cluster/agent_maps.h"
#include "tenplex/transport/capability.h"
#include "tenplex/transport/transport.h"

namespace tenplex::cluster {

class AgentMetrics {
 public:
  // One prepare's outcome: its bytes by source (when ok) and its seconds.
  void CountPrepare(bool ok, int64_t bytes_fetched, int64_t bytes_local, int64_t bytes_linked,
                    int64_t bytes_fetched_shm, double seconds);
  void CountLocated(uint64_t files) { files_located_ += files; }
  void CountRefused(transport::CapabilityRefusal why) { refused_.Add(why); }
  // Where checks that are not the agent's own (the scratch region's) count refusals.
  transport::RefusalCounter* refusals() { return &refused_; }

  // The text, with the transport's own counters, the plans reused (PlanCache) and the
  // served tensors pre-faulted (ServedMaps).
  std::string Text(const transport::Transport& transport, uint64_t plans_reused,
                   const ServedMaps& maps);

 private:
  std::mutex mu_;
  uint64_t prepared_ = 0, failed_ = 0;                               // guarded by mu_
  uint64_t bytes_fetched_ = 0, bytes_local_ = 0, bytes_linked_ = 0;  // guarded by mu_
  uint64_t bytes_fetched_shm_ = 0;                                   // guarded by mu_
  double prepare_seconds_ = 0;                                       // guarded by mu_
  std::atomic<uint64_t> files_located_{0};  // files named to same-host peers
  // Fetches refused for their capability, by transport::CapabilityRefusal.
  transport::RefusalCounter refused_;
};

}  // namespace tenplex::cluster
