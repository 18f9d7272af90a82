#include "tenplex/cluster/revocation.h"

#include <algorithm>
#include <atomic>

#include "tenplex/util/thread_pool.h"

namespace tenplex::cluster {

int CloseTransform(const std::vector<store::Client*>& clients, std::vector<int> hosts,
                   const std::string& job, uint64_t version) {
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  std::erase_if(hosts, [&](int h) {
    return h < 0 || static_cast<std::size_t>(h) >= clients.size() || clients[h] == nullptr;
  });
  std::atomic<int> confirmed{0};
  const std::string path = "/v1/jobs/" + job + "/versions/" + std::to_string(version) + "/close";
  ForEachConcurrently(hosts.size(), kControlConcurrency, [&](std::size_t i) {
    if (clients[hosts[i]]->CallJson("POST", path).ok()) ++confirmed;
  });
  return confirmed.load();
}

std::vector<int> HostsExcept(std::size_t n, const std::vector<int>& except) {
  std::vector<bool> skip(n, false);
  for (int h : except) {
    if (h >= 0 && static_cast<std::size_t>(h) < n) skip[h] = true;
  }
  std::vector<int> out;
  for (std::size_t h = 0; h < n; ++h) {
    if (!skip[h]) out.push_back(static_cast<int>(h));
  }
  return out;
}

}  // namespace tenplex::cluster
