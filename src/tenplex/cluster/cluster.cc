#include "tenplex/cluster/cluster.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "tenplex/cluster/job_listing.h"
#include "tenplex/store/parse.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::cluster {

using nlohmann::json;

Cluster WithHostIds(Cluster cluster, const std::vector<store::Client*>& clients) {
  cluster.host_ids.resize(cluster.hosts.size());
  for (std::size_t i = 0; i < cluster.hosts.size() && i < clients.size(); ++i) {
    if (clients[i] != nullptr && !clients[i]->host_id().empty())
      cluster.host_ids[i] = clients[i]->host_id();
  }
  return cluster;
}

Cluster WithHostIds(Cluster cluster, const std::vector<std::unique_ptr<store::Client>>& clients) {
  std::vector<store::Client*> raw;
  for (const auto& c : clients) raw.push_back(c.get());
  return WithHostIds(std::move(cluster), raw);
}

int MatchHost(const Cluster& placement, std::size_t slot, const std::vector<std::string>& urls,
              const std::vector<store::Client*>& clients) {
  return HostMatcher(urls, clients).Match(placement, slot);
}

namespace {
std::string IdOf(const std::vector<store::Client*>& clients, std::size_t h) {
  return h < clients.size() && clients[h] != nullptr ? clients[h]->host_id() : std::string();
}
}  // namespace

HostMatcher::HostMatcher(const std::vector<std::string>& urls,
                         const std::vector<store::Client*>& clients)
    : clients_(clients) {
  for (std::size_t h = 0; h < urls.size(); ++h) {
    const std::string id = IdOf(clients, h);
    if (!id.empty()) by_id_.emplace(id, static_cast<int>(h));
    by_url_[urls[h]].push_back(static_cast<int>(h));
  }
}

int HostMatcher::Match(const Cluster& placement, std::size_t slot) const {
  if (slot >= placement.hosts.size()) return -1;
  const std::string want = placement.HostId(slot);
  if (!want.empty()) {
    auto it = by_id_.find(want);
    if (it != by_id_.end()) return it->second;
  }
  auto it = by_url_.find(placement.hosts[slot]);
  if (it == by_url_.end()) return -1;
  for (int h : it->second) {
    // Both ids known and different: another daemon now answers at the recorded URL.
    if (want.empty() || IdOf(clients_, static_cast<std::size_t>(h)).empty()) return h;
  }
  return -1;
}

Result<std::vector<std::unique_ptr<store::Client>>> ConnectCluster(
    const Cluster& cluster, const store::ClientOptions& options, bool allow_lost) {
  const std::size_t n = cluster.hosts.size();
  std::vector<std::optional<Result<std::unique_ptr<store::Client>>>> conns(n);
  ForEachConcurrently(n, kControlConcurrency, [&](std::size_t h) {
    conns[h] = store::Client::Connect(cluster.hosts[h], options);
  });
  std::vector<std::unique_ptr<store::Client>> out;
  for (std::size_t h = 0; h < n; ++h) {
    Result<std::unique_ptr<store::Client>>& c = *conns[h];
    if (!c.ok() && allow_lost && c.status().code() == StatusCode::kUnavailable) {
      out.push_back(nullptr);
      continue;
    }
    if (!c.ok())
      return c.status().WithContext("host " + std::to_string(h) + " (" + cluster.hosts[h] + ")");
    out.push_back(std::move(*c));
  }
  // One daemon named twice (two URLs of one host): its ranks would collide.
  std::map<std::string, std::size_t> seen;  // host id -> first host with it
  for (std::size_t b = 0; b < out.size(); ++b) {
    if (!out[b] || out[b]->host_id().empty()) continue;
    auto [it, fresh] = seen.emplace(out[b]->host_id(), b);
    if (!fresh) {
      return InvalidArgument("cluster: hosts " + cluster.hosts[it->second] + " and " +
                             cluster.hosts[b] + " are the same store daemon (host id " +
                             out[b]->host_id() + "); list each host once");
    }
  }
  return out;
}

Result<uint64_t> NextCommonVersion(const std::vector<std::unique_ptr<store::Client>>& clients,
                                   const std::string& job) {
  std::vector<store::Client*> raw;
  for (const auto& c : clients) raw.push_back(c.get());
  return NextCommonVersion(raw, job);
}

Result<uint64_t> NextCommonVersion(const std::vector<store::Client*>& clients,
                                   const std::string& job) {
  return NextCommonVersion(clients, ReadJobListing(clients, job));
}

Result<uint64_t> NextCommonVersion(const std::vector<store::Client*>& clients,
                                   const JobListing& listing) {
  // One past every version any host has had: committed, current, or left open by a
  // coordinator that died (an explicit BeginVersion must not collide with it).
  for (std::size_t h = 0; h < clients.size(); ++h) {
    const Status& st = listing.hosts[h].status;
    if (clients[h] == nullptr || st.ok() || st.code() == StatusCode::kNotFound) continue;
    return st.code() == StatusCode::kUnavailable ? st.WithContext(clients[h]->url()) : st;
  }
  return listing.NextVersion();
}

}  // namespace tenplex::cluster
