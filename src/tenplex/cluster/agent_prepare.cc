// The transform agent's prepare and presize (agent.h): this host's part of a transform.
#include <cstdio>
#include <cstdlib>

#include "tenplex/cluster/agent_common.h"
#include "tenplex/cluster/agent_impl.h"
#include "tenplex/cluster/control_replies.h"
#include "tenplex/cluster/local_peer.h"
#include "tenplex/store/parse.h"
#include "tenplex/transform/local.h"

namespace tenplex::cluster {

using transform::AllocateDests;
using transform::ExecuteHostPart;
using transform::HostExecInput;
using transform::HostExecStats;
using transform::LinkUnchanged;
using transform::MappedDests;
using transform::MappedSources;
using transform::MapSources;
using transform::NewTensorBytes;
using transform::SourcesReadHere;
using transform::UnchangedTensors;

namespace {

// Whether this daemon reads host `peer`'s tensor files directly in r (local_peer.h)
// rather than over the transport: it allows same-host reads and the peer qualifies.
// For r.host itself: whether this daemon offered them.
bool ReadsPeerFiles(const AgentOptions& options, const PrepareRequest& r, int peer) {
  return options.local_peer_reads && peer >= 0 &&
         static_cast<std::size_t>(peer) < r.local_peers.size() &&
         LocallyReadable(r.local_peers[peer]);
}

// A prepare's phases on this host (seconds), besides the execution's own.
struct PreparePhases {
  double plan = 0;   // decoding the request, both layouts, the plan
  double warm = 0;   // pre-faulting what peers fetch over the transport; mapping sources
  double alloc = 0;  // the new version: linked tensors, allocated (or recycled) ones
  double seal = 0;   // Store::Prepare: checksums of the new tensors, manifest, marker
  double total = 0;
};

// The reply to a prepare that wrote version v.
std::string EncodeReply(uint64_t v, int host, const HostExecStats& ex, int64_t bytes_linked,
                        int64_t shm_bytes, int shm_peers, const PreparePhases& t,
                        const std::string& incarnation) {
  PrepareReply r;
  r.version = v;
  r.host = host;
  r.incarnation = incarnation;
  r.bytes_kept = ex.bytes_kept;
  r.bytes_linked = bytes_linked;
  r.bytes_local = ex.bytes_local;
  r.bytes_fetched = ex.bytes_fetched;
  r.bytes_fetched_shm = shm_bytes;
  r.remote_ops = ex.remote_ops;
  r.peers = ex.peers;
  r.peers_shm = shm_peers;
  r.plan_seconds = t.plan;
  r.warm_seconds = t.warm;
  r.alloc_seconds = t.alloc;
  r.local_seconds = ex.local_seconds;
  r.fetch_seconds = ex.fetch_seconds;
  r.landed_seconds = ex.landed_seconds;
  r.seal_seconds = t.seal;
  r.seconds = t.total;
  return EncodePrepareReply(r);
}

}  // namespace

// The old tensors of this host that peers will read over the transport (the request's
// "served", from the coordinator's whole plan: this host's own part does not say):
// mapped and pre-faulted now, so that serving them does not fault page by page on the
// transport's thread. Not those a same-host peer reads through our files (both offered
// same-host reads and it is a daemon of this machine that we see, as it sees us): it
// preads the files, so mapping and touching them here would only take CPU from its
// copies.
std::size_t Agent::Impl::WarmServed(const PrepareRequest& r, const Layout& from) {
  maps.Purge();
  // reads_files[h]: host h reads our files (both sides offered, each sees the other).
  std::vector<bool> reads_files(r.local_peers.size(), false);
  if (ReadsPeerFiles(options, r, r.host)) {
    for (std::size_t h = 0; h < reads_files.size(); ++h)
      reads_files[h] = ReadsPeerFiles(options, r, static_cast<int>(h));
  }
  std::set<std::pair<int, int>> served;
  for (const ServedTensor& s : r.served) {
    const bool by_files =
        static_cast<std::size_t>(s.reader) < reads_files.size() && reads_files[s.reader];
    if (!by_files) served.insert({s.rank, s.tensor});
  }
  std::vector<std::pair<int, int>> warm(served.begin(), served.end());
  ThreadPool::Default().ParallelFor(warm.size(), [&](std::size_t i) {
    (void)maps.Warm(store::TensorPathOf(r.job, r.from_version, warm[i].first,
                                        (*from.ranks[warm[i].first].tensors)[warm[i].second].name));
  });
  return warm.size();
}

// What ExecuteHostPart needs for this host's part of r (p: MakeHostPlan's); it points
// into the arguments, which must outlive it. Fetches go through FetchFrom.
HostExecInput Agent::Impl::ExecInput(const PrepareRequest& r, const plan::Plan& p,
                                     const Layout& from, const Layout& to, const MappedSources& src,
                                     const MappedDests& dst,
                                     const std::set<std::pair<int, int>>& linked,
                                     std::atomic<int64_t>& shm_bytes, std::atomic<int>& shm_peers) {
  HostExecInput in;
  in.plan = &p;
  in.from = &from;
  in.to = &to;
  in.from_hosts = &r.from_hosts;
  in.to_hosts = &r.to_hosts;
  in.host = r.host;
  in.src = &src.ptrs;
  in.dst = &dst.ptrs;
  in.pool = &ThreadPool::Default();
  in.linked = &linked;
  in.region_name = [&r, &from](int rank, int tensor) {
    return store::TensorPathOf(r.job, r.from_version, rank,
                               (*from.ranks[rank].tensors)[tensor].name);
  };
  in.fetch = [this, &r, &shm_bytes, &shm_peers](
                 int peer, const std::vector<transport::ReadRequest>& reqs) -> Status {
    return FetchFrom(r, peer, reqs, shm_bytes, shm_peers);
  };
  return in;
}

// Reads `reqs` from host `peer` for r, with a capability: through the files of a
// same-host peer (local_peer.h; counted in shm_bytes and shm_peers), else over the
// transport (Connect replaces a failed connection).
Status Agent::Impl::FetchFrom(const PrepareRequest& r, int peer,
                              const std::vector<transport::ReadRequest>& reqs,
                              std::atomic<int64_t>& shm_bytes, std::atomic<int>& shm_peers) {
  const std::string who = "host " + std::to_string(peer);
  const std::string capability = Capability(r, peer);
  if (ReadsPeerFiles(options, r, peer)) {
    LocalReadOptions lo;
    lo.token = options.peer_token;
    lo.capability = capability;
    lo.timeout_s = options.peer_timeout_s;
    Result<uint64_t> n = ReadFromLocalPeer(r.local_peers[peer], reqs, lo, &ThreadPool::Default());
    if (!n.ok()) {
      if (n.status().code() == StatusCode::kUnavailable)
        return Unavailable(who + ": " + n.status().message());
      return n.status().WithContext(who + " (same-host read)");
    }
    shm_bytes += static_cast<int64_t>(*n);
    ++shm_peers;
    return Status::Ok();
  }
  Result<transport::PeerId> id = transport->Connect(r.addresses.at(peer));
  if (!id.ok()) return Unavailable("host " + std::to_string(peer) + ": " + id.status().message());
  std::vector<transport::ReadRequest> with = reqs;
  for (transport::ReadRequest& q : with) q.capability = capability;
  Status s = transport->Fetch(*id, with);
  if (!s.ok()) {
    if (s.code() == StatusCode::kUnavailable)
      return Unavailable("host " + std::to_string(peer) + ": " + s.message());
    return s.WithContext("host " + std::to_string(peer));
  }
  return Status::Ok();
}

Result<std::string> Agent::Impl::Prepare(const std::string& body, const std::string& coordinator) {
  const auto t0 = std::chrono::steady_clock::now();
  TP_ASSIGN_OR_RETURN(PlannedRequest q, plans.Get(body));
  const PrepareRequest& r = q.d.request;
  const Layout& from = q.core->from;
  const Layout& to = q.core->to;
  const plan::Plan& p = q.core->plan;
  prober.Release();  // a transform needs the memory more than a later probe
  PreparePhases phases;
  phases.plan = SecondsSince(t0);
  WarmServed(r, from);
  phases.warm = SecondsSince(t0) - phases.plan;

  auto t1 = std::chrono::steady_clock::now();
  // Fenced (two_phase.h): refused when a newer version began or one newer than the
  // source was committed here meanwhile, or another coordinator holds the job's lease
  // (store/lease.h).
  uint64_t v = 0;
  TP_RETURN_IF_ERROR(store.leases().Fenced(r.job, coordinator, [&]() -> Status {
    TP_ASSIGN_OR_RETURN(v, store.BeginVersion(r.job, r.to_version, r.new_info, r.from_version));
    return Status::Ok();
  }));
  auto fail = [&](const Status& s) {
    (void)store.DropVersion(r.job, v);
    return s;
  };
  int64_t bytes_linked = 0;
  Result<std::set<std::pair<int, int>>> linked =
      LinkUnchanged(store, r.job, r.from_version, v, from, to, p, &r.from_hosts, &r.to_hosts,
                    r.host, &bytes_linked);
  if (!linked.ok()) return fail(linked.status());
  // Only what this host's own copies read is pre-faulted: not the linked tensors (no
  // copy), nor those only peers read.
  const std::set<std::pair<int, int>> read_here =
      SourcesReadHere(p, r.from_hosts, r.to_hosts, r.host, &*linked);
  const auto t_map = std::chrono::steady_clock::now();
  Result<MappedSources> src =
      MapSources(store, r.job, r.from_version, from, &r.from_hosts, r.host, &read_here);
  if (!src.ok()) return fail(src.status());
  const double map_seconds = SecondsSince(t_map);
  phases.warm += map_seconds;
  Result<MappedDests> dst = AllocateDests(store, r.job, v, to, &r.to_hosts, r.host, &*linked);
  if (!dst.ok()) return fail(dst.status());
  phases.alloc = SecondsSince(t1) - map_seconds;
  if (fault_at > 0 && !fault_in_locate && ++prepares == fault_at) {
    std::fprintf(stderr, "tenplex store: fault injection: exiting in the middle of a prepare\n");
    std::_Exit(137);  // as if SIGKILLed: peers may be reading from us right now
  }

  std::atomic<int64_t> shm_bytes{0};
  std::atomic<int> shm_peers{0};
  Result<HostExecStats> ex =
      ExecuteHostPart(ExecInput(r, p, from, to, *src, *dst, *linked, shm_bytes, shm_peers));
  metrics.CountPrepare(ex.ok(), ex.ok() ? ex->bytes_fetched : 0, ex.ok() ? ex->bytes_local : 0,
                       bytes_linked, shm_bytes, SecondsSince(t0));
  if (!ex.ok())
    return fail(ex.status().WithContext("host " + std::to_string(r.host) + " preparing version " +
                                        std::to_string(v) + " of job " + r.job));
  // Phase one done: durable across a restart of this daemon (two_phase.h). Fails when
  // the coordinator aborted the version meanwhile (it gave up waiting for us).
  const auto t2 = std::chrono::steady_clock::now();
  if (Status s = store.leases().Fenced(r.job, coordinator, [&] { return store.Prepare(r.job, v); });
      !s.ok())
    return fail(s);
  phases.seal = SecondsSince(t2);
  phases.total = SecondsSince(t0);
  Result<store::JobInfo> job = store.Job(r.job);  // its incarnation here, for later rounds
  return EncodeReply(v, r.host, *ex, bytes_linked, shm_bytes, shm_peers, phases,
                     job.ok() ? job->incarnation : "");
}

// A prepare request's new tensors on this host, made ahead in the store's page pool:
// the prepare that follows allocates them from warm pages (store.h, the page pool).
Result<std::string> Agent::Impl::Presize(const std::string& body) {
  const auto t0 = std::chrono::steady_clock::now();
  TP_ASSIGN_OR_RETURN(PlannedRequest q, plans.Get(body));
  const PrepareRequest& r = q.d.request;
  const std::vector<uint64_t> sizes = NewTensorBytes(
      q.core->to, &r.to_hosts, r.host,
      UnchangedTensors(q.core->from, q.core->to, q.core->plan, &r.from_hosts, &r.to_hosts, r.host));
  uint64_t wanted = 0, poolable = 0;
  for (uint64_t b : sizes) {
    wanted += b;
    poolable += b >= store::kPoolMinBytes ? b : 0;
  }
  prober.Release();  // as a prepare would: the pool needs the room more than a probe
  TP_ASSIGN_OR_RETURN(uint64_t pooled, store.FillPool(r.job, sizes));
  PresizeReply reply;
  reply.host = r.host;
  reply.tensors = static_cast<int64_t>(sizes.size());
  reply.wanted_bytes = static_cast<int64_t>(wanted);
  reply.poolable_bytes = static_cast<int64_t>(poolable);
  reply.pooled_bytes = static_cast<int64_t>(pooled);
  reply.pool_limit = store.page_pool_limit();
  reply.seconds = SecondsSince(t0);
  return EncodePresizeReply(reply);
}

// A host that holds old ranks but gets no new ones only serves the transform, so it is
// sent no prepare: the coordinator sends it the same body here, and it maps and
// pre-faults what its peers will fetch from it as a prepare would (WarmServed). It
// writes nothing and plans nothing: the old layout comes from the request's info.
Result<std::string> Agent::Impl::Warm(const std::string& body) {
  const auto t0 = std::chrono::steady_clock::now();
  TP_ASSIGN_OR_RETURN(DecodedPrepare d, DecodePrepare(body));
  TP_ASSIGN_OR_RETURN(Layout from, MakeLayout(d.from.model(), d.from.config()));
  TP_RETURN_IF_ERROR(CheckServed(d.request, from));
  WarmReply reply;
  reply.host = d.request.host;
  reply.tensors = static_cast<int64_t>(WarmServed(d.request, from));
  reply.seconds = SecondsSince(t0);
  return EncodeWarmReply(reply);
}

}  // namespace tenplex::cluster
