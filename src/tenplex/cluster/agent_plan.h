// The transform agent's plans (agent.h): what a prepare or presize request asks of this
// host, planned and checked against the coordinator's digest, and the last one kept.
//
// An agent plans its own part of the transform only (plan::MakeHostPlan: the ops whose
// destination is on this host, exactly those of the coordinator's whole plan), not every
// host's ops, so a prepare's planning grows with what this host does rather than with
// the cluster. The coordinator sends the digest of this host's part
// (control_protocol.h, HostPlanParts); a different part (a daemon of another build,
// another planner) is refused instead of silently moving different bytes.
//
// The last plan is kept by PlanKey: the prepare after a presize of the same transform
// (tenplex run pre-sizes the next config while the old one trains) plans nothing again.
// One entry: only the next transform's plan is worth keeping.
//
// Thread-safety: PlanCache may be used from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "tenplex/cluster/control_protocol.h"
#include "tenplex/plan/planner.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/util/status.h"

namespace tenplex::cluster {

// The layouts of a request and this host's part of its plan.
struct PlanCore {
  Layout from, to;
  plan::Plan plan;  // plan::MakeHostPlan of the request's host
};

// What a prepare (or presize) request asks of this host: the request, the old and new
// layouts, and this host's part of the plan, checked against the coordinator's digest.
struct PlannedRequest {
  DecodedPrepare d;
  std::shared_ptr<const PlanCore> core;
};

// InvalidArgument unless every "served" entry of r names a local tensor of its old rank
// in `from`.
Status CheckServed(const PrepareRequest& r, const Layout& from);

// This host's part of the plan of r, which must have the coordinator's digest
// (FailedPrecondition otherwise).
Result<plan::Plan> CoordinatorsHostPlan(const Model& model, const PrepareRequest& r,
                                        const Layout& from, const Layout& to);

class PlanCache {
 public:
  // Decodes a prepare or presize body and plans it (or takes the last plan, if its key
  // is the same). Checks that the request's "served" tensors exist in the old layout.
  Result<PlannedRequest> Get(const std::string& body);
  // Requests that took the last plan instead of planning.
  uint64_t reused() const { return reused_.load(); }

 private:
  std::mutex mu_;
  std::shared_ptr<const PlanCore> last_;  // guarded by mu_
  std::string last_key_;                  // guarded by mu_
  std::atomic<uint64_t> reused_{0};
};

}  // namespace tenplex::cluster
