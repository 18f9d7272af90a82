#include "tenplex/cluster/two_phase.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <string_view>

#include "tenplex/cluster/cluster.h"
#include "tenplex/cluster/revocation.h"
#include "tenplex/io/state_info.h"
#include "tenplex/util/log.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::cluster {

namespace {

enum class Has { kNone, kOpen, kPrepared, kCommitted };

// Round two on these hosts, all at once: their old versions released (best effort).
void ReleaseOn(const std::vector<store::Client*>& clients, const std::vector<int>& hosts,
               const std::string& job) {
  ForEachConcurrently(hosts.size(), kControlConcurrency, [&](std::size_t i) {
    (void)clients[hosts[i]]->CallJson("POST", "/v1/jobs/" + job + "/release");
  });
}

// Commits v on one host; a lost reply is confirmed by asking for the version's state.
// Ok: committed there. Unavailable: unreachable. Other errors: refused.
Status CommitOne(store::Client* c, const std::string& job, uint64_t v) {
  if (c == nullptr) return Unavailable("host is lost");
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    last = c->Commit(job, v, /*keep_old=*/true);
    if (last.ok()) return last;
    Result<store::VersionInfo> vi = c->Version(job, v);
    if (vi.ok() && vi->committed) return Status::Ok();  // only the reply was lost
    if (!vi.ok() && vi.status().code() == StatusCode::kNotFound) {
      return DataLoss("version " + std::to_string(v) + " of job " + job + " is gone from " +
                      c->url() + " (aborted?): " + last.ToString());
    }
    if (!vi.ok() && vi.status().code() == StatusCode::kUnavailable) return vi.status();
    if (last.code() != StatusCode::kUnavailable && last.code() != StatusCode::kInternal) {
      return last;  // refused (e.g. a newer version is current there)
    }
  }
  return last;
}

// TENPLEX_FAULT_COMMIT (two_phase.h): whether the last participant's commit is refused.
bool CommitFaultOnLast() {
  const char* f = std::getenv(kCommitFaultEnv);
  return f != nullptr && std::string_view(f) == "last";
}

std::vector<int> Sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// A host's place in the commit order: its stable id, or its URL for a daemon without
// one; a lost host (null client) last.
std::string OrderKey(const store::Client* c) {
  if (c == nullptr) return "\x7f";
  return c->host_id().empty() ? c->url() : c->host_id();
}

// The hosts in commit order (two_phase.h): the same for every coordinator and resolver
// whatever order their host lists are in.
std::vector<int> InCommitOrder(const std::vector<store::Client*>& clients, std::vector<int> hosts) {
  hosts = Sorted(std::move(hosts));
  std::stable_sort(hosts.begin(), hosts.end(),
                   [&](int a, int b) { return OrderKey(clients[a]) < OrderKey(clients[b]); });
  return hosts;
}

}  // namespace

Result<CommitOutcome> CommitEverywhere(const std::vector<store::Client*>& clients,
                                       std::vector<int> participants, const std::string& job,
                                       uint64_t version, bool release) {
  participants = InCommitOrder(clients, std::move(participants));
  CommitOutcome out;
  std::vector<Status> st(participants.size());
  // The first participant alone first: its state is the decision record. Refused there
  // (v is gone: a resolver decided abort) means the decision is abort: no other host
  // may commit it. Unreachable there, the decision (commit) stands.
  if (!participants.empty()) st[0] = CommitOne(clients[participants[0]], job, version);
  if (!participants.empty() && !st[0].ok() && st[0].code() != StatusCode::kUnavailable) {
    return DataLoss("version " + std::to_string(version) + " of job " + job +
                    " was prepared on every host but its first host (" +
                    clients[participants[0]]->url() +
                    ") refused the commit, so no host commits it: " + st[0].ToString());
  }
  if (participants.size() > 1) {
    const bool fault = CommitFaultOnLast();
    ForEachConcurrently(participants.size() - 1, kControlConcurrency, [&](std::size_t k) {
      if (fault && k + 2 == participants.size()) {
        st[k + 1] = FailedPrecondition(std::string("commit refused by fault injection (") +
                                       kCommitFaultEnv + "=last)");
        return;
      }
      st[k + 1] = CommitOne(clients[participants[k + 1]], job, version);
    });
  }
  for (std::size_t i = 0; i < participants.size(); ++i) {
    if (st[i].ok()) {
      out.confirmed.push_back(participants[i]);
    } else if (st[i].code() == StatusCode::kUnavailable) {
      out.unconfirmed.push_back(participants[i]);
    } else {
      return DataLoss("version " + std::to_string(version) + " of job " + job +
                      " was prepared on every host but its commit failed on host " +
                      std::to_string(participants[i]) + ": " + st[i].ToString());
    }
  }
  if (release && out.unconfirmed.empty()) {  // round two: every participant committed
    ReleaseOn(clients, participants, job);
    out.released = true;
  }
  return out;
}

Result<CommitOutcome> PrepareAndCommit(const std::vector<store::Client*>& clients,
                                       std::vector<int> participants, const std::string& job,
                                       uint64_t version, bool release) {
  participants = Sorted(std::move(participants));
  std::vector<Status> st(participants.size());
  ForEachConcurrently(participants.size(), kControlConcurrency, [&](std::size_t i) {
    store::Client* c = clients[participants[i]];
    st[i] = c == nullptr ? Unavailable("host " + std::to_string(participants[i]) + " is lost")
                         : c->Prepare(job, version).WithContext("preparing on " + c->url());
  });
  auto failed = std::find_if(st.begin(), st.end(), [](const Status& s) { return !s.ok(); });
  if (failed != st.end()) {
    // Decision: abort. Refused (FailedPrecondition) only when the first host committed v.
    Status a = AbortEverywhere(clients, participants, job, version);
    if (a.ok()) return *failed;
    if (a.code() != StatusCode::kFailedPrecondition) {
      return Status(failed->code(), failed->message() + " (aborting it: " + a.ToString() + ")");
    }
    LogInfo("version %llu of job %s: %s", static_cast<unsigned long long>(version), job.c_str(),
            a.message().c_str());
  }
  return CommitEverywhere(clients, participants, job, version, release);
}

Status AbortEverywhere(const std::vector<store::Client*>& clients, std::vector<int> hosts,
                       const std::string& job, uint64_t version) {
  hosts = InCommitOrder(clients, std::move(hosts));
  // One after the other until a host has aborted it (or never had it): that first one's
  // state is the decision record; the rest then all at once.
  std::size_t i = 0;
  for (; i < hosts.size(); ++i) {
    store::Client* c = clients[hosts[i]];
    if (c == nullptr) continue;
    Status s = c->Abort(job, version);
    if (!s.ok() && s.code() == StatusCode::kFailedPrecondition) {
      Result<store::VersionInfo> vi = c->Version(job, version);
      if (vi.ok() && vi->committed) {
        return FailedPrecondition("version " + std::to_string(version) + " of job " + job +
                                  " is already committed on " + c->url() + ": roll forward");
      }
    }
    if (s.ok() || s.code() == StatusCode::kNotFound) break;
  }
  if (i + 1 < hosts.size()) {
    ForEachConcurrently(hosts.size() - i - 1, kControlConcurrency, [&](std::size_t k) {
      store::Client* c = clients[hosts[i + 1 + k]];
      if (c != nullptr) (void)c->Abort(job, version);
    });
  }
  return Status::Ok();
}

namespace {

// One ResolvePending call: what every host reports of the job (Gather), then the decision
// for each version found by the rule of two_phase.h (Decide), then round two for versions
// committed everywhere whose old versions are still kept (ReleaseOlder).
class Resolver {
 public:
  Resolver(const std::vector<std::string>& urls, const std::vector<store::Client*>& clients,
           const std::string& job, bool owner, const JobListing& listing)
      : urls_(urls),
        clients_(clients),
        job_(job),
        listing_(listing),
        matcher_(urls, clients),
        owner_(owner),
        n_(static_cast<int>(clients.size())),
        answered_(n_, false),
        current_(n_) {}

  Result<Resolution> Run() {
    if (listing_.hosts.size() != clients_.size() || urls_.size() != clients_.size())
      return InvalidArgument("ResolvePending: urls, clients and the listing differ in size");
    TP_RETURN_IF_ERROR(Gather());
    for (auto& [v, row] : has_) TP_RETURN_IF_ERROR(Decide(v, row));
    ReleaseOlder();
    return out_;
  }

 private:
  // What every live host reported of the job's versions (the listing); a host without
  // the job answered.
  Status Gather() {
    for (int h = 0; h < n_; ++h) {
      if (clients_[h] == nullptr) continue;
      const HostListing& j = listing_.hosts[h];
      if (!j.status.ok()) {
        if (j.status.code() == StatusCode::kNotFound) answered_[h] = true;
        if (j.status.code() != StatusCode::kNotFound &&
            j.status.code() != StatusCode::kUnavailable) {
          return j.status;
        }
        continue;
      }
      answered_[h] = true;
      current_[h] = j.current;
      for (const ListedVersion& v : j.versions) Record(h, j.current, v);
    }
    return Status::Ok();
  }

  void Record(int h, std::optional<uint64_t> current, const ListedVersion& v) {
    auto& row = has_[v.version];
    row.resize(n_, Has::kNone);
    row[h] = v.committed ? Has::kCommitted : (v.prepared ? Has::kPrepared : Has::kOpen);
    auto& irow = infos_[v.version];
    irow.resize(n_, -1);
    irow[h] = v.info;
    // The reference copy: a committed one if any, else the first prepared one.
    if (v.committed || (v.prepared && !info_.count(v.version))) info_[v.version] = v.info;
    if (v.committed && current && v.version < *current) older_[*current].push_back(h);
  }

  // The reference info text of v.
  const std::string& InfoOf(uint64_t v) { return listing_.infos[info_[v]]; }

  // The hosts holding v prepared or committed (and open, with open_too).
  std::vector<int> Holders(uint64_t v, bool open_too) {
    std::vector<int> out;
    for (int h = 0; h < n_; ++h) {
      const Has x = has_[v][h];
      if (x == Has::kPrepared || x == Has::kCommitted || (open_too && x == Has::kOpen))
        out.push_back(h);
    }
    return out;
  }

  // The participants of v: the hosts of its info's "cluster" that get ranks (-1: not
  // one of ours).
  std::vector<int> ParticipantsOf(uint64_t v) {
    Result<StateInfo> si = StateInfo::Parse(InfoOf(v));
    if (!si.ok() || !si->placement()) return Holders(v, false);
    const Cluster& placement = *si->placement();
    const int k = std::max(1, placement.gpus_per_host);
    const std::size_t used = std::min(
        placement.hosts.size(), static_cast<std::size_t>((si->config().world_size() + k - 1) / k));
    std::vector<int> out;
    for (std::size_t i = 0; i < used; ++i) out.push_back(matcher_.Match(placement, i));
    return out;
  }

  // The first participant of v in commit order (the decision record): the host of its
  // placement with the lowest id (URL where none is recorded), matched to ours; -1 when
  // it is not one of ours or the placement is unknown.
  int FirstParticipant(uint64_t v) {
    Result<StateInfo> si = StateInfo::Parse(InfoOf(v));
    if (!si.ok() || !si->placement()) return -1;
    const Cluster& placement = *si->placement();
    const int k = std::max(1, placement.gpus_per_host);
    const std::size_t used = std::min(
        placement.hosts.size(), static_cast<std::size_t>((si->config().world_size() + k - 1) / k));
    // A slot's place in commit order (OrderKey): its recorded id, else its daemon's;
    // unknown for a silent daemon without a recorded id (then so is the first).
    std::optional<std::size_t> first;
    std::string first_key;
    for (std::size_t i = 0; i < used; ++i) {
      std::string key = placement.HostId(i);
      if (key.empty()) {
        const int h = matcher_.Match(placement, i);
        if (h < 0 || clients_[h] == nullptr || !answered_[h]) return -1;
        key = OrderKey(clients_[h]);
      }
      if (!first || key < first_key) {
        first = i;
        first_key = key;
      }
    }
    return first ? matcher_.Match(placement, *first) : -1;
  }

  // A copy whose info differs from the reference one is another version that got the
  // same number (a stale prepare of a host given up on): it can never be committed.
  void RemoveStrays(uint64_t v, std::vector<Has>& row) {
    std::vector<int> strays;
    for (int h = 0; h < n_ && info_.count(v); ++h) {
      if (row[h] == Has::kNone || row[h] == Has::kCommitted || infos_[v][h] == info_[v]) continue;
      strays.push_back(h);
      row[h] = Has::kNone;
    }
    if (strays.empty()) return;
    out_.changed = true;
    for (int h : strays) (void)clients_[h]->Abort(job_, v);
    out_.lines.push_back("version " + std::to_string(v) + " of job " + job_ + ": removed " +
                         std::to_string(strays.size()) +
                         " stray copies with another info (a stale prepare)");
  }

  // A copy of v that is open or prepared on a host whose current version is newer can
  // never be committed there (Commit refuses versions not newer than the current one):
  // a coordinator that lost a race (or a build without fencing) left it. Aborted there.
  void RemoveStale(uint64_t v, std::vector<Has>& row) {
    std::vector<int> stale;
    for (int h = 0; h < n_; ++h) {
      if ((row[h] == Has::kOpen || row[h] == Has::kPrepared) && current_[h] && v < *current_[h])
        stale.push_back(h);
    }
    for (int h : stale) {
      const bool prepared = row[h] == Has::kPrepared;
      Status s = clients_[h]->Abort(job_, v);
      out_.changed = true;
      if (!s.ok() && s.code() != StatusCode::kNotFound) continue;  // left as it is: undecided
      row[h] = Has::kNone;
      const std::string line =
          "version " + std::to_string(v) + " of job " + job_ + " on " + urls_[h] + ": " +
          (prepared ? "prepared" : "open") + " but older than the current version " +
          std::to_string(*current_[h]) + " there, so it can never be committed: aborted";
      LogInfo("recovery: %s", line.c_str());
      out_.lines.push_back(line);
    }
    const bool left = std::count(row.begin(), row.end(), Has::kNone) < n_;
    if (!stale.empty() && !left) out_.aborted.push_back(v);
  }

  Status Decide(uint64_t v, std::vector<Has>& row) {
    RemoveStale(v, row);
    RemoveStrays(v, row);
    const bool prepared_any = std::count(row.begin(), row.end(), Has::kPrepared) > 0;
    const bool open_any = std::count(row.begin(), row.end(), Has::kOpen) > 0;
    const bool committed_any = std::count(row.begin(), row.end(), Has::kCommitted) > 0;
    const std::string name = "version " + std::to_string(v) + " of job " + job_;
    if (!prepared_any) {
      if (open_any && !committed_any && owner_) {
        out_.changed = true;
        TP_RETURN_IF_ERROR(AbortEverywhere(clients_, Holders(v, true), job_, v));
        out_.aborted.push_back(v);
        out_.lines.push_back(name + ": open leftover of a coordinator that is gone: removed");
      }
      return Status::Ok();
    }
    const std::vector<int> parts = ParticipantsOf(v);
    bool all_prepared = !parts.empty();
    bool any_missing = false;  // a live participant answered without v
    for (int p : parts) {
      if (p < 0 || !answered_[p]) {
        all_prepared = false;
        continue;
      }
      if (row[p] != Has::kPrepared && row[p] != Has::kCommitted) {
        all_prepared = false;
        any_missing = true;
      }
    }
    bool forward = committed_any || all_prepared;
    // A participant is silent, but the decision record answers with v only prepared: no
    // host committed v (the first commits alone first), and no coordinator of the job can
    // any more (owners hold the job's lease: job_lease.h), so roll back.
    const int first = FirstParticipant(v);
    const bool undecided_first = first >= 0 && answered_[first] && row[first] == Has::kPrepared;
    if (!forward && owner_ && (any_missing || parts.empty() || undecided_first)) {
      out_.changed = true;
      Status a = AbortEverywhere(clients_, Holders(v, true), job_, v);
      if (a.ok()) {
        CloseOnAnswered(v, {});  // its capabilities die everywhere (revocation.h)
        out_.aborted.push_back(v);
        out_.lines.push_back(name + ": not every participant prepared it: rolled back");
        return Status::Ok();
      }
      if (a.code() != StatusCode::kFailedPrecondition) return a;
      forward = true;  // someone committed it meanwhile
    }
    if (!forward) {
      out_.pending.push_back(v);
      out_.lines.push_back(name + ": prepared, but a participant does not answer: undecided");
      return Status::Ok();
    }
    return RollForward(v, parts, committed_any, name);
  }

  // Commits v on every host holding it; releases the old versions there too when every
  // participant holds it and answers.
  Status RollForward(uint64_t v, const std::vector<int>& parts, bool committed_any,
                     const std::string& name) {
    const std::vector<int> live = Holders(v, false);
    bool everyone = !parts.empty();  // every participant holds it and answers
    for (int p : parts) {
      everyone = everyone && p >= 0 && answered_[p] &&
                 std::find(live.begin(), live.end(), p) != live.end();
    }
    out_.changed = true;
    TP_ASSIGN_OR_RETURN(CommitOutcome c, CommitEverywhere(clients_, live, job_, v, everyone));
    CloseOnAnswered(v, c.confirmed);  // the hosts without v too (revocation.h)
    out_.committed.push_back(v);
    out_.lines.push_back(name + ": " +
                         (committed_any ? "committed on some hosts" : "prepared on every host") +
                         ": committed on " + std::to_string(c.confirmed.size()) + " more" +
                         (c.unconfirmed.empty() ? "" : ", unconfirmed on some"));
    // CommitEverywhere released the old versions on the holders; the other hosts of
    // v's placement are checked by ReleaseOlder on the next call.
    if (c.released) out_.released.push_back(v);
    return Status::Ok();
  }

  // The transform to v is over: every host that answered and is not in `done` closes it.
  void CloseOnAnswered(uint64_t v, const std::vector<int>& done) {
    std::vector<int> hosts;
    for (int h : HostsExcept(clients_.size(), done)) {
      if (answered_[h]) hosts.push_back(h);
    }
    CloseTransform(clients_, hosts, job_, v);
  }

  // Round two for a version committed everywhere whose old versions are still kept.
  void ReleaseOlder() {
    for (auto& [v, hs] : older_) {
      if (std::find(out_.committed.begin(), out_.committed.end(), v) != out_.committed.end())
        continue;
      const std::vector<int> parts = ParticipantsOf(v);
      bool all = !parts.empty();
      for (int p : parts) all = all && p >= 0 && answered_[p] && current_[p] == v;
      if (!all) continue;
      out_.changed = true;
      ReleaseOn(clients_, Sorted(hs), job_);
      out_.released.push_back(v);
    }
  }

  const std::vector<std::string>& urls_;
  const std::vector<store::Client*>& clients_;
  const std::string& job_;
  const JobListing& listing_;
  const HostMatcher matcher_;
  const bool owner_;
  const int n_;
  std::vector<bool> answered_;
  std::vector<std::optional<uint64_t>> current_;
  std::map<uint64_t, std::vector<Has>> has_;    // version -> state on every host
  std::map<uint64_t, int> info_;                // version -> its info (a prepared copy)
  std::map<uint64_t, std::vector<int>> infos_;  // version -> its info on every host (-1: none)
  std::map<uint64_t, std::vector<int>> older_;  // current version -> hosts with older ones
  Resolution out_;
};

}  // namespace

Result<Resolution> ResolvePending(const std::vector<std::string>& urls,
                                  const std::vector<store::Client*>& clients,
                                  const std::string& job, bool owner) {
  return ResolvePending(urls, clients, job, owner, ReadJobListing(clients, job));
}

Result<Resolution> ResolvePending(const std::vector<std::string>& urls,
                                  const std::vector<store::Client*>& clients,
                                  const std::string& job, bool owner, const JobListing& listing) {
  return Resolver(urls, clients, job, owner, listing).Run();
}

}  // namespace tenplex::cluster
