// tenplex._tenplex.cluster_*: the two-phase commit of the C++ side
// (transform/two_phase.h) for the torchrun path (tenplex.elastic): prepare on every
// host, then CommitEverywhere; AbortEverywhere; ResolvePending; the coordinator's job
// lease (JobLease). Every call connects to the hosts itself and runs without the GIL (the
// other ranks' collectives go on); a call that names no coordinator takes the job's
// lease for its own duration.
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "tenplex/cluster/cluster.h"
#include "tenplex/cluster/job_lease.h"
#include "tenplex/cluster/two_phase.h"
#include "tenplex/io/state_info.h"
#include "tenplex/store/client.h"

namespace tenplex::py {
namespace {

// One client per URL (cluster::ConnectCluster); with allow_lost a host that cannot be
// reached gets a null client.
struct Hosts {
  std::vector<std::unique_ptr<store::Client>> owned;
  std::vector<store::Client*> clients;
  std::vector<int> all;
  store::ClientOptions options;              // every client's (token, timeout, coordinator)
  std::unique_ptr<cluster::JobLease> lease;  // taken for the call when it named no coordinator
};

// coordinator: the caller's name, whose job lease it holds (a JobLease below); "" makes
// a fresh name and takes the lease for this call (TENPLEX_LEASE_WAIT, job_lease.h).
Result<Hosts> ConnectHosts(const std::vector<std::string>& urls, const std::string& token,
                           int timeout_s, bool allow_lost, const std::string& job,
                           const std::string& coordinator) {
  if (urls.empty()) return InvalidArgument("no hosts given");
  if (timeout_s <= 0) return InvalidArgument("timeout_s must be > 0");
  store::ClientOptions o;
  o.token = token;
  o.timeout_s = timeout_s;
  o.coordinator = coordinator.empty() ? cluster::NewCoordinator("tenplex-elastic") : coordinator;
  io::Cluster cluster;
  cluster.hosts = urls;
  Hosts h;
  h.options = o;
  TP_ASSIGN_OR_RETURN(h.owned, cluster::ConnectCluster(cluster, o, allow_lost));
  for (std::size_t i = 0; i < h.owned.size(); ++i) {
    h.clients.push_back(h.owned[i].get());
    h.all.push_back(static_cast<int>(i));
  }
  if (coordinator.empty()) {
    TP_ASSIGN_OR_RETURN(double wait, cluster::LeaseWaitFromEnv(60));
    TP_ASSIGN_OR_RETURN(
        h.lease, cluster::JobLease::Acquire(h.clients, job, o, {store::kDefaultLeaseMs, wait}));
  }
  return h;
}

pyb::dict OutcomeDict(const cluster::CommitOutcome& c) {
  pyb::dict d;
  d["confirmed"] = c.confirmed;
  d["unconfirmed"] = c.unconfirmed;
  d["released"] = c.released;
  return d;
}

// The two-phase commit of version on every host (cluster::PrepareAndCommit, the one
// implementation: prepare durable, decide, commit; a failed prepare is aborted
// everywhere and raises; a commit refused after others committed raises DataLoss and
// is rolled forward by the next cluster_resolve).
pyb::dict PrepareCommit(const std::vector<std::string>& urls, const std::string& token,
                        const std::string& job, uint64_t version, bool release, int timeout_s,
                        const std::string& coordinator) {
  Result<cluster::CommitOutcome> out = NoGil([&]() -> Result<cluster::CommitOutcome> {
    TP_ASSIGN_OR_RETURN(
        Hosts h, ConnectHosts(urls, token, timeout_s, /*allow_lost=*/false, job, coordinator));
    return cluster::PrepareAndCommit(h.clients, h.all, job, version, release);
  });
  return OutcomeDict(Take(std::move(out)));
}

// Aborts version on the hosts that answer; False when the first host has already
// committed it (the caller must roll forward instead), True otherwise.
bool AbortAll(const std::vector<std::string>& urls, const std::string& token,
              const std::string& job, uint64_t version, int timeout_s,
              const std::string& coordinator) {
  Status s = NoGil([&]() -> Status {
    TP_ASSIGN_OR_RETURN(
        Hosts h, ConnectHosts(urls, token, timeout_s, /*allow_lost=*/true, job, coordinator));
    return cluster::AbortEverywhere(h.clients, h.all, job, version);
  });
  if (s.code() == StatusCode::kFailedPrecondition) return false;
  Check(s);
  return true;
}

// ResolvePending over the hosts (those that do not answer are skipped).
pyb::dict Resolve(const std::vector<std::string>& urls, const std::string& token,
                  const std::string& job, bool owner, int timeout_s,
                  const std::string& coordinator) {
  cluster::Resolution res = Take(NoGil([&]() -> Result<cluster::Resolution> {
    TP_ASSIGN_OR_RETURN(
        Hosts h, ConnectHosts(urls, token, timeout_s, /*allow_lost=*/true, job, coordinator));
    return cluster::ResolvePending(urls, h.clients, job, owner);
  }));
  pyb::dict d;
  d["committed"] = res.committed;
  d["aborted"] = res.aborted;
  d["pending"] = res.pending;
  d["released"] = res.released;
  d["lines"] = res.lines;
  return d;
}

// tenplex._tenplex.JobLease: a coordinator's lease of a job on the hosts that answer
// (transform/job_lease.h), renewed in a C++ thread until release() (or the object goes).
// A negative wait_s (the default) waits TENPLEX_LEASE_WAIT, 60 s unless set
// (cluster::LeaseWaitFromEnv: the one parser of that variable).
class PyJobLease {
 public:
  PyJobLease(const std::vector<std::string>& urls, const std::string& token, const std::string& job,
             const std::string& coordinator, int64_t ttl_ms, double wait_s, int timeout_s) {
    if (coordinator.empty()) Check(InvalidArgument("a JobLease needs the coordinator's name"));
    lease_ = Take(NoGil([&]() -> Result<std::unique_ptr<cluster::JobLease>> {
      // Named coordinator: ConnectHosts takes no lease of its own.
      double wait = wait_s;
      if (wait < 0) {
        TP_ASSIGN_OR_RETURN(wait, cluster::LeaseWaitFromEnv(60));
      }
      TP_ASSIGN_OR_RETURN(
          Hosts h, ConnectHosts(urls, token, timeout_s, /*allow_lost=*/true, job, coordinator));
      return cluster::JobLease::Acquire(h.clients, job, h.options, {ttl_ms, wait});
    }));
  }
  std::string holder() const { return lease_ ? lease_->holder() : ""; }
  std::vector<std::string> hosts() const {
    return lease_ ? lease_->hosts() : std::vector<std::string>{};
  }
  // "" while held; the refusal of a renewal, or "released".
  std::string error() const {
    if (!lease_) return "released";
    Status s = lease_->Held();
    return s.ok() ? "" : s.ToString();
  }
  void Release() {
    std::unique_ptr<cluster::JobLease> l = std::move(lease_);
    NoGil([&] { l.reset(); });
  }

 private:
  std::unique_ptr<cluster::JobLease> lease_;
};

// tenplex._tenplex.StateInfo: a version's info, parsed and validated by the C++ owner
// of its fields (transform/state_info.h); Python reads it typed, never by hand.
void RegisterStateInfo(pyb::module_& m) {
  using io::StateInfo;
  pyb::class_<StateInfo>(m, "StateInfo",
                         "A version's info (model, config, training fields, placement)")
      .def_static(
          "parse",
          [](const std::string& text, bool require_model) {
            return Take(StateInfo::Parse(text, require_model ? StateInfo::ModelRequired::kYes
                                                             : StateInfo::ModelRequired::kNo));
          },
          pyb::arg("text"), pyb::arg("require_model") = true,
          "Parses a version's info JSON (InvalidArgumentError naming what is missing); "
          "require_model=False accepts an info without \"model\" (tenplex.elastic's "
          "commits of a user's own model)")
      .def_property_readonly("has_model", &StateInfo::has_model)
      .def_property_readonly("config", &StateInfo::config, "The parallel config (a Config)")
      .def_property_readonly("model_json",
                             [](const StateInfo& s) { return s.field("model").dump(); })
      .def_property_readonly("step", &StateInfo::step)
      .def_property_readonly("samples_consumed", &StateInfo::samples_consumed)
      .def_property_readonly("hosts",
                             [](const StateInfo& s) {
                               return s.placement() ? s.placement()->hosts
                                                    : std::vector<std::string>{};
                             })
      .def_property_readonly("host_ids",
                             [](const StateInfo& s) {
                               return s.placement() ? s.placement()->host_ids
                                                    : std::vector<std::string>{};
                             })
      .def_property_readonly("gpus_per_host",
                             [](const StateInfo& s) -> std::optional<int> {
                               if (!s.placement()) return std::nullopt;
                               return s.placement()->gpus_per_host;
                             })
      .def(
          "resume_position",
          [](const StateInfo& s, const std::string& what) {
            StateInfo::Position p = Take(s.ResumePosition(what));
            return std::make_pair(p.step, p.samples_consumed);
          },
          pyb::arg("what"),
          "(step, samples_consumed or None) a run continues from; FailedPrecondition "
          "naming `what` when the info has no step")
      .def(
          "field_json",
          [](const StateInfo& s, const std::string& name) { return s.field(name).dump(); },
          pyb::arg("name"), "Any field as JSON text ('null' when absent)")
      .def("to_json", &StateInfo::ToJson, "The JSON text the store keeps");
}

}  // namespace

void register_cluster(pyb::module_& m) {
  RegisterStateInfo(m);
  m.def("new_coordinator", &cluster::NewCoordinator, pyb::arg("what"),
        "A fresh coordinator name: what@host:pid:random (store/lease.h)");
  pyb::class_<PyJobLease>(m, "JobLease")
      .def(pyb::init<const std::vector<std::string>&, const std::string&, const std::string&,
                     const std::string&, int64_t, double, int>(),
           pyb::arg("urls"), pyb::arg("token"), pyb::arg("job"), pyb::arg("coordinator"),
           pyb::arg("ttl_ms") = store::kDefaultLeaseMs, pyb::arg("wait_s") = -1.0,
           pyb::arg("timeout_s") = 30)
      .def_property_readonly("holder", &PyJobLease::holder)
      .def_property_readonly("hosts", &PyJobLease::hosts)
      .def("error", &PyJobLease::error, "'' while held; why not otherwise")
      .def("release", &PyJobLease::Release, "Stops renewing and releases the lease everywhere");
  m.def("cluster_prepare_commit", &PrepareCommit, pyb::arg("urls"), pyb::arg("token"),
        pyb::arg("job"), pyb::arg("version"), pyb::arg("release") = true,
        pyb::arg("timeout_s") = 600, pyb::arg("coordinator") = "",
        "Prepares version of job on every host, then commits it everywhere (two_phase.h); "
        "{'confirmed', 'unconfirmed', 'released'} (host indexes)");
  m.def("cluster_abort", &AbortAll, pyb::arg("urls"), pyb::arg("token"), pyb::arg("job"),
        pyb::arg("version"), pyb::arg("timeout_s") = 600, pyb::arg("coordinator") = "",
        "Aborts version everywhere; False when it is already committed (roll forward)");
  m.def("cluster_resolve", &Resolve, pyb::arg("urls"), pyb::arg("token"), pyb::arg("job"),
        pyb::arg("owner") = true, pyb::arg("timeout_s") = 600, pyb::arg("coordinator") = "",
        "Finishes or rolls back what a coordinator left half done (ResolvePending)");
}

}  // namespace tenplex::py
