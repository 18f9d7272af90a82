#include "tenplex/cluster/agent_plan.h"

#include <utility>

#include "tenplex/model/model.h"

namespace tenplex::cluster {
namespace {

// What determines a request's layouts and plan: the model, both configs, where the
// ranks live, the host and the coordinator's digest of its part (not the job, versions,
// addresses or the rest of the info, which change from the presize to its prepare).
std::string PlanKey(const DecodedPrepare& d) {
  std::string key = d.from.field("model").dump();
  key += '\n' + d.from.config().ToString() + '\n' + d.request.to_config.ToString() + '\n';
  for (int h : d.request.from_hosts) key += std::to_string(h) + ',';
  key += '\n';
  for (int h : d.request.to_hosts) key += std::to_string(h) + ',';
  key += '\n' + std::to_string(d.request.host) + '\n' + d.request.host_plan_digest;
  return key;
}

}  // namespace

Status CheckServed(const PrepareRequest& r, const Layout& from) {
  for (const ServedTensor& s : r.served) {
    if (static_cast<std::size_t>(s.tensor) >= from.ranks.at(s.rank).tensors->size()) {
      return InvalidArgument("'served': old rank " + std::to_string(s.rank) + " has no tensor " +
                             std::to_string(s.tensor));
    }
  }
  return Status::Ok();
}

Result<plan::Plan> CoordinatorsHostPlan(const Model& model, const PrepareRequest& r,
                                        const Layout& from, const Layout& to) {
  TP_ASSIGN_OR_RETURN(plan::Plan p,
                      plan::MakeHostPlan(model, from, to, r.from_hosts, r.to_hosts, r.host));
  if (const std::string mine = PlanDigest(p); mine != r.host_plan_digest) {
    return FailedPrecondition("host " + std::to_string(r.host) +
                              " computes its part of the plan with digest " + mine +
                              " but the coordinator's has " + r.host_plan_digest +
                              ": the daemons run different builds of tenplex");
  }
  return p;
}

Result<PlannedRequest> PlanCache::Get(const std::string& body) {
  PlannedRequest q;
  TP_ASSIGN_OR_RETURN(q.d, DecodePrepare(body));
  const std::string key = PlanKey(q.d);
  std::shared_ptr<const PlanCore> last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (last_ && last_key_ == key) last = last_;
  }
  if (last) {
    TP_RETURN_IF_ERROR(CheckServed(q.d.request, last->from));
    q.core = std::move(last);
    ++reused_;
    return q;
  }
  const Model& model = q.d.from.model();
  auto core = std::make_shared<PlanCore>();
  TP_ASSIGN_OR_RETURN(core->from, MakeLayout(model, q.d.from.config()));
  TP_ASSIGN_OR_RETURN(core->to, MakeLayout(model, q.d.request.to_config));
  TP_RETURN_IF_ERROR(CheckServed(q.d.request, core->from));
  TP_ASSIGN_OR_RETURN(core->plan, CoordinatorsHostPlan(model, q.d.request, core->from, core->to));
  q.core = core;
  std::lock_guard<std::mutex> lock(mu_);
  last_ = std::move(core);
  last_key_ = key;
  return q;
}

}  // namespace tenplex::cluster
