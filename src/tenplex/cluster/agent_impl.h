// The transform agent's state (agent.h), shared by its files: agent.cc (creation, the
// endpoints, capabilities, the data plane's lookups, same-host locates) and
// agent_prepare.cc (prepare and presize). Its parts of one concern each: the maps of
// served tensors (agent_maps.h), the plans (agent_plan.h), the probe (agent_probe.h)
// and the metrics (agent_metrics.h). Internal to the agent.
#pragma once

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "tenplex/cluster/agent.h"
#include "tenplex/cluster/agent_maps.h"
#include "tenplex/cluster/agent_metrics.h"
#include "tenplex/cluster/agent_plan.h"
#include "tenplex/cluster/agent_probe.h"
#include "tenplex/cluster/control_protocol.h"
#include "tenplex/store/store.h"
#include "tenplex/transform/host_exec.h"
#include "tenplex/transform/store_tensors.h"
#include "tenplex/transport/transport.h"

namespace tenplex::cluster {

struct Agent::Impl {
  store::Store& store;
  AgentOptions options;
  std::unique_ptr<transport::Transport> transport;

  int fault_at = 0;  // exit in this prepare or locate (1-based); 0: never
  bool fault_in_locate = false;
  std::atomic<int> prepares{0}, locates{0};

  AgentMetrics metrics;
  ServedMaps maps;
  PlanCache plans;
  AgentProber prober;
  std::shared_ptr<void> release_listener;  // Store::OnRelease -> maps.Purge

  Impl(store::Store& s, AgentOptions o);
  ~Impl();

  std::string MetricsText() { return metrics.Text(*transport, plans.reused(), maps); }

  // The capability of this host's fetches from host `peer` in the transform r: for the
  // peer's incarnation of the job, as the coordinator learned it.
  std::string Capability(const PrepareRequest& r, int peer);
  // PermissionDenied (and counted) unless `capability` lets a peer read `name` now.
  Status Authorize(std::string_view name, std::string_view capability);
  // The data plane's lookup of a region a peer fetches.
  Result<transport::Region> Lookup(std::string_view name, std::string_view capability);

  Result<std::string> Prepare(const std::string& body, const std::string& coordinator);
  Result<std::string> Presize(const std::string& body);
  Result<std::string> Warm(const std::string& body);
  Result<std::string> Locate(const std::string& body);
  std::string AddressReply(const std::string& job = "");

 private:
  // Prepare's parts (agent_prepare.cc).
  // The number of tensors warmed.
  std::size_t WarmServed(const PrepareRequest& r, const Layout& from);
  transform::HostExecInput ExecInput(const PrepareRequest& r, const plan::Plan& p,
                                     const Layout& from, const Layout& to,
                                     const transform::MappedSources& src,
                                     const transform::MappedDests& dst,
                                     const std::set<std::pair<int, int>>& linked,
                                     std::atomic<int64_t>& shm_bytes, std::atomic<int>& shm_peers);
  Status FetchFrom(const PrepareRequest& r, int peer,
                   const std::vector<transport::ReadRequest>& reqs, std::atomic<int64_t>& shm_bytes,
                   std::atomic<int>& shm_peers);
};

}  // namespace tenplex::cluster
