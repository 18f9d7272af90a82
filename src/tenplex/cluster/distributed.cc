#include "tenplex/cluster/distributed.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "tenplex/cluster/cluster_state.h"
#include "tenplex/cluster/control_protocol.h"
#include "tenplex/cluster/control_replies.h"
#include "tenplex/cluster/distributed_round.h"
#include "tenplex/cluster/job_lease.h"
#include "tenplex/cluster/revocation.h"
#include "tenplex/cluster/two_phase.h"
#include "tenplex/io/state_info.h"
#include "tenplex/model/model.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/store/parse.h"
#include "tenplex/util/format.h"
#include "tenplex/util/log.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::cluster {

using coordinator::Host;
using coordinator::MarkLost;
using coordinator::Raw;
using coordinator::Round;
using coordinator::RoundResult;
using coordinator::Since;
using nlohmann::json;

namespace {

void Log(const ClusterTransformOptions& o, const std::string& line) {
  if (o.log) o.log(line);
}

// The info of a new version: the old one's with the new config and placement.
json NewInfo(const StateInfo& old, const ParallelConfig& config, const Cluster& placement) {
  StateInfo info = old;
  info.set_config(config);
  info.set_placement(placement);
  return json::parse(info.ToJson());
}

// Every host of either cluster, old ones first; index: URL -> position in hosts; the
// job's lease on them (job_lease.h: one coordinator of the job at a time; none for a
// pre-size or a caller that holds it).
struct HostSet {
  std::vector<Host> hosts;
  std::map<std::string, int> index;
  std::unique_ptr<JobLease> lease;
};

// The arguments TransformCluster refuses before it connects to anything.
Status CheckTransformArgs(const std::string& job, const ClusterTransformOptions& options) {
  TP_RETURN_IF_ERROR(store::CheckJobName(job));
  if (options.max_attempts < 1) return InvalidArgument("max_attempts must be at least 1");
  if (options.control_timeout_s < 1 || options.silent_s < 1 || options.prepare_timeout_s < 1)
    return InvalidArgument("transform timeouts must be at least 1 s");
  return Status::Ok();
}

// Connects to every host of either cluster with the control options (ConnectCluster: a
// host that is unavailable stays unconnected (lost); any other error, e.g. a wrong token,
// is returned; one daemon under two URLs is refused), then takes the job's lease.
Result<HostSet> ConnectHosts(const Cluster& from, const Cluster& target,
                             const store::ClientOptions& control, const std::string& job,
                             const ClusterTransformOptions& options) {
  HostSet s;
  Cluster all;
  for (const std::vector<std::string>* list : {&from.hosts, &target.hosts}) {
    for (const std::string& url : *list) {
      if (s.index.count(url)) continue;
      s.index[url] = static_cast<int>(all.hosts.size());
      all.hosts.push_back(url);
    }
  }
  TP_ASSIGN_OR_RETURN(auto clients, ConnectCluster(all, control, /*allow_lost=*/true));
  for (std::size_t h = 0; h < all.hosts.size(); ++h)
    s.hosts.push_back({all.hosts[h], std::move(clients[h]), "", {}, ""});
  if (!options.presize_only && !options.lease_held) {
    TP_ASSIGN_OR_RETURN(s.lease, JobLease::Acquire(Raw(s.hosts), job, control,
                                                   {store::kDefaultLeaseMs, options.lease_wait_s}));
  }
  return s;
}

// Steps 0 and 1 of an attempt: finishes or rolls back what an earlier transform left half
// done (two_phase.h), then finds the newest current version any host reports and who
// holds it, and (next_version) one past every version number any host reports. One
// listing of the job from every host serves all three (read again only when the
// recovery changed something: job_listing.h). Hosts that do not answer are marked lost
// and listed in stats.lost_hosts.
Result<CommittedState> RecoverAndFindState(std::vector<Host>& hosts, const std::string& job,
                                           const Cluster& from,
                                           const ClusterTransformOptions& options,
                                           ClusterTransformStats& stats, uint64_t& next_version) {
  std::vector<std::string> urls;
  for (const Host& h : hosts) urls.push_back(h.url);
  const std::vector<store::Client*> live_clients = Raw(hosts);
  JobListing listing = ReadJobListing(live_clients, job);
  // A pre-size runs while the job trains and commits: its versions in flight are not ours.
  if (!options.presize_only) {
    TP_ASSIGN_OR_RETURN(Resolution res,
                        ResolvePending(urls, live_clients, job, /*owner=*/true, listing));
    for (const std::string& line : res.lines) {
      Log(options, "recovery: " + line);
      stats.recovered.push_back(line);
    }
    if (res.changed) listing = ReadJobListing(live_clients, job);
  }
  TP_ASSIGN_OR_RETURN(CommittedState cs,
                      FindCommittedState(urls, live_clients, job, from, listing));
  next_version = listing.NextVersion();
  stats.lost_hosts.clear();
  for (int h : cs.unavailable) {
    MarkLost(hosts[h]);
    stats.lost_hosts.push_back(hosts[h].url);
  }
  return cs;
}

// Step 2, the new placement: the live hosts of the target cluster get K ranks each, in
// order (to_hosts: new rank -> host index; live: every live target host). Returns the
// URLs of the hosts that get ranks (a prefix of the live ones): the new version's cluster.
Result<std::vector<std::string>> PlaceRanks(const HostSet& hs, const Cluster& target,
                                            const ParallelConfig& to, int world_size,
                                            std::size_t lost_hosts, std::vector<int>& to_hosts,
                                            std::vector<int>& live) {
  std::vector<std::string> live_urls;
  for (const std::string& u : target.hosts) {
    const int h = hs.index.at(u);
    if (hs.hosts[h].client) {
      live.push_back(h);
      live_urls.push_back(u);
    }
  }
  const int k = target.gpus_per_host;
  if (world_size > static_cast<int>(live.size()) * k) {
    return FailedPrecondition(
        "config " + to.ToString() + " has " + std::to_string(world_size) +
        " ranks but the live hosts of the target cluster have " + std::to_string(live.size()) +
        " x " + std::to_string(k) + " slots" +
        (lost_hosts == 0 ? "" : " (lost: " + std::to_string(lost_hosts) + " hosts)"));
  }
  to_hosts.resize(world_size);
  for (int r = 0; r < world_size; ++r) to_hosts[r] = live[r / k];
  live_urls.resize(static_cast<std::size_t>((world_size + k - 1) / k));
  return live_urls;
}

// Steps 2 and 3 of an attempt: the round from the committed state cs to config `to`,
// placed on the live target hosts (live: every one of them) and planned (the agents
// compute the same plan): fails here if state is lost. Fills stats' placement and plan.
Result<Round> PlanRound(const HostSet& hs, const Cluster& target, const ParallelConfig& to,
                        const CommittedState& cs, const Layout& from_layout,
                        const Layout& to_layout, std::vector<int>& live,
                        ClusterTransformStats& stats) {
  Round round;
  round.from_version = cs.version;
  round.info = cs.info.AsJson();
  round.to_config = to;
  round.from_hosts = cs.rank_hosts;
  TP_ASSIGN_OR_RETURN(stats.new_hosts, PlaceRanks(hs, target, to, to_layout.world_size(),
                                                  stats.lost_hosts.size(), round.to_hosts, live));
  std::vector<store::Client*> new_clients;  // their host ids go into the placement
  for (const std::string& u : stats.new_hosts)
    new_clients.push_back(hs.hosts[hs.index.at(u)].client.get());
  round.new_info = NewInfo(
      cs.info, to, WithHostIds(Cluster{stats.new_hosts, target.gpus_per_host}, new_clients));
  const auto t_plan = std::chrono::steady_clock::now();
  TP_ASSIGN_OR_RETURN(plan::Plan p, plan::MakePlan(cs.info.model(), from_layout, to_layout,
                                                   round.from_hosts, round.to_hosts));
  stats.plan = p.stats;
  round.parts = HostPlanParts(p, round.from_hosts, round.to_hosts, hs.hosts.size());
  stats.plan_seconds = Since(t_plan);
  return round;
}

// Asks every live host for its data-plane address and its store's incarnation of job
// (the capabilities of fetches from it name it), all at once. A failed call goes to
// call_status (the attempt fails and may be retried without that host); a malformed reply
// is returned (an error of the whole transform). The first of each in host order counts.
Status FetchAddresses(std::vector<Host>& hosts, const std::string& job, Status& call_status) {
  std::vector<Status> failed(hosts.size()), malformed(hosts.size());
  ForEachConcurrently(hosts.size(), kControlConcurrency, [&](std::size_t i) {
    Host& h = hosts[i];
    if (!h.client) return;
    Result<std::string> a =
        h.client->CallJson("POST", "/v1/transform/address", json{{"job", job}}.dump());
    if (!a.ok()) {
      failed[i] = a.status().WithContext(h.url);
      return;
    }
    Result<AddressReply> ar = DecodeAddressReply(*a);
    if (!ar.ok()) {
      malformed[i] = Internal(
          h.url + ": malformed reply to GET /v1/transform/address: " + ar.status().message());
      return;
    }
    h.address = ar->address;
    h.incarnation = ar->incarnation;
    // Its offer of same-host reads: the agents decide whether they can take it.
    h.local = {};
    if (ar->local && !ar->local->host_id.empty() && !ar->local->shm_dir.empty() &&
        !ar->local->store_id.empty())
      h.local = {h.url, ar->local->host_id, ar->local->shm_dir, ar->local->store_id};
  });
  for (const Status& m : malformed) TP_RETURN_IF_ERROR(m);
  for (const Status& f : failed) {
    if (!f.ok()) {
      call_status = f;
      break;
    }
  }
  return Status::Ok();
}

// The central strategy (options.central): gather the state on host `center` (the first
// live target host), re-slice it there, scatter it: three rounds from round.to_version
// on, each planned and digested like a direct one. On success round.to_version becomes
// the scatter's; round_seconds gets each round's time.
Result<RoundResult> RunCentral(std::vector<Host>& hosts, const std::string& job, Round& round,
                               const CommittedState& cs, const Layout& from_layout,
                               const Layout& to_layout, const ParallelConfig& to, int center,
                               const store::ClientOptions& client_options,
                               const ClusterTransformOptions& options,
                               std::vector<double>& round_seconds) {
  const int c = center;
  const Model& model = cs.info.model();
  const ParallelConfig& from_config = cs.info.config();
  Round gather = round, reslice = round, scatter = round;
  gather.to_config = from_config;
  gather.to_hosts.assign(from_layout.world_size(), c);
  const std::vector<store::Client*> center_client = {hosts[c].client.get()};
  gather.new_info =
      NewInfo(cs.info, from_config,
              WithHostIds(Cluster{{hosts[c].url}, from_layout.world_size()}, center_client));
  reslice.from_version = gather.to_version;
  reslice.to_version = gather.to_version + 1;
  reslice.info = gather.new_info;
  reslice.from_hosts.assign(from_layout.world_size(), c);
  reslice.to_hosts.assign(to_layout.world_size(), c);
  reslice.new_info = NewInfo(
      cs.info, to, WithHostIds(Cluster{{hosts[c].url}, to_layout.world_size()}, center_client));
  scatter.from_version = reslice.to_version;
  scatter.to_version = reslice.to_version + 1;
  scatter.info = reslice.new_info;
  scatter.from_hosts.assign(to_layout.world_size(), c);
  for (Round* step : {&gather, &reslice, &scatter}) {
    const Layout& a = step == &gather ? from_layout : (step == &reslice ? from_layout : to_layout);
    const Layout& b = step == &gather ? from_layout : to_layout;
    TP_ASSIGN_OR_RETURN(plan::Plan sp,
                        plan::MakePlan(model, a, b, step->from_hosts, step->to_hosts));
    step->parts = HostPlanParts(sp, step->from_hosts, step->to_hosts, hosts.size());
  }
  RoundResult rr;
  round_seconds.clear();
  for (Round* step : {&gather, &reslice, &scatter}) {
    Log(options, "central: version " + std::to_string(step->from_version) + " -> " +
                     std::to_string(step->to_version));
    RoundResult part = RunRound(hosts, job, *step, client_options, options);
    round_seconds.push_back(part.prepare_seconds + part.commit_seconds);
    rr.prepare_seconds += part.prepare_seconds;
    rr.commit_seconds += part.commit_seconds;
    rr.hosts = std::move(part.hosts);
    rr.status = part.status;
    rr.silent = part.silent;
    rr.unconfirmed = part.unconfirmed;
    if (!rr.status.ok()) break;
  }
  if (rr.status.ok()) round.to_version = scatter.to_version;
  return rr;
}

// After a failed round: the silent participants (already marked lost by the round) and
// every host that does not answer /v1/health now are lost. Returns how many that are.
// A round committed: its version and the hosts that did not confirm (logged) in stats.
void Committed(const RoundResult& rr, uint64_t version, const ClusterTransformOptions& options,
               ClusterTransformStats& stats) {
  stats.unconfirmed_hosts = rr.unconfirmed;
  for (const std::string& u : rr.unconfirmed) {
    Log(options, "host " + u +
                     " did not confirm its commit (the decision is commit: its prepared "
                     "version is committed when it answers again)");
  }
  stats.to_version = version;
}

// The version an attempt begins: one past every version listed, and never the number
// of an earlier attempt (next_version: a host given up on as silent may still prepare
// that one when it continues); a central transform uses three.
uint64_t AttemptVersion(uint64_t listed_next, uint64_t& next_version, bool central) {
  const uint64_t v = std::max(listed_next, next_version);
  next_version = v + (central ? 3 : 1);
  return v;
}

int DropUnanswering(std::vector<Host>& hosts, const std::vector<int>& silent,
                    const ClusterTransformOptions& options) {
  int newly_lost = static_cast<int>(silent.size());
  for (int h : silent) Log(options, "host " + hosts[h].url + " is silent: treating it as lost");
  for (Host& h : hosts) {
    if (!h.client) continue;
    if (!h.client->CallJson("GET", "/v1/health").ok()) {
      Log(options, "host " + h.url + " does not answer: treating it as lost");
      MarkLost(h);
      ++newly_lost;
    }
  }
  return newly_lost;
}

}  // namespace

Result<ClusterTransformStats> TransformCluster(const Cluster& from, const std::string& job,
                                               const ParallelConfig& to,
                                               const store::ClientOptions& given_options,
                                               const ClusterTransformOptions& options) {
  const auto t_start = std::chrono::steady_clock::now();
  TP_RETURN_IF_ERROR(CheckTransformArgs(job, options));
  store::ClientOptions client_options = given_options;  // named: every request is fenced
  if (client_options.coordinator.empty() && !options.presize_only)
    client_options.coordinator = NewCoordinator("tenplex-transform");
  const Cluster& target = options.to ? *options.to : from;
  // Every control request (state, addresses, commit, abort, health) is bounded by the
  // control timeout; only the prepare itself waits longer (PreparePhase).
  store::ClientOptions control = client_options;
  control.timeout_s = options.control_timeout_s;
  TP_ASSIGN_OR_RETURN(HostSet hs, ConnectHosts(from, target, control, job, options));
  std::vector<Host>& hosts = hs.hosts;
  ClusterTransformStats stats;
  stats.to_config = to.ToString();
  for (const Host& h : hosts) stats.all_hosts.push_back(h.url);
  uint64_t next_version = 0;  // above every number an earlier attempt used
  for (int attempt = 1; attempt <= options.max_attempts; ++attempt) {
    stats.attempts = attempt;
    if (hs.lease) TP_RETURN_IF_ERROR(hs.lease->Held());  // another coordinator took over
    uint64_t listed_next = 0;
    TP_ASSIGN_OR_RETURN(CommittedState cs,
                        RecoverAndFindState(hosts, job, from, options, stats, listed_next));
    const uint64_t version = cs.version;
    const Model& model = cs.info.model();
    const ParallelConfig& from_config = cs.info.config();
    TP_ASSIGN_OR_RETURN(Layout from_layout, MakeLayout(model, from_config));
    TP_ASSIGN_OR_RETURN(Layout to_layout, MakeLayout(model, to));
    stats.from_version = version;
    stats.from_config = from_config.ToString();
    std::vector<int> live;
    TP_ASSIGN_OR_RETURN(Round round,
                        PlanRound(hs, target, to, cs, from_layout, to_layout, live, stats));
    round.to_version = AttemptVersion(listed_next, next_version, options.central);
    Status addr_status;
    TP_RETURN_IF_ERROR(FetchAddresses(hosts, job, addr_status));
    if (options.presize_only) {
      TP_RETURN_IF_ERROR(addr_status);
      TP_RETURN_IF_ERROR(PresizeRound(hosts, job, round, client_options, options, stats));
      stats.seconds = Since(t_start);
      return stats;
    }
    RoundResult rr;
    if (!addr_status.ok()) {
      rr.status = addr_status;
    } else if (!options.central) {
      Log(options, "attempt " + std::to_string(attempt) + ": version " + std::to_string(version) +
                       " (" + stats.from_config + ") -> " + std::to_string(round.to_version) +
                       " (" + stats.to_config + ") on " + std::to_string(live.size()) + " hosts");
      rr = RunRound(hosts, job, round, client_options, options);
      stats.round_seconds = {rr.prepare_seconds + rr.commit_seconds};
    } else {
      TP_ASSIGN_OR_RETURN(rr, RunCentral(hosts, job, round, cs, from_layout, to_layout, to, live[0],
                                         client_options, options, stats.round_seconds));
    }
    stats.prepare_seconds = rr.prepare_seconds;
    stats.commit_seconds = rr.commit_seconds;
    stats.hosts = std::move(rr.hosts);
    if (rr.status.ok()) {
      Committed(rr, round.to_version, options, stats);
      stats.seconds = Since(t_start);
      return stats;
    }
    if (rr.status.code() == StatusCode::kDataLoss || options.central) return rr.status;
    // Which hosts are gone? Retry without them; if none is, the error stands.
    const int newly_lost = DropUnanswering(hosts, rr.silent, options);
    if (newly_lost == 0) return rr.status;
    if (attempt == options.max_attempts) {
      return rr.status.WithContext("gave up after " + std::to_string(attempt) + " attempts");
    }
    Log(options, "attempt " + std::to_string(attempt) + " failed (" + rr.status.ToString() +
                     "); re-planning");
  }
  return Internal("unreachable");
}

std::string ClusterTransformSummary(const ClusterTransformStats& s) {
  int64_t kept = 0, linked = 0, local = 0, fetched = 0, busiest = 0;
  for (const HostTransformReport& h : s.hosts) {
    const PrepareReply& p = h.prepare;
    kept += p.bytes_kept;
    linked += p.bytes_linked;
    local += p.bytes_local;
    fetched += p.bytes_fetched;
    busiest = std::max(busiest, p.bytes_fetched);
  }
  const double total = static_cast<double>(kept + linked + local + fetched);
  char buf[512];
  std::snprintf(
      buf, sizeof(buf),
      "job version %llu (%s) -> %llu (%s) on %zu hosts in %.2f s (prepare %.2f s, commit %.3f s, "
      "attempts %d): linked %s, kept %s, local %s, cross-host %s (busiest host %s), %.2f GB/s",
      static_cast<unsigned long long>(s.from_version), s.from_config.c_str(),
      static_cast<unsigned long long>(s.to_version), s.to_config.c_str(), s.new_hosts.size(),
      s.seconds, s.prepare_seconds, s.commit_seconds, s.attempts, HumanBytes(linked).c_str(),
      HumanBytes(kept).c_str(), HumanBytes(local).c_str(), HumanBytes(fetched).c_str(),
      HumanBytes(busiest).c_str(), s.seconds > 0 ? total / s.seconds / 1e9 : 0.0);
  std::string out = buf;
  if (!s.lost_hosts.empty()) {
    out += "; lost hosts:";
    for (const std::string& u : s.lost_hosts) out += " " + u;
  }
  return out;
}

}  // namespace tenplex::cluster
