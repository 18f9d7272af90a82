#include "tenplex/transform/cluster_state.h"

#include <algorithm>
#include <optional>

#include "tenplex/plan/planner.h"

namespace tenplex::transform {

int CommittedState::lost_ranks() const {
  return static_cast<int>(std::count(rank_hosts.begin(), rank_hosts.end(), plan::kLostHost));
}

Result<CommittedState> FindCommittedState(const std::vector<std::string>& urls,
                                          const std::vector<store::Client*>& clients,
                                          const std::string& job, const Cluster& fallback) {
  if (urls.size() != clients.size())
    return InvalidArgument("FindCommittedState: urls and clients differ in size");
  CommittedState out;
  std::vector<std::optional<store::VersionInfo>> cur(clients.size());
  int ref = -1;
  for (std::size_t h = 0; h < clients.size(); ++h) {
    if (clients[h] == nullptr) {
      out.unavailable.push_back(static_cast<int>(h));
      continue;
    }
    Result<store::VersionInfo> v = clients[h]->Version(job, std::nullopt);
    if (!v.ok()) {
      if (v.status().code() == StatusCode::kUnavailable) {
        out.unavailable.push_back(static_cast<int>(h));
      } else if (v.status().code() != StatusCode::kNotFound) {
        return v.status().WithContext("host " + std::to_string(h) + " (" + urls[h] + ")");
      }
      continue;
    }
    cur[h] = std::move(*v);
    if (ref < 0 || cur[h]->version > cur[ref]->version) ref = static_cast<int>(h);
  }
  if (ref < 0 && out.unavailable.size() == clients.size()) {
    return Unavailable("no host answers (" + std::to_string(clients.size()) + " asked for job '" +
                       job + "')");
  }
  if (ref < 0) return NotFound("no live host holds a committed version of job '" + job + "'");
  out.version = cur[ref]->version;
  out.info_text = cur[ref]->info;
  TP_ASSIGN_OR_RETURN(out.info, ParseStateInfo(job, out.version, out.info_text));
  out.placement = out.info.placement() ? *out.info.placement() : fallback;
  const int world = out.info.config().world_size();
  out.rank_hosts.assign(world, plan::kLostHost);
  for (int r = 0; r < world; ++r) {
    const std::size_t slot = static_cast<std::size_t>(out.placement.HostOfRank(r));
    // By host id where known: the URL a host is reached by may have changed.
    const int match = MatchHost(out.placement, slot, urls, clients);
    if (match < 0) continue;
    const std::size_t h = static_cast<std::size_t>(match);
    if (cur[h] && cur[h]->version == out.version && cur[h]->info == out.info_text) {
      out.rank_hosts[r] = static_cast<int>(h);
      if (std::find(out.holders.begin(), out.holders.end(), static_cast<int>(h)) ==
          out.holders.end()) {
        out.holders.push_back(static_cast<int>(h));
      }
    }
  }
  std::sort(out.holders.begin(), out.holders.end());
  return out;
}

}  // namespace tenplex::transform
