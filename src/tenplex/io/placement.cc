#include "tenplex/io/placement.h"

#include <cstdint>
#include <set>

#include "tenplex/util/file.h"

namespace tenplex::io {

using nlohmann::json;

std::vector<int> Cluster::RankHosts(int world_size) const {
  std::vector<int> out(world_size);
  for (int r = 0; r < world_size; ++r) out[r] = HostOfRank(r);
  return out;
}

Result<Cluster> ParseCluster(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("cluster: not a JSON object");
  for (const auto& [k, v] : j.items()) {
    if (k != "hosts" && k != "gpus_per_host" && k != "host_ids") {
      return InvalidArgument("cluster: unknown field '" + k +
                             "' (expected hosts, gpus_per_host, host_ids)");
    }
  }
  if (!j.contains("hosts") || !j["hosts"].is_array() || j["hosts"].empty()) {
    return InvalidArgument("cluster: 'hosts' must be a non-empty array of store URLs");
  }
  if (!j.contains("gpus_per_host") || !j["gpus_per_host"].is_number_integer() ||
      j["gpus_per_host"].get<int64_t>() < 1 || j["gpus_per_host"].get<int64_t>() > 4096) {
    return InvalidArgument("cluster: 'gpus_per_host' must be an integer in [1, 4096]");
  }
  Cluster c;
  c.gpus_per_host = j["gpus_per_host"].get<int>();
  std::set<std::string> seen;
  for (std::size_t i = 0; i < j["hosts"].size(); ++i) {
    const json& h = j["hosts"][i];
    if (!h.is_string() || h.get<std::string>().rfind("http://", 0) != 0 ||
        h.get<std::string>().size() <= 7) {
      return InvalidArgument("cluster: hosts[" + std::to_string(i) +
                             "] must be a URL \"http://host:port\"");
    }
    std::string url = h.get<std::string>();
    if (!seen.insert(url).second)
      return InvalidArgument("cluster: host " + url + " is listed twice");
    c.hosts.push_back(std::move(url));
  }
  if (j.contains("host_ids")) {
    const json& ids = j["host_ids"];
    if (!ids.is_array() || ids.size() != c.hosts.size()) {
      return InvalidArgument("cluster: 'host_ids' must be an array as long as 'hosts'");
    }
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (!ids[i].is_string() || ids[i].get<std::string>().size() > 64) {
        return InvalidArgument("cluster: host_ids[" + std::to_string(i) +
                               "] must be a host id string (\"\" when unknown)");
      }
      c.host_ids.push_back(ids[i].get<std::string>());
    }
  }
  return c;
}

json ClusterJson(const Cluster& c) {
  json j = {{"hosts", c.hosts}, {"gpus_per_host", c.gpus_per_host}};
  bool any = false;
  for (std::size_t i = 0; i < c.hosts.size(); ++i) any = any || !c.HostId(i).empty();
  if (any) {
    json ids = json::array();
    for (std::size_t i = 0; i < c.hosts.size(); ++i) ids.push_back(c.HostId(i));
    j["host_ids"] = std::move(ids);
  }
  return j;
}

Result<Cluster> ReadClusterFile(const std::string& path) {
  TP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  Result<Cluster> c = ParseCluster(text);
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

}  // namespace tenplex::io
