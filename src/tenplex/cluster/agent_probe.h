// The transform agent's bandwidth probe (agent.h, POST /v1/transform/probe) and the
// scratch region it serves to probing peers.
//
// The scratch region is a large region of a fixed pattern (transport::ProbeByte) for
// probes that move distinct memory, as a transform does (the transport's own probe
// region is 64 MiB, which caches flatter than any real state). It is made on first use
// and dropped by a transform (Release), which needs the memory more.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "tenplex/store/store.h"
#include "tenplex/transport/capability.h"
#include "tenplex/transport/transport.h"
#include "tenplex/util/status.h"

namespace tenplex::cluster {

class AgentProber {
 public:
  static constexpr std::string_view kScratchRegion = "tenplex.agent.scratch";
  static constexpr uint64_t kScratchBytes = 512ull << 20;

  // `transport` is set once the agent made it, before any probe or lookup.
  AgentProber(store::Store& store, std::string capability_key)
      : store_(store), capability_key_(std::move(capability_key)) {}
  void set_transport(transport::Transport* t) { transport_ = t; }

  // The scratch region for a peer's probe (a probe capability, as the transport's
  // probe region; a refusal is counted in `refused` by reason); NotFound until this
  // daemon was probed itself.
  Result<transport::Region> Scratch(std::string_view capability,
                                    transport::RefusalCounter* refused);
  // Drops the scratch region (and its reservation) until the next probe makes it again:
  // 512 MiB a daemon, which a transform on a full machine needs (8 daemons of one
  // machine kept 4 GiB of it). A fetch in flight keeps its region alive (Region's owner).
  void Release();
  // The body {"address": A, "bytes": N} -> the reply JSON (agent.h).
  Result<std::string> Probe(const std::string& body);

 private:
  void EnsureScratch();
  Result<double> FetchScratchInto(transport::PeerId peer, uint64_t large, uint8_t* dest,
                                  double* first = nullptr);
  Result<double> FreshWriteGbps(uint64_t bytes);

  store::Store& store_;
  const std::string capability_key_;
  transport::Transport* transport_ = nullptr;
  std::mutex mu_;
  std::shared_ptr<std::vector<uint8_t>> scratch_;  // guarded by mu_
  std::shared_ptr<void> scratch_reservation_;      // guarded by mu_ (Store::Reserve)
};

}  // namespace tenplex::cluster
