// tenplex._tenplex.cluster_*: the two-phase commit of the C++ side
// (transform/two_phase.h) for the torchrun path (tenplex.elastic): prepare on every
// host, then CommitEverywhere; AbortEverywhere; ResolvePending. Every call connects to
// the hosts itself and runs without the GIL (the other ranks' collectives go on).
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bindings.h"
#include "tenplex/store/client.h"
#include "tenplex/transform/cluster.h"
#include "tenplex/transform/two_phase.h"

namespace tenplex::py {
namespace {

// One client per URL (transform::ConnectCluster); with allow_lost a host that cannot be
// reached gets a null client.
struct Hosts {
  std::vector<std::unique_ptr<store::Client>> owned;
  std::vector<store::Client*> clients;
  std::vector<int> all;
};

Result<Hosts> ConnectHosts(const std::vector<std::string>& urls, const std::string& token,
                           int timeout_s, bool allow_lost) {
  if (urls.empty()) return InvalidArgument("no hosts given");
  if (timeout_s <= 0) return InvalidArgument("timeout_s must be > 0");
  store::ClientOptions o;
  o.token = token;
  o.timeout_s = timeout_s;
  transform::Cluster cluster;
  cluster.hosts = urls;
  Hosts h;
  TP_ASSIGN_OR_RETURN(h.owned, transform::ConnectCluster(cluster, o, allow_lost));
  for (std::size_t i = 0; i < h.owned.size(); ++i) {
    h.clients.push_back(h.owned[i].get());
    h.all.push_back(static_cast<int>(i));
  }
  return h;
}

// Phase one's durable half on every host at once: Store::Prepare (manifest and marker
// written, the version immutable). The first failure, naming its host, or Ok.
Status PrepareAll(const Hosts& h, const std::string& job, uint64_t version) {
  std::vector<Status> st(h.clients.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < h.clients.size(); ++i) {
    threads.emplace_back([&, i] {
      st[i] =
          h.clients[i]->Prepare(job, version).WithContext("preparing on " + h.clients[i]->url());
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : st) TP_RETURN_IF_ERROR(s);
  return Status::Ok();
}

pyb::dict OutcomeDict(const transform::CommitOutcome& c) {
  pyb::dict d;
  d["confirmed"] = c.confirmed;
  d["unconfirmed"] = c.unconfirmed;
  d["released"] = c.released;
  return d;
}

// Prepares version on every host; when all did, commits it by CommitEverywhere (the
// decision is durable from the last prepare on: a host that misses its commit rolls
// forward at the next ResolvePending). A failed prepare aborts the version everywhere
// (AbortEverywhere) and raises; a host's refused commit raises (DataLoss).
pyb::dict PrepareCommit(const std::vector<std::string>& urls, const std::string& token,
                        const std::string& job, uint64_t version, bool release, int timeout_s) {
  Result<transform::CommitOutcome> out = NoGil([&]() -> Result<transform::CommitOutcome> {
    TP_ASSIGN_OR_RETURN(Hosts h, ConnectHosts(urls, token, timeout_s, /*allow_lost=*/false));
    Status p = PrepareAll(h, job, version);
    if (!p.ok()) {
      Status a = transform::AbortEverywhere(h.clients, h.all, job, version);
      if (a.ok()) return p;
      return Status(p.code(), p.message() + " (aborting it: " + a.ToString() + ")");
    }
    return transform::CommitEverywhere(h.clients, h.all, job, version, release);
  });
  return OutcomeDict(Take(std::move(out)));
}

// Aborts version on the hosts that answer; False when the first host has already
// committed it (the caller must roll forward instead), True otherwise.
bool AbortAll(const std::vector<std::string>& urls, const std::string& token,
              const std::string& job, uint64_t version, int timeout_s) {
  Status s = NoGil([&]() -> Status {
    TP_ASSIGN_OR_RETURN(Hosts h, ConnectHosts(urls, token, timeout_s, /*allow_lost=*/true));
    return transform::AbortEverywhere(h.clients, h.all, job, version);
  });
  if (s.code() == StatusCode::kFailedPrecondition) return false;
  Check(s);
  return true;
}

// ResolvePending over the hosts (those that do not answer are skipped).
pyb::dict Resolve(const std::vector<std::string>& urls, const std::string& token,
                  const std::string& job, bool owner, int timeout_s) {
  transform::Resolution res = Take(NoGil([&]() -> Result<transform::Resolution> {
    TP_ASSIGN_OR_RETURN(Hosts h, ConnectHosts(urls, token, timeout_s, /*allow_lost=*/true));
    return transform::ResolvePending(urls, h.clients, job, owner);
  }));
  pyb::dict d;
  d["committed"] = res.committed;
  d["aborted"] = res.aborted;
  d["pending"] = res.pending;
  d["released"] = res.released;
  d["lines"] = res.lines;
  return d;
}

}  // namespace

void register_cluster(pyb::module_& m) {
  m.def("cluster_prepare_commit", &PrepareCommit, pyb::arg("urls"), pyb::arg("token"),
        pyb::arg("job"), pyb::arg("version"), pyb::arg("release") = true,
        pyb::arg("timeout_s") = 600,
        "Prepares version of job on every host, then commits it everywhere (two_phase.h); "
        "{'confirmed', 'unconfirmed', 'released'} (host indexes)");
  m.def("cluster_abort", &AbortAll, pyb::arg("urls"), pyb::arg("token"), pyb::arg("job"),
        pyb::arg("version"), pyb::arg("timeout_s") = 600,
        "Aborts version everywhere; False when it is already committed (roll forward)");
  m.def("cluster_resolve", &Resolve, pyb::arg("urls"), pyb::arg("token"), pyb::arg("job"),
        pyb::arg("owner") = true, pyb::arg("timeout_s") = 600,
        "Finishes or rolls back what a coordinator left half done (ResolvePending)");
}

}  // namespace tenplex::py
