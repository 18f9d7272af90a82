#include "tenplex/cluster/cluster_state.h"

#include <algorithm>
#include <optional>

#include "tenplex/plan/planner.h"

namespace tenplex::cluster {

int CommittedState::lost_ranks() const {
  return static_cast<int>(std::count(rank_hosts.begin(), rank_hosts.end(), plan::kLostHost));
}

Result<CommittedState> FindCommittedState(const std::vector<std::string>& urls,
                                          const std::vector<store::Client*>& clients,
                                          const std::string& job, const Cluster& fallback) {
  return FindCommittedState(urls, clients, job, fallback, ReadJobListing(clients, job));
}

Result<CommittedState> FindCommittedState(const std::vector<std::string>& urls,
                                          const std::vector<store::Client*>& clients,
                                          const std::string& job, const Cluster& fallback,
                                          const JobListing& listing) {
  if (urls.size() != clients.size() || listing.hosts.size() != clients.size())
    return InvalidArgument("FindCommittedState: urls, clients and the listing differ in size");
  CommittedState out;
  // Each host's current version (its number and info index), where it has one.
  std::vector<const ListedVersion*> cur(clients.size(), nullptr);
  int ref = -1;
  for (std::size_t h = 0; h < clients.size(); ++h) {
    const HostListing& l = listing.hosts[h];
    if (clients[h] == nullptr || l.status.code() == StatusCode::kUnavailable) {
      out.unavailable.push_back(static_cast<int>(h));
      continue;
    }
    if (l.status.code() == StatusCode::kNotFound) continue;
    if (!l.status.ok())
      return l.status.WithContext("host " + std::to_string(h) + " (" + urls[h] + ")");
    if (!l.current) continue;
    cur[h] = listing.Find(h, *l.current);
    if (cur[h] == nullptr) {
      return DataLoss("host " + std::to_string(h) + " (" + urls[h] + ") names version " +
                      std::to_string(*l.current) + " of job '" + job +
                      "' current but does not list it");
    }
    if (ref < 0 || cur[h]->version > cur[ref]->version) ref = static_cast<int>(h);
  }
  if (ref < 0 && out.unavailable.size() == clients.size()) {
    return Unavailable("no host answers (" + std::to_string(clients.size()) + " asked for job '" +
                       job + "')");
  }
  if (ref < 0) {
    // Name the hosts that did not answer: they may hold it (a slow daemon, not a lost one).
    std::string silent;
    for (int h : out.unavailable) silent += (silent.empty() ? "" : ", ") + urls[h];
    return NotFound("no live host holds a committed version of job '" + job + "'" +
                    (silent.empty() ? std::string()
                                    : " (" + std::to_string(out.unavailable.size()) + " of " +
                                          std::to_string(clients.size()) +
                                          " hosts did not answer: " + silent + ")"));
  }
  out.version = cur[ref]->version;
  out.info_text = listing.infos[cur[ref]->info];
  TP_ASSIGN_OR_RETURN(out.info, ParseStateInfo(job, out.version, out.info_text));
  out.placement = out.info.placement() ? *out.info.placement() : fallback;
  const int world = out.info.config().world_size();
  out.rank_hosts.assign(world, plan::kLostHost);
  // By host id where known: the URL a host is reached by may have changed.
  const HostMatcher matcher(urls, clients);
  std::vector<int> slot_host(out.placement.hosts.size());
  for (std::size_t slot = 0; slot < slot_host.size(); ++slot)
    slot_host[slot] = matcher.Match(out.placement, slot);
  for (int r = 0; r < world; ++r) {
    const std::size_t slot = static_cast<std::size_t>(out.placement.HostOfRank(r));
    const int match = slot < slot_host.size() ? slot_host[slot] : -1;
    if (match < 0) continue;
    const std::size_t h = static_cast<std::size_t>(match);
    // The same version with the same info (infos are listed once per distinct text).
    if (cur[h] && cur[h]->version == out.version && cur[h]->info == cur[ref]->info) {
      out.rank_hosts[r] = static_cast<int>(h);
      out.holders.push_back(static_cast<int>(h));
    }
  }
  std::sort(out.holders.begin(), out.holders.end());
  out.holders.erase(std::unique(out.holders.begin(), out.holders.end()), out.holders.end());
  return out;
}

}  // namespace tenplex::cluster
