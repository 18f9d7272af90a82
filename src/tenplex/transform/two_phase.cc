#include "tenplex/transform/two_phase.h"

#include <algorithm>
#include <map>
#include <optional>
#include <thread>

#include "tenplex/transform/state_info.h"

namespace tenplex::transform {

namespace {

enum class Has { kNone, kOpen, kPrepared, kCommitted };

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

std::vector<int> Sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

}  // namespace

Result<CommitOutcome> CommitEverywhere(const std::vector<store::Client*>& clients,
                                       std::vector<int> participants, const std::string& job,
                                       uint64_t version, bool release) {
  participants = Sorted(std::move(participants));
  CommitOutcome out;
  std::vector<Status> st(participants.size());
  // The first participant alone first: its state is the decision record.
  if (!participants.empty()) st[0] = CommitOne(clients[participants[0]], job, version);
  {
    std::vector<std::thread> threads;
    for (std::size_t i = 1; i < participants.size(); ++i) {
      threads.emplace_back([&, i] { st[i] = CommitOne(clients[participants[i]], job, version); });
    }
    for (std::thread& t : threads) t.join();
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
    for (int p : participants) {
      (void)clients[p]->CallJson("POST", "/v1/jobs/" + job + "/release");  // best effort
    }
    out.released = true;
  }
  return out;
}

Status AbortEverywhere(const std::vector<store::Client*>& clients, std::vector<int> hosts,
                       const std::string& job, uint64_t version) {
  hosts = Sorted(std::move(hosts));
  bool first = true;
  for (int h : hosts) {
    store::Client* c = clients[h];
    if (c == nullptr) continue;
    Status s = c->Abort(job, version);
    if (first && !s.ok() && s.code() == StatusCode::kFailedPrecondition) {
      Result<store::VersionInfo> vi = c->Version(job, version);
      if (vi.ok() && vi->committed) {
        return FailedPrecondition("version " + std::to_string(version) + " of job " + job +
                                  " is already committed on " + c->url() + ": roll forward");
      }
    }
    if (s.ok() || s.code() == StatusCode::kNotFound) first = false;
  }
  return Status::Ok();
}

Result<Resolution> ResolvePending(const std::vector<std::string>& urls,
                                  const std::vector<store::Client*>& clients,
                                  const std::string& job, bool owner) {
  Resolution out;
  const int n = static_cast<int>(clients.size());
  std::vector<bool> answered(n, false);
  std::vector<std::optional<uint64_t>> current(n);
  std::map<uint64_t, std::vector<Has>> has;            // version -> state on every host
  std::map<uint64_t, std::string> info;                // version -> its info (from a prepared copy)
  std::map<uint64_t, std::vector<std::string>> infos;  // version -> its info on every host
  std::map<uint64_t, std::vector<int>> older;          // current version -> hosts with older ones
  for (int h = 0; h < n; ++h) {
    if (clients[h] == nullptr) continue;
    Result<store::JobInfo> j = clients[h]->Job(job);
    if (!j.ok()) {
      if (j.status().code() == StatusCode::kNotFound) answered[h] = true;
      if (j.status().code() != StatusCode::kNotFound &&
          j.status().code() != StatusCode::kUnavailable) {
        return j.status().WithContext(urls[h]);
      }
      continue;
    }
    answered[h] = true;
    current[h] = j->current;
    for (const store::VersionInfo& v : j->versions) {
      auto& row = has[v.version];
      row.resize(n, Has::kNone);
      row[h] = v.committed ? Has::kCommitted : (v.prepared ? Has::kPrepared : Has::kOpen);
      auto& irow = infos[v.version];
      irow.resize(n);
      irow[h] = v.info;
      // The reference copy: a committed one if any, else the first prepared one.
      if (v.committed || (v.prepared && !info.count(v.version))) info[v.version] = v.info;
      if (v.committed && j->current && v.version < *j->current) older[*j->current].push_back(h);
    }
  }
  auto holders = [&](uint64_t v, bool open_too) {
    std::vector<int> out;
    for (int h = 0; h < n; ++h) {
      const Has x = has[v][h];
      if (x == Has::kPrepared || x == Has::kCommitted || (open_too && x == Has::kOpen))
        out.push_back(h);
    }
    return out;
  };
  // The participants of v: the hosts of its info's "cluster" that get ranks (-1: not
  // one of ours).
  auto participants_of = [&](uint64_t v) -> std::vector<int> {
    Result<StateInfo> si = StateInfo::Parse(info[v]);
    if (!si.ok() || !si->placement()) return holders(v, false);
    const Cluster& placement = *si->placement();
    const int k = std::max(1, placement.gpus_per_host);
    const std::size_t used = std::min(
        placement.hosts.size(), static_cast<std::size_t>((si->config().world_size() + k - 1) / k));
    std::vector<int> out;
    for (std::size_t i = 0; i < used; ++i) {
      const std::string& u = placement.hosts[i];
      auto it = std::find(urls.begin(), urls.end(), u);
      out.push_back(it == urls.end() ? -1 : static_cast<int>(it - urls.begin()));
    }
    return out;
  };
  for (auto& [v, row] : has) {
    // A copy whose info differs from the reference one is another version that got the
    // same number (a stale prepare of a host given up on): it can never be committed.
    std::vector<int> strays;
    for (int h = 0; h < n && info.count(v); ++h) {
      if (row[h] == Has::kNone || row[h] == Has::kCommitted || infos[v][h] == info[v]) continue;
      strays.push_back(h);
      row[h] = Has::kNone;
    }
    if (!strays.empty()) {
      for (int h : strays) (void)clients[h]->Abort(job, v);
      out.lines.push_back("version " + std::to_string(v) + " of job " + job + ": removed " +
                          std::to_string(strays.size()) +
                          " stray copies with another info (a stale prepare)");
    }
    const bool prepared_any = std::count(row.begin(), row.end(), Has::kPrepared) > 0;
    const bool open_any = std::count(row.begin(), row.end(), Has::kOpen) > 0;
    const bool committed_any = std::count(row.begin(), row.end(), Has::kCommitted) > 0;
    const std::string name = "version " + std::to_string(v) + " of job " + job;
    if (!prepared_any) {
      if (open_any && !committed_any && owner) {
        TP_RETURN_IF_ERROR(AbortEverywhere(clients, holders(v, true), job, v));
        out.aborted.push_back(v);
        out.lines.push_back(name + ": open leftover of a coordinator that is gone: removed");
      }
      continue;
    }
    const std::vector<int> parts = participants_of(v);
    bool all_prepared = !parts.empty();
    bool any_missing = false;  // a live participant answered without v
    for (int p : parts) {
      if (p < 0 || !answered[p]) {
        all_prepared = false;
        continue;
      }
      if (row[p] != Has::kPrepared && row[p] != Has::kCommitted) {
        all_prepared = false;
        any_missing = true;
      }
    }
    bool forward = committed_any || all_prepared;
    if (!forward && owner && (any_missing || parts.empty())) {
      Status a = AbortEverywhere(clients, holders(v, true), job, v);
      if (a.ok()) {
        out.aborted.push_back(v);
        out.lines.push_back(name + ": not every participant prepared it: rolled back");
        continue;
      }
      if (a.code() != StatusCode::kFailedPrecondition) return a;
      forward = true;  // someone committed it meanwhile
    }
    if (!forward) {
      out.pending.push_back(v);
      out.lines.push_back(name + ": prepared, but a participant does not answer: undecided");
      continue;
    }
    const std::vector<int> live = holders(v, false);
    bool everyone = !parts.empty();  // every participant holds it and answers
    for (int p : parts) {
      everyone =
          everyone && p >= 0 && answered[p] && std::find(live.begin(), live.end(), p) != live.end();
    }
    TP_ASSIGN_OR_RETURN(CommitOutcome c, CommitEverywhere(clients, live, job, v, everyone));
    out.committed.push_back(v);
    out.lines.push_back(name + ": " +
                        (committed_any ? "committed on some hosts" : "prepared on every host") +
                        ": committed on " + std::to_string(c.confirmed.size()) + " more" +
                        (c.unconfirmed.empty() ? "" : ", unconfirmed on some"));
    // CommitEverywhere released the old versions on the holders; the other hosts of
    // v's placement are checked below on the next call.
    if (c.released) out.released.push_back(v);
  }
  // Round two for a version committed everywhere whose old versions are still kept.
  for (auto& [v, hs] : older) {
    if (std::find(out.committed.begin(), out.committed.end(), v) != out.committed.end()) continue;
    const std::vector<int> parts = participants_of(v);
    bool all = !parts.empty();
    for (int p : parts) all = all && p >= 0 && answered[p] && current[p] == v;
    if (!all) continue;
    for (int h : Sorted(hs)) (void)clients[h]->CallJson("POST", "/v1/jobs/" + job + "/release");
    out.released.push_back(v);
  }
  return out;
}

}  // namespace tenplex::transform
