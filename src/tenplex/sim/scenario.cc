#include "tenplex/sim/scenario.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tenplex/util/json_depth.h"

namespace tenplex::sim {
namespace {

using nlohmann::json;

// j[key] as a finite number > 0 (or >= min_incl when given), `def` when absent.
Result<double> Number(const json& j, const std::string& where, const char* key, double def,
                      bool positive = true, double max = 1e15) {
  auto it = j.find(key);
  if (it == j.end()) return def;
  if (!it->is_number()) return InvalidArgument(where + "." + key + " must be a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < 0 || (positive && v == 0)) {
    return InvalidArgument(where + "." + key + " must be " + (positive ? "> 0" : ">= 0") +
                           " (got " + it->dump() + ")");
  }
  if (v > max) {
    char m[32];
    std::snprintf(m, sizeof m, "%g", max);
    return InvalidArgument(where + "." + key + " must be at most " + m + " (got " + it->dump() +
                           ")");
  }
  return v;
}

Result<int> Int(const json& j, const std::string& where, const char* key, int def, int min,
                int max) {
  auto it = j.find(key);
  if (it == j.end()) return def;
  if (!it->is_number_integer()) return InvalidArgument(where + "." + key + " must be an integer");
  const int64_t v = it->get<int64_t>();
  if (v < min || v > max) {
    return InvalidArgument(where + "." + key + " must be in [" + std::to_string(min) + ", " +
                           std::to_string(max) + "] (got " + std::to_string(v) + ")");
  }
  return static_cast<int>(v);
}

Result<ParallelConfig> Config(const json& side, const std::string& where) {
  auto it = side.find("config");
  if (it == side.end() || !it->is_string())
    return InvalidArgument(where + ".config must be a config string such as \"tp=2,pp=2,dp=2\"");
  auto c = ParseConfig(it->get<std::string>());
  if (!c.ok()) return c.status().WithContext(where + ".config");
  if (static_cast<int64_t>(c->tp) * c->pp * c->dp > kMaxSimRanks) {
    return InvalidArgument(where + ".config has more than " + std::to_string(kMaxSimRanks) +
                           " ranks");
  }
  return *c;
}

Result<json> Object(const json& j, const char* key, bool required) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) return InvalidArgument(std::string("scenario needs \"") + key + "\"");
    return json::object();
  }
  if (!it->is_object()) return InvalidArgument(std::string(key) + " must be a JSON object");
  return *it;
}

Status ParseStragglers(const json& c, ClusterModel& m) {
  auto it = c.find("stragglers");
  if (it == c.end()) return Status::Ok();
  if (!it->is_array()) return InvalidArgument("cluster.stragglers must be an array");
  for (const json& s : *it) {
    if (!s.is_object()) return InvalidArgument("cluster.stragglers: entries are objects");
    if (!s.contains("host")) return InvalidArgument("cluster.stragglers: an entry has no host");
    TP_ASSIGN_OR_RETURN(int host, Int(s, "cluster.stragglers[]", "host", 0, 0, kMaxSimRanks));
    if (!s.contains("factor")) return InvalidArgument("cluster.stragglers: an entry has no factor");
    TP_ASSIGN_OR_RETURN(double f,
                        Number(s, "cluster.stragglers[]", "factor", 1, true, kMaxStraggler));
    if (f < 1) return InvalidArgument("cluster.stragglers[].factor must be >= 1 (a slowdown)");
    if (m.straggler.size() <= static_cast<std::size_t>(host)) m.straggler.resize(host + 1, 1.0);
    m.straggler[host] = f;
  }
  return Status::Ok();
}

Result<ClusterModel> ParseCluster(const json& c) {
  ClusterModel m;
  const std::string w = "cluster";
  TP_ASSIGN_OR_RETURN(m.nic_gbit_s, Number(c, w, "nic_gbit_s", m.nic_gbit_s));
  TP_ASSIGN_OR_RETURN(m.latency_us, Number(c, w, "latency_us", m.latency_us, false));
  TP_ASSIGN_OR_RETURN(m.copy_gbyte_s, Number(c, w, "copy_gbyte_s", m.copy_gbyte_s));
  TP_ASSIGN_OR_RETURN(m.memory_gbyte_s, Number(c, w, "memory_gbyte_s", m.memory_gbyte_s));
  TP_ASSIGN_OR_RETURN(m.map_gbyte_s, Number(c, w, "map_gbyte_s", m.map_gbyte_s));
  TP_ASSIGN_OR_RETURN(m.hash_gbyte_s, Number(c, w, "hash_gbyte_s", 0, false));
  TP_ASSIGN_OR_RETURN(m.rpc_us, Number(c, w, "rpc_us", m.rpc_us, false));
  TP_ASSIGN_OR_RETURN(m.json_gbyte_s, Number(c, w, "json_gbyte_s", 0, false));
  TP_ASSIGN_OR_RETURN(m.pfs_gbyte_s, Number(c, w, "pfs_gbyte_s", 0, false));
  TP_ASSIGN_OR_RETURN(m.lost_detect_s, Number(c, w, "lost_detect_s", 0, false, 86400));
  TP_ASSIGN_OR_RETURN(m.coordinator_threads, Int(c, w, "coordinator_threads", 0, 0, 4096));
  if (auto it = c.find("presized"); it != c.end()) {
    if (!it->is_boolean()) return InvalidArgument("cluster.presized must be true or false");
    m.presized = it->get<bool>();
  }
  TP_RETURN_IF_ERROR(ParseStragglers(c, m));
  if (auto it = c.find("lost_hosts"); it != c.end()) {
    if (!it->is_array()) return InvalidArgument("cluster.lost_hosts must be an array of hosts");
    for (const json& h : *it) {
      if (!h.is_number_integer() || h.get<int64_t>() < 0 || h.get<int64_t>() > kMaxSimRanks)
        return InvalidArgument("cluster.lost_hosts: " + h.dump() + " is not a host index");
      m.lost_hosts.push_back(h.get<int>());
    }
  }
  return m;
}

Status ParseSim(const json& j, Scenario& s) {
  TP_ASSIGN_OR_RETURN(json sim, Object(j, "sim", false));
  if (auto it = sim.find("mode"); it != sim.end()) {
    const std::string mode = it->is_string() ? it->get<std::string>() : "";
    if (mode == "auto") {
      s.mode = SimMode::kAuto;
    } else if (mode == "full") {
      s.mode = SimMode::kFull;
    } else if (mode == "sample") {
      s.mode = SimMode::kSample;
    } else {
      return InvalidArgument("sim.mode must be \"auto\", \"full\" or \"sample\" (got " +
                             it->dump() + ")");
    }
  }
  TP_ASSIGN_OR_RETURN(s.max_kinds, Int(sim, "sim", "max_kinds", s.max_kinds, 1, kMaxSimRanks));
  TP_ASSIGN_OR_RETURN(s.full_max_ranks,
                      Int(sim, "sim", "full_max_ranks", s.full_max_ranks, 1, 2 * kMaxSimRanks));
  return Status::Ok();
}

Status ParseModel(const json& j, Scenario& s) {
  auto it = j.find("model");
  if (it == j.end()) return InvalidArgument("scenario needs \"model\" (a preset, file or object)");
  if (it->is_string()) {
    s.model_spec = it->get<std::string>();
    if (s.model_spec.empty()) return InvalidArgument("model must not be empty");
    return Status::Ok();
  }
  if (!it->is_object()) return InvalidArgument("model must be a preset name, a file or an object");
  auto m = ModelFromJson(it->dump());
  if (!m.ok()) return m.status().WithContext("model");
  s.inline_model = std::move(m).value();
  return Status::Ok();
}

}  // namespace

Result<Scenario> ParseScenario(const std::string& text) {
  TP_RETURN_IF_ERROR(CheckJsonDepth(text, "scenario"));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("scenario is not valid JSON");
  if (!j.is_object()) return InvalidArgument("scenario must be a JSON object");
  Scenario s;
  TP_RETURN_IF_ERROR(ParseModel(j, s));
  TP_ASSIGN_OR_RETURN(json from, Object(j, "from", true));
  TP_ASSIGN_OR_RETURN(json to, Object(j, "to", true));
  TP_ASSIGN_OR_RETURN(s.from, Config(from, "from"));
  TP_ASSIGN_OR_RETURN(s.to, Config(to, "to"));
  TP_ASSIGN_OR_RETURN(s.from_gpus_per_host, Int(from, "from", "gpus_per_host", 8, 1, 1024));
  TP_ASSIGN_OR_RETURN(s.to_gpus_per_host, Int(to, "to", "gpus_per_host", 8, 1, 1024));
  TP_ASSIGN_OR_RETURN(s.to_hosts, Int(to, "to", "hosts", 0, 1, kMaxSimRanks));
  TP_ASSIGN_OR_RETURN(json cluster, Object(j, "cluster", false));
  TP_ASSIGN_OR_RETURN(s.cluster, ParseCluster(cluster));
  TP_RETURN_IF_ERROR(ParseSim(j, s));
  return s;
}

Result<Model> ResolveModel(const Scenario& s) {
  if (s.inline_model) return *s.inline_model;
  auto m = LoadModel(s.model_spec);
  if (!m.ok()) return m.status().WithContext("model");
  return m;
}

}  // namespace tenplex::sim
