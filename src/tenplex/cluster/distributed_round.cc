#include "tenplex/cluster/distributed_round.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "tenplex/cluster/control_replies.h"
#include "tenplex/cluster/revocation.h"
#include "tenplex/cluster/served_warm.h"
#include "tenplex/cluster/two_phase.h"
#include "tenplex/util/log.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::cluster::coordinator {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<store::Client*> Raw(const std::vector<Host>& hosts) {
  std::vector<store::Client*> out;
  for (const Host& h : hosts) out.push_back(h.client.get());
  return out;
}

void MarkLost(Host& h) {
  h.client.reset();
  h.address.clear();
  h.local = {};
  h.incarnation.clear();
}

namespace {

// The bytes of the new version a host's prepare reply says it wrote (for the CLI's
// progress line; 0 for a malformed reply).
uint64_t PreparedBytes(const std::string& reply) {
  Result<PrepareReply> p = DecodePrepareReply(reply);
  if (!p.ok()) return 0;
  uint64_t n = 0;  // each below 2^62: no overflow
  for (int64_t b : {p->bytes_kept, p->bytes_linked, p->bytes_local, p->bytes_fetched})
    n += static_cast<uint64_t>(b);
  return n;
}

// Phase one on every participant, all at once, each on a connection of its own (a
// prepare may take long) while the coordinator watches them: a participant whose
// /v1/health does not answer for options.silent_s (stopped, hung, its machine gone)
// ends the phase at once as silent, and so does the overall prepare deadline. The
// threads of calls given up on are left to finish (or time out) on their own. The
// request is encoded once; each participant's body (its host and part) is made on its
// own thread.
struct PrepareWatch {
  std::mutex mu;
  std::condition_variable cv;
  std::size_t pending = 0;
  std::vector<std::optional<Result<std::string>>> replies;
  std::vector<std::chrono::steady_clock::time_point> last_seen;
  std::vector<bool> probing;
};

void PreparePhase(std::vector<Host>& hosts, const std::vector<int>& participants,
                  std::shared_ptr<const std::string> shared, const std::vector<HostPart>& parts,
                  const store::ClientOptions& client_options,
                  const ClusterTransformOptions& options, RoundResult& out,
                  std::vector<Result<std::string>>& replies) {
  using Clock = std::chrono::steady_clock;
  auto w = std::make_shared<PrepareWatch>();
  const std::size_t n = participants.size();
  w->pending = n;
  w->replies.resize(n);
  w->last_seen.assign(n, Clock::now());
  w->probing.assign(n, false);
  store::ClientOptions long_opts = client_options;
  long_opts.timeout_s = options.prepare_timeout_s;
  store::ClientOptions short_opts = client_options;
  short_opts.timeout_s = options.silent_s;
  for (std::size_t i = 0; i < n; ++i) {
    std::thread([w, i, shared, host = participants[i], part = parts[participants[i]],
                 url = hosts[participants[i]].url, long_opts] {
      Result<std::unique_ptr<store::Client>> c = store::Client::Connect(url, long_opts);
      Result<std::string> r = c.ok() ? (*c)->CallJson("POST", "/v1/transform/prepare",
                                                      PrepareForHost(*shared, host, part))
                                     : c.status();
      std::lock_guard<std::mutex> lock(w->mu);
      w->replies[i] = std::move(r);
      --w->pending;
      w->cv.notify_all();
    }).detach();
  }
  const auto t0 = Clock::now();
  std::vector<bool> reported(n, false);  // replies already added to the progress line
  auto report = [&] {                    // on this thread: the progress line may end with this call
    for (std::size_t i = 0; i < n; ++i) {
      if (reported[i] || !w->replies[i]) continue;
      reported[i] = true;
      if (w->replies[i]->ok()) ReportProgress(PreparedBytes(**w->replies[i]));
    }
  };
  std::unique_lock<std::mutex> lock(w->mu);
  while (w->pending > 0) {
    w->cv.wait_for(lock, std::chrono::milliseconds(500));
    report();
    if (w->pending == 0) break;
    const auto now = Clock::now();
    if (now - t0 > std::chrono::seconds(options.prepare_timeout_s)) {
      out.status =
          Unavailable("prepare did not finish within " + std::to_string(options.prepare_timeout_s) +
                      " s (--prepare-timeout)");
      break;
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (w->replies[i] || now - w->last_seen[i] <= std::chrono::seconds(options.silent_s))
        continue;
      out.silent.push_back(participants[i]);
    }
    if (!out.silent.empty()) break;
    for (std::size_t i = 0; i < n; ++i) {  // heartbeats of the participants still working
      if (w->replies[i] || w->probing[i]) continue;
      w->probing[i] = true;
      std::thread([w, i, url = hosts[participants[i]].url, short_opts] {
        const bool ok = store::Client::Connect(url, short_opts).ok();
        std::lock_guard<std::mutex> lock(w->mu);
        if (ok) w->last_seen[i] = Clock::now();
        w->probing[i] = false;
      }).detach();
    }
  }
  report();
  for (std::size_t i = 0; i < n; ++i) {
    if (w->replies[i]) replies[i] = *w->replies[i];
  }
  if (out.status.ok() && !out.silent.empty()) {
    std::string who;
    for (int h : out.silent) who += (who.empty() ? "" : ", ") + hosts[h].url;
    out.status =
        Unavailable("host(s) " + who + " did not answer for " + std::to_string(options.silent_s) +
                    " s during the prepare (stopped or hung): treated as lost");
  }
}

// Sends the hosts that only serve this round their warm (served_warm.h), with the
// prepares' body; `addresses` are the request's ("" for a lost host).
ServedWarming WarmServers(const std::vector<Host>& hosts, const std::vector<int>& participants,
                          const std::vector<std::string>& addresses,
                          std::shared_ptr<const std::string> shared,
                          const std::vector<HostPart>& parts,
                          const store::ClientOptions& client_options,
                          const ClusterTransformOptions& options) {
  std::vector<std::string> urls;
  for (const Host& h : hosts) urls.push_back(h.url);
  store::ClientOptions short_opts = client_options;
  short_opts.timeout_s = options.silent_s;
  return ServedWarming::Start(urls, addresses, participants, std::move(shared), parts, short_opts);
}

// The hosts with new ranks in r, in order.
std::vector<int> Participants(const Round& r) {
  std::vector<int> participants(r.to_hosts.begin(), r.to_hosts.end());
  std::sort(participants.begin(), participants.end());
  participants.erase(std::unique(participants.begin(), participants.end()), participants.end());
  return participants;
}

// The participants whose prepare may have left this coordinator's version behind: those
// that prepared, and those whose outcome is unknown (no reply, a lost reply). Not those
// whose agent answered with an error (see RunRound).
std::vector<int> MayHoldOurs(const std::vector<int>& participants,
                             const std::vector<Result<std::string>>& replies) {
  std::vector<int> out;
  for (std::size_t i = 0; i < participants.size(); ++i) {
    const StatusCode code = replies[i].ok() ? StatusCode::kOk : replies[i].status().code();
    if (code == StatusCode::kOk || code == StatusCode::kUnavailable) out.push_back(participants[i]);
  }
  return out;
}

// The prepare request of round r (its "host" is set per participant).
PrepareRequest RoundRequest(const std::vector<Host>& hosts, const std::string& job, const Round& r,
                            const ClusterTransformOptions& options) {
  PrepareRequest req;
  req.job = job;
  req.from_version = r.from_version;
  req.to_version = r.to_version;
  req.info = r.info.dump();
  req.to_config = r.to_config;
  req.new_info = r.new_info.dump();
  for (const Host& h : hosts) req.addresses.push_back(h.client ? h.address : "");
  if (options.local_peer_reads) {
    for (const Host& h : hosts) req.local_peers.push_back(h.client ? h.local : LocalPeer{});
  }
  req.from_hosts = r.from_hosts;
  req.to_hosts = r.to_hosts;
  for (const Host& h : hosts) req.incarnations.push_back(h.client ? h.incarnation : "");
  return req;
}

}  // namespace

// ClusterTransformOptions::presize_only: every participant of r makes its new tensors
// ahead in its page pool, all at once; the first failure is returned.
Status PresizeRound(const std::vector<Host>& hosts, const std::string& job, const Round& r,
                    const store::ClientOptions& client_options,
                    const ClusterTransformOptions& options, ClusterTransformStats& stats) {
  const std::vector<int> participants = Participants(r);
  const PrepareRequest req = RoundRequest(hosts, job, r, options);
  store::ClientOptions long_opts = client_options;
  long_opts.timeout_s = options.prepare_timeout_s;
  std::vector<Result<std::string>> replies(participants.size(), Unavailable("no reply"));
  const std::string shared = EncodeSharedPrepare(req);
  ForEachConcurrently(participants.size(), participants.size(), [&](std::size_t i) {
    Result<std::unique_ptr<store::Client>> c =
        store::Client::Connect(hosts[participants[i]].url, long_opts);
    replies[i] =
        c.ok() ? (*c)->CallJson("POST", "/v1/transform/presize",
                                PrepareForHost(shared, participants[i], r.parts[participants[i]]))
               : c.status();
  });
  for (std::size_t i = 0; i < participants.size(); ++i) {
    const std::string& url = hosts[participants[i]].url;
    if (!replies[i].ok()) return replies[i].status().WithContext("pre-sizing on " + url);
    Result<PresizeReply> p = DecodePresizeReply(*replies[i]);
    if (!p.ok()) return Internal(url + ": malformed presize reply: " + p.status().message());
    stats.presized.push_back(
        {url, p->wanted_bytes, p->poolable_bytes, p->pooled_bytes, p->seconds});
  }
  return Status::Ok();
}

// Phase one on every host with new ranks, then phase two (commit, or abort on all).
RoundResult RunRound(std::vector<Host>& hosts, const std::string& job, const Round& r,
                     const store::ClientOptions& client_options,
                     const ClusterTransformOptions& options) {
  RoundResult out;
  const std::vector<int> participants = Participants(r);
  const PrepareRequest req = RoundRequest(hosts, job, r, options);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Result<std::string>> replies(participants.size(),
                                           Unavailable("no reply (given up on)"));
  const auto shared = std::make_shared<const std::string>(EncodeSharedPrepare(req));
  ServedWarming warming =
      WarmServers(hosts, participants, req.addresses, shared, r.parts, client_options, options);
  PreparePhase(hosts, participants, shared, r.parts, client_options, options, out, replies);
  warming.Wait(std::chrono::seconds(1));  // long done: they are quick, the prepares read them
  out.prepare_seconds = Since(t0);
  for (std::size_t i = 0; i < participants.size(); ++i) {
    Host& h = hosts[participants[i]];
    if (!replies[i].ok()) {
      if (out.status.ok())
        out.status = replies[i].status().WithContext("host " + std::to_string(participants[i]) +
                                                     " (" + h.url + ")");
      continue;
    }
    Result<PrepareReply> p = DecodePrepareReply(*replies[i]);
    if (!p.ok()) {
      if (out.status.ok())
        out.status = Internal(h.url + ": malformed prepare reply: " + p.status().message());
      continue;
    }
    const int ranks =
        static_cast<int>(std::count(r.to_hosts.begin(), r.to_hosts.end(), participants[i]));
    out.hosts.push_back({h.url, ranks, *p});
    // Its incarnation of the job, which it may have just created: the next round (the
    // central strategy's) fetches from it.
    if (!p->incarnation.empty()) h.incarnation = p->incarnation;
  }
  for (int h : out.silent) MarkLost(hosts[h]);  // not asked again in this transform
  const auto t1 = std::chrono::steady_clock::now();
  if (!out.status.ok()) {
    // Not every participant prepared: the decision is abort (the first one first), on the
    // participants that may hold this coordinator's version: not on those whose agent
    // answered with an error, since an agent drops its own version on every failure after
    // its begin, and a failed begin means the version there is another coordinator's
    // (a racing one that picked the same number: aborting it would split that job).
    Status a = AbortEverywhere(Raw(hosts), MayHoldOurs(participants, replies), job, r.to_version);
    if (a.code() != StatusCode::kFailedPrecondition) {
      // Over: every host of the transform refuses its capabilities (revocation.h).
      CloseTransform(Raw(hosts), HostsExcept(hosts.size(), {}), job, r.to_version);
      return out;
    }
    // A reader rolled it forward meanwhile (every participant had prepared after all).
    out.status = Status::Ok();
  }
  // Every participant prepared: the decision is commit; old versions stay until every
  // participant confirmed (round two releases them).
  Result<CommitOutcome> c = CommitEverywhere(Raw(hosts), participants, job, r.to_version);
  out.commit_seconds = Since(t1);
  // Over: the hosts that did not confirm W (those without ranks of W above all) close it.
  CloseTransform(Raw(hosts), HostsExcept(hosts.size(), c.ok() ? c->confirmed : std::vector<int>{}),
                 job, r.to_version);
  if (!c.ok()) {
    out.status = c.status();
    return out;
  }
  for (int h : c->unconfirmed) out.unconfirmed.push_back(hosts[h].url);
  return out;
}

}  // namespace tenplex::cluster::coordinator
