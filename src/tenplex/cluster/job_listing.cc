#include "tenplex/cluster/job_listing.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "tenplex/util/hash.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::cluster {

const ListedVersion* JobListing::Find(std::size_t h, uint64_t v) const {
  if (h >= hosts.size()) return nullptr;
  for (const ListedVersion& lv : hosts[h].versions) {
    if (lv.version == v) return &lv;
  }
  return nullptr;
}

uint64_t JobListing::NextVersion() const {
  uint64_t next = 1;
  for (const HostListing& h : hosts) {
    next = std::max(next, h.last + 1);
    for (const ListedVersion& v : h.versions) next = std::max(next, v.version + 1);
  }
  return next;
}

namespace {

// Host h's listing with info digests (its infos fetched after, once per distinct one);
// a daemon that does not know ?info=digest is asked for the infos themselves.
Result<store::JobInfo> ListOne(store::Client* c, const std::string& job) {
  Result<store::JobInfo> j = c->JobDigests(job);
  if (!j.ok() && j.status().code() == StatusCode::kInvalidArgument) return c->Job(job);
  return j;
}

}  // namespace

JobListing ReadJobListing(const std::vector<store::Client*>& clients, const std::string& job) {
  JobListing out;
  out.hosts.resize(clients.size());
  std::mutex mu;                                        // guards out.infos, index and fetch
  std::map<std::string, int> index;                     // the info's xxh64 -> infos index
  std::vector<std::pair<std::size_t, uint64_t>> fetch;  // per infos index: a holder, version
  ForEachConcurrently(clients.size(), kControlConcurrency, [&](std::size_t h) {
    HostListing& mine = out.hosts[h];
    if (clients[h] == nullptr) {
      mine.status = Unavailable("host is lost");
      return;
    }
    Result<store::JobInfo> j = ListOne(clients[h], job);
    if (!j.ok()) {
      mine.status = j.status().code() == StatusCode::kNotFound ||
                            j.status().code() == StatusCode::kUnavailable
                        ? j.status()
                        : j.status().WithContext(clients[h]->url());
      return;
    }
    mine.current = j->current;
    mine.last = j->last;
    std::lock_guard<std::mutex> lock(mu);
    for (store::VersionInfo& v : j->versions) {
      // The daemon's digest is of the info as it serves it (canonical JSON), which is
      // the text a full listing gives: one key for both kinds of listing.
      const bool digest = !v.info_xxh64.empty();
      const std::string key = digest ? v.info_xxh64 : Xxh64Hex(v.info.data(), v.info.size());
      auto it = index.find(key);
      if (it == index.end()) {
        it = index.emplace(key, static_cast<int>(out.infos.size())).first;
        out.infos.push_back(digest ? std::string() : std::move(v.info));
        fetch.emplace_back(digest ? h : clients.size(), v.version);
      }
      mine.versions.push_back({v.version, v.committed, v.prepared, it->second});
    }
  });
  // Each distinct info once, from a host that listed it. A host that fails here counts
  // as not answering (its listing is dropped); the next host that listed it is asked.
  for (std::size_t i = 0; i < fetch.size(); ++i) {
    if (fetch[i].first >= clients.size()) continue;  // listed with its text
    for (std::size_t k = 0; k < clients.size(); ++k) {
      const std::size_t h = (fetch[i].first + k) % clients.size();
      const ListedVersion* lv = nullptr;
      for (const ListedVersion& x : out.hosts[h].versions) {
        if (x.info == static_cast<int>(i)) lv = &x;
      }
      if (lv == nullptr) continue;
      Result<store::VersionInfo> v = clients[h]->Version(job, lv->version);
      if (v.ok()) {
        out.infos[i] = std::move(v->info);
        break;
      }
      out.hosts[h] = HostListing{};
      out.hosts[h].status = Unavailable(clients[h]->url() + " failed while its listing of job '" +
                                        job + "' was read: " + v.status().ToString());
    }
  }
  return out;
}

}  // namespace tenplex::cluster
