#include "tenplex/transform/agent.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "tenplex/model/model.h"
#include "tenplex/plan/planner.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/store/mapping.h"
#include "tenplex/store/parse.h"
#include "tenplex/transform/control_protocol.h"
#include "tenplex/transform/host_exec.h"
#include "tenplex/transform/local.h"
#include "tenplex/transform/local_peer.h"
#include "tenplex/transport/bandwidth.h"
#include "tenplex/transport/capability.h"
#include "tenplex/transport/peer_files.h"
#include "tenplex/util/json_depth.h"
#include "tenplex/util/json_value.h"

namespace tenplex::transform {

using nlohmann::json;

namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Result<json> ParseBody(const std::string& body) {
  TP_RETURN_IF_ERROR(CheckJsonDepth(body, "request body"));
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("request body is not a JSON object");
  return j;
}

// The layouts and the plan of a request: what a presize computed, the prepare that
// follows reuses (PlanCache).
struct PlanCore {
  Layout from, to;
  plan::Plan plan;
};

// What a prepare (or presize) request asks of this host: the request, the old and new
// layouts, and the coordinator's plan, checked against this host's own.
struct PlannedRequest {
  DecodedPrepare d;
  std::shared_ptr<const PlanCore> core;
};

}  // namespace

struct Agent::Impl {
  store::Store& store;
  AgentOptions options;
  std::unique_ptr<transport::Transport> transport;

  int fault_at = 0;  // exit in this prepare or locate (1-based); 0: never
  bool fault_in_locate = false;
  std::atomic<int> prepares{0}, locates{0};

  // Metrics (GET /metrics): prepares by outcome, bytes by source, seconds.
  std::mutex metrics_mu;
  uint64_t prepared = 0, failed = 0;                                  // guarded by metrics_mu
  uint64_t bytes_fetched = 0, bytes_local = 0, bytes_linked_sum = 0;  // guarded by metrics_mu
  uint64_t bytes_fetched_shm = 0;                                     // guarded by metrics_mu
  std::atomic<uint64_t> files_located{0};  // files named to same-host peers
  std::atomic<uint64_t> plans_reused{0};   // prepares that took a presize's plan
  double prepare_seconds = 0;              // guarded by metrics_mu
  // Fetches refused for their capability, by transport::CapabilityRefusal.
  std::atomic<uint64_t> refused[5] = {0, 0, 0, 0, 0};
  std::string MetricsText();

  explicit Impl(store::Store& s, AgentOptions o) : store(s), options(std::move(o)) {
    reaper = std::thread([this] { ReapLoop(); });
    release_listener = store.OnRelease([this](const std::string& job) { Purge(&job); });
  }
  ~Impl() {
    release_listener.reset();  // waits for a call in progress
    {
      std::lock_guard<std::mutex> lock(reap_mu);
      reap_stop = true;
    }
    reap_cv.notify_one();
    reaper.join();
  }
  std::shared_ptr<void> release_listener;  // Store::OnRelease

  // Maps of the committed tensors peers read, kept between requests: a fresh map of
  // a tmpfs file starts with empty page tables, and on some machines a page fault
  // costs more than copying the page, so every map is pre-faulted once and reused.
  // Committed tensors never change; an entry is dropped when its tensor is gone (its
  // version released) or replaced, checked when the store releases versions of its job
  // (Store::OnRelease) and at every prepare (Purge).
  std::mutex cache_mu;
  std::unordered_map<std::string, std::shared_ptr<const store::TensorRef>> cache;

  // Dropped maps are destroyed on this thread: the last map of a released tensor frees
  // its pages (the kernel evicts the unlinked file then), which for a whole version is
  // tenths of a second that neither a commit nor a prepare should wait for.
  std::mutex reap_mu;
  std::condition_variable reap_cv;
  std::vector<std::shared_ptr<const store::TensorRef>> reap;  // guarded by reap_mu
  bool reap_stop = false;                                     // guarded by reap_mu
  std::thread reaper;
  void ReapLoop() {
    std::unique_lock<std::mutex> lock(reap_mu);
    while (true) {
      reap_cv.wait(lock, [&] { return reap_stop || !reap.empty(); });
      if (reap.empty()) return;  // stopping, nothing left
      std::vector<std::shared_ptr<const store::TensorRef>> now;
      now.swap(reap);
      lock.unlock();
      now.clear();
      lock.lock();
    }
  }

  // A large region of a fixed pattern (transport::ProbeByte) for probes that move
  // distinct memory, as a transform does (the transport's own probe region is 64 MiB,
  // which caches flatter than any real state). Allocated on first use.
  static constexpr std::string_view kScratchRegion = "tenplex.agent.scratch";
  static constexpr uint64_t kScratchBytes = 512ull << 20;
  std::shared_ptr<std::vector<uint8_t>> scratch;  // guarded by cache_mu
  std::shared_ptr<void> scratch_reservation;      // guarded by cache_mu (Store::Reserve)

  // Makes the scratch region (on the prober's thread and the pool, never on the
  // transport's thread, which must stay responsive).
  void EnsureScratch() {
    {
      std::lock_guard<std::mutex> lock(cache_mu);
      if (scratch) return;
    }
    auto s = std::make_shared<std::vector<uint8_t>>(kScratchBytes);
    constexpr uint64_t kChunk = 8ull << 20;
    ThreadPool::Default().ParallelFor(kScratchBytes / kChunk, [&](std::size_t c) {
      for (uint64_t i = c * kChunk; i < (c + 1) * kChunk; ++i) (*s)[i] = transport::ProbeByte(i);
    });
    std::lock_guard<std::mutex> lock(cache_mu);
    if (!scratch) scratch = std::move(s);
  }

  // Drops the scratch region (and its reservation) until the next probe makes it again:
  // 512 MiB a daemon, which a transform on a full machine needs (8 daemons of one
  // machine kept 4 GiB of it). A fetch in flight keeps its region alive (Region's owner).
  void ReleaseScratch() {
    std::lock_guard<std::mutex> lock(cache_mu);
    scratch.reset();
    scratch_reservation.reset();
  }

  // The capability of this host's fetches from host `peer` in the transform r: for the
  // peer's incarnation of the job, as the coordinator learned it.
  std::string Capability(const PrepareRequest& r, int peer) {
    const int64_t now = transport::UnixSeconds();
    return transport::MintCapability(
        options.capability_key, {r.job, r.from_version, r.to_version,
                                 now + options.capability_lifetime_seconds, r.incarnations[peer]});
  }

  // PermissionDenied (and counted) unless `capability` lets a peer read `name` now.
  Status Authorize(std::string_view name, std::string_view capability) {
    const int64_t now = transport::UnixSeconds();
    transport::CapabilityCheck c =
        transport::CheckCapability(options.capability_key, capability, now);
    if (c.refusal == transport::CapabilityRefusal::kNone) {
      Result<store::TensorPath> p = store::ParseTensorPath(name);
      if (!p.ok() || p->job != c.grant.job || p->version != c.grant.from_version) {
        c.refusal = transport::CapabilityRefusal::kScope;
        c.why = "the fetch's capability does not cover " + std::string(name);
      } else if (Result<store::JobInfo> j = store.Job(c.grant.job); !j.ok()) {
        // No such job here: the lookup says so.
      } else if (j->incarnation != c.grant.incarnation) {
        c.refusal = transport::CapabilityRefusal::kScope;
        c.why = "the fetch's capability is for another incarnation of job " + c.grant.job +
                " (deleted and created again since, or another host's)";
      } else if ((j->current && *j->current >= c.grant.to_version) ||
                 j->closed >= c.grant.to_version) {
        c.refusal = transport::CapabilityRefusal::kExpired;
        c.why = "the fetch's capability expired: its transform to version " +
                std::to_string(c.grant.to_version) + " is over";
      }
    }
    if (c.refusal == transport::CapabilityRefusal::kNone) return Status::Ok();
    ++refused[static_cast<int>(c.refusal)];
    return PermissionDenied(c.why);
  }

  // Peers read committed tensors only, by store path, with a capability; the probe
  // regions (fixed patterns) with a probe capability (issue 35: they were open to all).
  Result<transport::Region> Lookup(std::string_view name, std::string_view capability) {
    if (name == kScratchRegion) {
      TP_RETURN_IF_ERROR(transport::CheckProbeCapability(options.capability_key, capability));
      std::lock_guard<std::mutex> lock(cache_mu);
      if (!scratch)
        return NotFound("this daemon has no probe scratch region yet (it makes one when probed)");
      return transport::Region{scratch->data(), scratch->size(), scratch};
    }
    TP_RETURN_IF_ERROR(Authorize(name, capability));
    const std::string path(name);
    TP_ASSIGN_OR_RETURN(store::TensorInfo meta, store.Meta(path));
    if (!meta.committed) return NotFound(path + " is not committed");
    {
      std::lock_guard<std::mutex> lock(cache_mu);
      auto it = cache.find(path);
      if (it != cache.end() && it->second->info().file == meta.file) {
        return transport::Region{it->second->data(), it->second->size(), it->second};
      }
    }
    TP_ASSIGN_OR_RETURN(std::shared_ptr<const store::TensorRef> ref, Warm(path));
    return transport::Region{ref->data(), ref->size(), ref};
  }

  // Holds a reference to the committed tensor `path` (file `file`) in the cache, so that
  // while it is cached the store's page pool never recycles the file under a same-host
  // peer's open descriptor (a released version's files that a reference still maps are
  // not pooled, store.h). Purge drops it once the version is gone. No prefault: the
  // peer reads the file, not our map.
  Status Pin(const std::string& path, const std::string& file) {
    {
      std::lock_guard<std::mutex> lock(cache_mu);
      auto it = cache.find(path);
      if (it != cache.end() && it->second->info().file == file) return Status::Ok();
    }
    TP_ASSIGN_OR_RETURN(store::TensorRef ref, store.Get(path));
    if (!ref.info().committed) return NotFound(path + " is not committed");
    auto hold = std::make_shared<const store::TensorRef>(std::move(ref));
    std::lock_guard<std::mutex> lock(cache_mu);
    cache[path] = std::move(hold);
    return Status::Ok();
  }

  Result<std::shared_ptr<const store::TensorRef>> Warm(const std::string& path) {
    TP_ASSIGN_OR_RETURN(store::TensorRef ref, store.Get(path));
    if (!ref.info().committed) return NotFound(path + " is not committed");
    ref.Prefault();
    auto hold = std::make_shared<const store::TensorRef>(std::move(ref));
    std::lock_guard<std::mutex> lock(cache_mu);
    cache[path] = hold;
    return hold;
  }

  // Drops the entries whose tensor is gone or replaced (of `job` only, if given); the
  // reaper unmaps them.
  void Purge(const std::string* job = nullptr) {
    auto other_job = [job](const std::string& path) {
      if (!job) return false;
      Result<store::TensorPath> p = store::ParseTensorPath(path);
      return p.ok() && p->job != *job;
    };
    std::vector<std::shared_ptr<const store::TensorRef>> dropped;
    {
      std::lock_guard<std::mutex> lock(cache_mu);
      for (auto it = cache.begin(); it != cache.end();) {
        if (other_job(it->first)) {
          ++it;
          continue;
        }
        Result<store::TensorInfo> meta = store.Meta(it->first);
        if (!meta.ok() || meta->file != it->second->info().file) {
          dropped.push_back(std::move(it->second));
          it = cache.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (dropped.empty()) return;
    std::lock_guard<std::mutex> lock(reap_mu);
    for (auto& d : dropped) reap.push_back(std::move(d));
    reap_cv.notify_one();
  }

  Result<std::string> Prepare(const std::string& body, const std::string& coordinator);
  Result<std::string> Probe(const std::string& body);
  Result<std::string> Presize(const std::string& body);
  Result<std::string> Locate(const std::string& body);
  std::string AddressReply(const std::string& job = "");

 private:
  // Decodes and plans a prepare or presize request (or takes the plan of the last one).
  Result<PlannedRequest> PlanRequest(const std::string& body);
  std::mutex plan_mu;
  std::shared_ptr<const PlanCore> last_plan;  // guarded by plan_mu
  std::string last_plan_key;                  // guarded by plan_mu

  // Prepare's parts.
  void WarmServed(const PrepareRequest& r, const Layout& from, const plan::Plan& p);
  HostExecInput ExecInput(const PrepareRequest& r, const plan::Plan& p, const Layout& from,
                          const Layout& to, const MappedSources& src, const MappedDests& dst,
                          const std::set<std::pair<int, int>>& linked,
                          std::atomic<int64_t>& shm_bytes, std::atomic<int>& shm_peers);
  void CountPrepare(const Result<HostExecStats>& ex, int64_t bytes_linked, int64_t shm_bytes,
                    double seconds);
  // Probe's parts.
  Result<double> FetchScratchInto(transport::PeerId peer, uint64_t large, uint8_t* dest,
                                  double* first = nullptr);
  Result<double> FreshWriteGbps(uint64_t bytes);
};

namespace {

// The plan of the transform r describes, which must be the coordinator's: a daemon of
// another build (another planner) refuses instead of silently moving different bytes.
Result<plan::Plan> CoordinatorsPlan(const Model& model, const PrepareRequest& r, const Layout& from,
                                    const Layout& to) {
  TP_ASSIGN_OR_RETURN(plan::Plan p, plan::MakePlan(model, from, to, r.from_hosts, r.to_hosts));
  if (const std::string mine = PlanDigest(p); mine != r.plan_digest) {
    return FailedPrecondition("host " + std::to_string(r.host) + " computes a plan with digest " +
                              mine + " but the coordinator's has " + r.plan_digest +
                              ": the daemons run different builds of tenplex");
  }
  return p;
}

// What determines a request's layouts and plan: the model, both configs, where the
// ranks live and the coordinator's digest (not the job, versions, addresses or the
// rest of the info, which change from the presize to its prepare).
std::string PlanKey(const DecodedPrepare& d) {
  std::string key = d.from.field("model").dump();
  key += '\n' + d.from.config().ToString() + '\n' + d.request.to_config.ToString() + '\n';
  for (int h : d.request.from_hosts) key += std::to_string(h) + ',';
  key += '\n';
  for (int h : d.request.to_hosts) key += std::to_string(h) + ',';
  key += '\n' + d.request.plan_digest;
  return key;
}

}  // namespace

// The last plan this agent computed, by PlanKey: the prepare after a presize of the
// same transform (tenplex run pre-sizes the next config while the old one trains)
// plans nothing again. Each daemon plans the whole transform (every host's ops), which
// with many daemons on few cores is a visible part of a prepare. One entry: a plan
// can be large, and only the next transform's is worth keeping.
Result<PlannedRequest> Agent::Impl::PlanRequest(const std::string& body) {
  PlannedRequest q;
  TP_ASSIGN_OR_RETURN(q.d, DecodePrepare(body));
  const std::string key = PlanKey(q.d);
  {
    std::lock_guard<std::mutex> lock(plan_mu);
    if (last_plan && last_plan_key == key) {
      q.core = last_plan;
      ++plans_reused;
      return q;
    }
  }
  const Model& model = q.d.from.model();
  auto core = std::make_shared<PlanCore>();
  TP_ASSIGN_OR_RETURN(core->from, MakeLayout(model, q.d.from.config()));
  TP_ASSIGN_OR_RETURN(core->to, MakeLayout(model, q.d.request.to_config));
  TP_ASSIGN_OR_RETURN(core->plan, CoordinatorsPlan(model, q.d.request, core->from, core->to));
  q.core = core;
  std::lock_guard<std::mutex> lock(plan_mu);
  last_plan = std::move(core);
  last_plan_key = key;
  return q;
}

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
std::string PrepareReply(uint64_t v, int host, const HostExecStats& ex, int64_t bytes_linked,
                         int64_t shm_bytes, int shm_peers, const PreparePhases& t,
                         const std::string& incarnation) {
  json reply = {{"version", v},
                {"host", host},
                {"incarnation", incarnation},
                {"bytes_kept", ex.bytes_kept},
                {"bytes_linked", bytes_linked},
                {"bytes_local", ex.bytes_local},
                {"bytes_fetched", ex.bytes_fetched},
                {"bytes_fetched_shm", shm_bytes},
                {"remote_ops", ex.remote_ops},
                {"peers", ex.peers},
                {"peers_shm", shm_peers},
                {"plan_seconds", t.plan},
                {"warm_seconds", t.warm},
                {"alloc_seconds", t.alloc},
                {"local_seconds", ex.local_seconds},
                {"fetch_seconds", ex.fetch_seconds},
                {"landed_seconds", ex.landed_seconds},
                {"seal_seconds", t.seal},
                {"seconds", t.total}};
  return reply.dump();
}

}  // namespace

// The old tensors of this host that peers will read over the transport: mapped and
// pre-faulted now, so that serving them does not fault page by page on the transport's
// thread. Not those a same-host peer reads through our files (both offered same-host
// reads and it is a daemon of this machine that we see, as it sees us): it preads the
// files, so mapping and touching them here would only take CPU from its copies.
void Agent::Impl::WarmServed(const PrepareRequest& r, const Layout& from, const plan::Plan& p) {
  Purge();
  // reads_files[h]: host h reads our files (both sides offered, each sees the other).
  std::vector<bool> reads_files(r.local_peers.size(), false);
  if (ReadsPeerFiles(options, r, r.host)) {
    for (std::size_t h = 0; h < reads_files.size(); ++h)
      reads_files[h] = ReadsPeerFiles(options, r, static_cast<int>(h));
  }
  std::set<std::pair<int, int>> served;
  for (const plan::CopyOp& op : p.ops) {
    const int reader = r.to_hosts[op.dst_rank];
    const bool by_files =
        static_cast<std::size_t>(reader) < reads_files.size() && reads_files[reader];
    if (!op.src_new && r.from_hosts[op.src_rank] == r.host && reader != r.host && !by_files)
      served.insert({op.src_rank, op.src_tensor});
  }
  std::vector<std::pair<int, int>> warm(served.begin(), served.end());
  ThreadPool::Default().ParallelFor(warm.size(), [&](std::size_t i) {
    (void)Warm(store::TensorPathOf(r.job, r.from_version, warm[i].first,
                                   (*from.ranks[warm[i].first].tensors)[warm[i].second].name));
  });
}

// What ExecuteHostPart needs for this host's part of r; it points into the arguments,
// which must outlive it. Fetches go to the peers with a capability each: through the files of
// a same-host peer (local_peer.h; counted in shm_bytes and shm_peers), else over the
// transport (Connect replaces a failed connection).
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
  };
  return in;
}

void Agent::Impl::CountPrepare(const Result<HostExecStats>& ex, int64_t bytes_linked,
                               int64_t shm_bytes, double seconds) {
  std::lock_guard<std::mutex> lock(metrics_mu);
  if (ex.ok()) {
    ++prepared;
    bytes_fetched += ex->bytes_fetched;
    bytes_local += ex->bytes_local;
    bytes_linked_sum += static_cast<uint64_t>(bytes_linked);
    bytes_fetched_shm += static_cast<uint64_t>(shm_bytes);
  } else {
    ++failed;
  }
  prepare_seconds += seconds;
}

Result<std::string> Agent::Impl::Prepare(const std::string& body, const std::string& coordinator) {
  const auto t0 = std::chrono::steady_clock::now();
  TP_ASSIGN_OR_RETURN(PlannedRequest q, PlanRequest(body));
  const PrepareRequest& r = q.d.request;
  const Layout& from = q.core->from;
  const Layout& to = q.core->to;
  const plan::Plan& p = q.core->plan;
  ReleaseScratch();  // a transform needs the memory more than a later probe
  PreparePhases phases;
  phases.plan = Since(t0);
  WarmServed(r, from, p);
  phases.warm = Since(t0) - phases.plan;

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
  const double map_seconds = Since(t_map);
  phases.warm += map_seconds;
  Result<MappedDests> dst = AllocateDests(store, r.job, v, to, &r.to_hosts, r.host, &*linked);
  if (!dst.ok()) return fail(dst.status());
  phases.alloc = Since(t1) - map_seconds;
  if (fault_at > 0 && !fault_in_locate && ++prepares == fault_at) {
    std::fprintf(stderr, "tenplex store: fault injection: exiting in the middle of a prepare\n");
    std::_Exit(137);  // as if SIGKILLed: peers may be reading from us right now
  }

  std::atomic<int64_t> shm_bytes{0};
  std::atomic<int> shm_peers{0};
  Result<HostExecStats> ex =
      ExecuteHostPart(ExecInput(r, p, from, to, *src, *dst, *linked, shm_bytes, shm_peers));
  CountPrepare(ex, bytes_linked, shm_bytes, Since(t0));
  if (!ex.ok())
    return fail(ex.status().WithContext("host " + std::to_string(r.host) + " preparing version " +
                                        std::to_string(v) + " of job " + r.job));
  // Phase one done: durable across a restart of this daemon (two_phase.h). Fails when
  // the coordinator aborted the version meanwhile (it gave up waiting for us).
  const auto t2 = std::chrono::steady_clock::now();
  if (Status s = store.leases().Fenced(r.job, coordinator, [&] { return store.Prepare(r.job, v); });
      !s.ok())
    return fail(s);
  phases.seal = Since(t2);
  phases.total = Since(t0);
  Result<store::JobInfo> job = store.Job(r.job);  // its incarnation here, for later rounds
  return PrepareReply(v, r.host, *ex, bytes_linked, shm_bytes, shm_peers, phases,
                      job.ok() ? job->incarnation : "");
}

// A same-host peer's question where the tensors it may read are: for each (in order), the
// committed tensor's file, size and identity, if the capability covers it (Authorize, as
// for a data-plane fetch; refusals are counted the same way).
Result<std::string> Agent::Impl::Locate(const std::string& body) {
  if (!options.local_peer_reads)
    return FailedPrecondition("this daemon does not offer same-host reads (--no-local-peer-reads)");
  TP_ASSIGN_OR_RETURN(json j, ParseBody(body));
  const std::string capability = JsonValueOr(j, "capability", std::string());
  if (!j.contains("tensors") || !j["tensors"].is_array() || j["tensors"].size() > 100000)
    return InvalidArgument("'tensors' must be an array of at most 100000 store paths");
  if (fault_at > 0 && fault_in_locate && ++locates == fault_at) {
    std::fprintf(stderr, "tenplex store: fault injection: exiting in a peer's locate\n");
    std::_Exit(137);  // as if SIGKILLed: a peer is about to read our files
  }
  json files = json::array();
  for (const json& t : j["tensors"]) {
    if (!t.is_string()) return InvalidArgument("'tensors' entries must be strings");
    const std::string path = t.get<std::string>();
    TP_RETURN_IF_ERROR(Authorize(path, capability));
    TP_ASSIGN_OR_RETURN(store::TensorInfo meta, store.Meta(path));
    if (!meta.committed) return NotFound(path + " is not committed");
    TP_RETURN_IF_ERROR(Pin(path, meta.file));
    TP_ASSIGN_OR_RETURN(transport::FileIdentity id, transport::IdentifyFile(meta.file));
    if (id.bytes != meta.bytes)
      return DataLoss(path + ": its file has " + std::to_string(id.bytes) + " bytes, not " +
                      std::to_string(meta.bytes));
    files.push_back(json{{"tensor", path},
                         {"file", meta.file},
                         {"bytes", meta.bytes},
                         {"dev", id.dev},
                         {"ino", id.ino}});
  }
  files_located += files.size();
  return json{{"files", std::move(files)}}.dump();
}

// POST names a job ({"job": J}): the reply adds this store's incarnation of it, if any
// (the coordinator's capabilities name it: transport/capability.h).
std::string Agent::Impl::AddressReply(const std::string& job) {
  json reply = {{"address", transport->LocalAddress()}, {"kind", std::string(transport->kind())}};
  if (Result<store::JobInfo> j = store.Job(job); !job.empty() && j.ok())
    reply["incarnation"] = j->incarnation;
  if (options.local_peer_reads && !transport::HostBootId().empty()) {
    reply["local"] = {{"host_id", transport::HostBootId()},
                      {"shm_dir", store.shm_dir()},
                      {"store_id", store.id()}};
  }
  return reply.dump();
}

// Fetches `large` bytes of the peer's scratch region into dest, 4 times, checking the
// bytes: the best rate of the last 3 in GB/s (first: the first one's, which also makes
// the peer allocate the region). Distinct memory on both sides.
Result<double> Agent::Impl::FetchScratchInto(transport::PeerId peer, uint64_t large, uint8_t* dest,
                                             double* first) {
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    transport::ReadRequest req{
        std::string(kScratchRegion), {}, transport::MintProbeCapability(options.capability_key)};
    for (uint64_t at = 0; at < large; at += 16ull << 20) {
      req.runs.push_back({at, std::min<uint64_t>(16ull << 20, large - at), dest + at});
    }
    auto t0 = std::chrono::steady_clock::now();
    Status st = transport->Fetch(peer, {req});
    // A peer probed at the same moment may still be making its scratch region.
    for (int wait = 0; st.code() == StatusCode::kNotFound && wait < 150; ++wait) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      t0 = std::chrono::steady_clock::now();
      st = transport->Fetch(peer, {req});
    }
    TP_RETURN_IF_ERROR(st);
    const double s = Since(t0);
    for (uint64_t at = 0; at < large; at += 1 << 20) {
      if (dest[at] != transport::ProbeByte(at))
        return DataLoss("probe: wrong byte at offset " + std::to_string(at));
    }
    if (rep > 0) best = std::max(best, static_cast<double>(large) / s / 1e9);
    if (rep == 0 && first != nullptr) *first = static_cast<double>(large) / s / 1e9;
  }
  return best;
}

// Writing fresh shared memory, as a transform does: allocate a new tmpfs file, map it
// and copy a warm buffer of `bytes` into it (best of 3, GB/s).
Result<double> Agent::Impl::FreshWriteGbps(uint64_t bytes) {
  std::vector<uint8_t> warm(bytes, 0x5a);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    std::random_device rd;
    const std::string file =
        store.shm_dir() + "/tmp/probe-" + std::to_string(getpid()) + "-" + std::to_string(rd());
    auto t0 = std::chrono::steady_clock::now();
    Result<store::ShmMapping> m = store::ShmMapping::Create(file, bytes);
    if (!m.ok()) return m.status();
    std::memcpy(m->data(), warm.data(), bytes);
    const double s = Since(t0);
    ::unlink(file.c_str());
    best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  return best;
}

Result<std::string> Agent::Impl::Probe(const std::string& body) {
  TP_ASSIGN_OR_RETURN(json j, ParseBody(body));
  if (!j.contains("address") || !j["address"].is_string())
    return InvalidArgument("'address' must be a string");
  const std::string address = j["address"].get<std::string>();
  uint64_t bytes = 256ull << 20;
  if (j.contains("bytes")) {
    if (!j["bytes"].is_number_unsigned())
      return InvalidArgument("'bytes' must be a non-negative integer");
    bytes = j["bytes"].get<uint64_t>();
  }
  if (bytes < (1ull << 20) || bytes > (4ull << 30))
    return InvalidArgument("'bytes' must be in [1 MiB, 4 GiB]");
  // Everything the probe allocates counts against --memory-limit while it runs (its
  // buffers: `large` private and shared, `bytes` warm and fresh shared memory), and the
  // scratch region it keeps for peers until the daemon's next transform.
  const uint64_t large = std::min<uint64_t>(bytes, kScratchBytes);
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    if (!scratch_reservation) {
      TP_ASSIGN_OR_RETURN(scratch_reservation,
                          store.Reserve(kScratchBytes, "the probe's scratch region"));
    }
  }
  TP_ASSIGN_OR_RETURN(
      std::shared_ptr<void> reservation,
      store.Reserve(2 * large + 2 * bytes, "a probe of " + std::to_string(bytes) + " bytes"));
  EnsureScratch();
  TP_ASSIGN_OR_RETURN(transport::PeerId peer, transport->Connect(address));
  transport::FetchBandwidthOptions fo;
  fo.bytes = bytes;
  fo.capability = transport::MintProbeCapability(options.capability_key);
  TP_ASSIGN_OR_RETURN(double fetch_gbps, transport::MeasureFetchBandwidth(*transport, peer, fo));
  // The same from the peer's large scratch region into a large local buffer.
  std::vector<uint8_t> dest(large, 0);
  TP_ASSIGN_OR_RETURN(double large_gbps, FetchScratchInto(peer, large, dest.data()));
  // And into a shared-memory tensor file, where a transform writes.
  std::random_device rd;
  const std::string shm_file =
      store.shm_dir() + "/tmp/probe-" + std::to_string(getpid()) + "-" + std::to_string(rd());
  Result<store::ShmMapping> shm = store::ShmMapping::Create(shm_file, large);
  ::unlink(shm_file.c_str());
  if (!shm.ok()) return shm.status();
  shm->Prefault();
  double shm_first_gbps = 0;
  TP_ASSIGN_OR_RETURN(double shm_gbps, FetchScratchInto(peer, large, shm->data(), &shm_first_gbps));
  TP_ASSIGN_OR_RETURN(double fresh_gbps, FreshWriteGbps(bytes));
  json reply = {{"bytes", bytes},
                {"fetch_gbps", fetch_gbps},
                {"fetch_large_gbps", large_gbps},
                {"fetch_into_shm_gbps", shm_gbps},
                {"fetch_into_shm_first_gbps", shm_first_gbps},
                {"fresh_write_gbps", fresh_gbps},
                {"memcpy_gbps", transport::MeasureMemcpyBandwidth(bytes)}};
  return reply.dump();
}

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Agent::~Agent() = default;

Result<std::unique_ptr<Agent>> Agent::Create(store::Store& store, const AgentOptions& options) {
  auto impl = std::make_unique<Impl>(store, options);
  if (!options.fault.empty()) {
    const std::string f = options.fault;
    const std::string kind = f.substr(0, f.find(':'));
    const std::string n = f.find(':') == std::string::npos ? "1" : f.substr(f.find(':') + 1);
    if ((kind != "exit-in-prepare" && kind != "exit-in-locate") || n.empty() || n.size() > 6 ||
        n.find_first_not_of("0123456789") != std::string::npos || std::stoi(n) < 1) {
      return InvalidArgument("fault '" + f +
                             "': expected exit-in-prepare[:N] or exit-in-locate[:N] (N >= 1)");
    }
    impl->fault_at = std::stoi(n);
    impl->fault_in_locate = kind == "exit-in-locate";
  }
  Impl* raw = impl.get();
  transport::TransportOptions to = options.transport_options;
  to.probe_key = options.capability_key;  // the probe region too needs a capability
  TP_ASSIGN_OR_RETURN(impl->transport,
                      transport::NewTransport(
                          options.transport,
                          [raw](std::string_view name, std::string_view capability) {
                            return raw->Lookup(name, capability);
                          },
                          to));
  return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

std::string Agent::address() const { return impl_->transport->LocalAddress(); }
std::string Agent::metrics() const { return impl_->MetricsText(); }

std::string Agent::Impl::MetricsText() {
  std::lock_guard<std::mutex> lock(metrics_mu);
  auto num = [](double v) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.17g", v);
    return std::string(b);
  };
  std::string o;
  o += "# HELP tenplex_transform_prepares_total Transform prepares of this host (phase one), by "
       "outcome.\n";
  o += "# TYPE tenplex_transform_prepares_total counter\n";
  o += "tenplex_transform_prepares_total{outcome=\"ok\"} " + std::to_string(prepared) + "\n";
  o += "tenplex_transform_prepares_total{outcome=\"failed\"} " + std::to_string(failed) + "\n";
  o += "# HELP tenplex_transform_bytes_total Bytes of new versions written by transforms, by "
       "source.\n";
  o += "# TYPE tenplex_transform_bytes_total counter\n";
  o += "tenplex_transform_bytes_total{source=\"fetched\"} " + std::to_string(bytes_fetched) + "\n";
  o += "tenplex_transform_bytes_total{source=\"local\"} " + std::to_string(bytes_local) + "\n";
  o +=
      "tenplex_transform_bytes_total{source=\"linked\"} " + std::to_string(bytes_linked_sum) + "\n";
  o += "# HELP tenplex_transform_fetched_shm_bytes_total The part of the fetched bytes read "
       "from same-host peers' shared-memory files (not over the data plane).\n";
  o += "# TYPE tenplex_transform_fetched_shm_bytes_total counter\n";
  o += "tenplex_transform_fetched_shm_bytes_total " + std::to_string(bytes_fetched_shm) + "\n";
  o += "# HELP tenplex_peer_files_located_total Tensor files named to same-host peers "
       "(POST /v1/transform/locate).\n";
  o += "# TYPE tenplex_peer_files_located_total counter\n";
  o += "tenplex_peer_files_located_total " + std::to_string(files_located.load()) + "\n";
  o += "# HELP tenplex_transform_plans_reused_total Prepares and presizes that took the plan "
       "of the request before (the same transform pre-sized ahead), not planning again.\n";
  o += "# TYPE tenplex_transform_plans_reused_total counter\n";
  o += "tenplex_transform_plans_reused_total " + std::to_string(plans_reused.load()) + "\n";
  o += "# HELP tenplex_transform_seconds_total Seconds spent in transform prepares.\n";
  o += "# TYPE tenplex_transform_seconds_total counter\n";
  o += "tenplex_transform_seconds_total " + num(prepare_seconds) + "\n";
  o += "# HELP tenplex_fetch_served_bytes_total Bytes this daemon's data plane sent to peers.\n";
  o += "# TYPE tenplex_fetch_served_bytes_total counter\n";
  o += "tenplex_fetch_served_bytes_total " + std::to_string(transport->BytesServed()) + "\n";
  o += "# HELP tenplex_fetch_bounded_total Data-plane requests refused for their size or their "
       "connection's answers in flight.\n# TYPE tenplex_fetch_bounded_total counter\n"
       "tenplex_fetch_bounded_total " +
       std::to_string(transport->RequestsRefused()) +
       "\n# HELP tenplex_fetch_staged_bytes_peak The most staging memory answers held at once.\n"
       "# TYPE tenplex_fetch_staged_bytes_peak gauge\ntenplex_fetch_staged_bytes_peak " +
       std::to_string(transport->PeakStagedBytes()) + "\n";
  o += "# HELP tenplex_fetch_refused_total Data-plane fetches refused for their capability, by "
       "reason.\n";
  o += "# TYPE tenplex_fetch_refused_total counter\n";
  for (auto r : {transport::CapabilityRefusal::kMissing, transport::CapabilityRefusal::kWrong,
                 transport::CapabilityRefusal::kExpired, transport::CapabilityRefusal::kScope}) {
    o += "tenplex_fetch_refused_total{reason=\"" +
         std::string(transport::CapabilityRefusalName(r)) + "\"} " +
         std::to_string(refused[static_cast<int>(r)].load()) + "\n";
  }
  return o;
}

// A prepare request's new tensors on this host, made ahead in the store's page pool:
// the prepare that follows allocates them from warm pages (store.h, the page pool).
Result<std::string> Agent::Impl::Presize(const std::string& body) {
  const auto t0 = std::chrono::steady_clock::now();
  TP_ASSIGN_OR_RETURN(PlannedRequest q, PlanRequest(body));
  const PrepareRequest& r = q.d.request;
  const std::vector<uint64_t> sizes = NewTensorBytes(
      q.core->to, &r.to_hosts, r.host,
      UnchangedTensors(q.core->from, q.core->to, q.core->plan, &r.from_hosts, &r.to_hosts, r.host));
  uint64_t wanted = 0, poolable = 0;
  for (uint64_t b : sizes) {
    wanted += b;
    poolable += b >= store::kPoolMinBytes ? b : 0;
  }
  ReleaseScratch();  // as a prepare would: the pool needs the room more than a probe
  TP_ASSIGN_OR_RETURN(uint64_t pooled, store.FillPool(r.job, sizes));
  json reply = {{"host", r.host},         {"tensors", sizes.size()},
                {"wanted_bytes", wanted}, {"poolable_bytes", poolable},
                {"pooled_bytes", pooled}, {"pool_limit", store.page_pool_limit()},
                {"seconds", Since(t0)}};
  return reply.dump();
}

void Agent::Install(store::Server& server) {
  server.AddMetricsSource([this] { return impl_->MetricsText(); });
  server.AddJsonRoute(
      "/v1/transform/",
      [this](const std::string& method, const std::string& path, const std::string& body,
             const std::string& coordinator) { return Handle(method, path, body, coordinator); });
}

Result<std::string> Agent::Handle(const std::string& method, const std::string& path,
                                  const std::string& body, const std::string& coordinator) {
  if (path == "/v1/transform/address") {
    if (method == "GET") return impl_->AddressReply();
    if (method != "POST") return InvalidArgument(method + " is not allowed on " + path);
    TP_ASSIGN_OR_RETURN(json j, ParseBody(body));
    if (!j.contains("job") || !j["job"].is_string())
      return InvalidArgument("'job' must be a string");
    TP_RETURN_IF_ERROR(store::CheckJobName(j["job"].get<std::string>()));
    return impl_->AddressReply(j["job"].get<std::string>());
  }
  if (path == "/v1/transform/locate") {
    if (method != "POST") return InvalidArgument(method + " is not allowed on " + path);
    return impl_->Locate(body);
  }
  if (path == "/v1/transform/prepare") {
    if (method != "POST") return InvalidArgument(method + " is not allowed on " + path);
    return impl_->Prepare(body, coordinator);
  }
  if (path == "/v1/transform/presize") {
    if (method != "POST") return InvalidArgument(method + " is not allowed on " + path);
    return impl_->Presize(body);
  }
  if (path == "/v1/transform/probe") {
    if (method != "POST") return InvalidArgument(method + " is not allowed on " + path);
    return impl_->Probe(body);
  }
  return NotFound("no endpoint " + method + " " + path + " (see docs/transform.md)");
}

}  // namespace tenplex::transform
