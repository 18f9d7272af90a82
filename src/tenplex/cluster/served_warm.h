// The coordinator's warm requests (agent.h, POST /v1/transform/warm) to the hosts that
// only serve a transform: they hold old ranks that other hosts fetch, but get no new
// ranks, so they are sent no prepare, and without this their agents would map each
// served tensor at its first fetch, page fault by page fault on the data plane's
// thread (agent_maps.h). Participants warm the same way inside their prepare.
//
// The warms go out with the prepares, each on a thread of its own, and never decide
// anything: a host that does not answer or refuses is logged, and the prepare phase
// judges it as before (a lost server fails the fetches that need it). Wait bounds how
// long the coordinator waits for them after the prepares; calls still out finish (or
// time out) by themselves.
//
// Thread-safety: Wait may be called from one thread; the calls run on their own.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tenplex/cluster/control_protocol.h"
#include "tenplex/store/client.h"

namespace tenplex::cluster {

class ServedWarming {
 public:
  // Sends the warm of host h (the shared prepare body with its host and part) to every
  // host h of `urls` that is not in `participants`, has a data-plane address in
  // `addresses` (not lost) and serves something (parts[h].served not empty).
  static ServedWarming Start(const std::vector<std::string>& urls,
                             const std::vector<std::string>& addresses,
                             const std::vector<int>& participants,
                             std::shared_ptr<const std::string> shared_prepare,
                             const std::vector<HostPart>& parts,
                             const store::ClientOptions& client_options);
  // Waits until every warm answered, or `within` passed.
  void Wait(std::chrono::milliseconds within);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace tenplex::cluster
