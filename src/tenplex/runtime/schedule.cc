#include "tenplex/runtime/schedule.h"

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>

#include "tenplex/util/json_depth.h"
#include "tenplex/util/json_value.h"

namespace tenplex::runtime {

using nlohmann::json;

namespace {

// The entry's config: chosen by the policy for "gpus": N, else parsed from "config"
// (none on a stop entry).
Status ParseEntryConfig(const json& e, const std::string& where, const Model& model,
                        const ConfigChooser& choose, ScheduleEntry& s) {
  if (e.contains("gpus")) {
    if (s.stop || e.contains("config"))
      return InvalidArgument(where + ": give one of 'config', 'gpus' or \"stop\"");
    if (!e["gpus"].is_number_integer() || e["gpus"].get<int64_t>() < 1 ||
        e["gpus"].get<int64_t>() > 1 << 20) {
      return InvalidArgument(where + ": 'gpus' must be an integer >= 1");
    }
    for (const char* k : {"device_profile", "gpu_memory"}) {
      if (e.contains(k) && !e[k].is_string())
        return InvalidArgument(where + ": '" + k + "' must be a string");
    }
    if (!choose)
      return InvalidArgument(where + ": 'gpus' entries need the config policy (tenplex run)");
    s.gpus = e["gpus"].get<int>();
    auto c = choose(s.gpus, JsonValueOr(e, "device_profile", ""), JsonValueOr(e, "gpu_memory", ""));
    if (!c.ok()) {
      Status err = c.status().WithContext(where + " (" + std::to_string(s.gpus) + " GPUs)");
      // Nothing fits that many GPUs: the schedule asks for the impossible, bad input (exit
      // 2) like every other schedule error (issue 34 item 9), not a failure of the run.
      if (err.code() == StatusCode::kResourceExhausted) return InvalidArgument(err.message());
      return err;
    }
    s.config = c->config;
    s.worker_args = c->worker_args;
  } else if (s.stop == e.contains("config")) {
    return InvalidArgument(where + ": needs either a 'config', 'gpus' or \"stop\": true");
  } else if (e.contains("device_profile") || e.contains("gpu_memory")) {
    return InvalidArgument(where + ": 'device_profile' and 'gpu_memory' go with 'gpus'");
  }
  if (!s.stop && !s.gpus) {
    if (!e["config"].is_string()) return InvalidArgument(where + ": 'config' must be a string");
    auto c = ParseConfig(e["config"].get<std::string>());
    if (!c.ok()) return c.status().WithContext(where);
    Status v = ValidateConfig(model, *c);
    if (!v.ok()) return v.WithContext(where);
    s.config = *c;
  }
  return Status::Ok();
}

// "kill_ranks" (ranks of the running config, prev's) and "kill_hosts"; neither is allowed
// on the first entry (prev null).
Status ParseKills(const json& e, const std::string& where, const ScheduleEntry* prev,
                  ScheduleEntry& s) {
  if (e.contains("kill_ranks")) {
    if (prev == nullptr)
      return InvalidArgument(where + ": kill_ranks needs running workers (not on the first entry)");
    if (!e["kill_ranks"].is_array())
      return InvalidArgument(where + ": 'kill_ranks' must be a list of ranks");
    const int world = prev->config.world_size();
    for (const json& r : e["kill_ranks"]) {
      if (!r.is_number_integer() || r.get<int64_t>() < 0 || r.get<int64_t>() >= world) {
        return InvalidArgument(where + ": kill rank " + r.dump() +
                               " is not a rank of the running config " + prev->config.ToString() +
                               " (world size " + std::to_string(world) + ")");
      }
      s.kill_ranks.push_back(r.get<int>());
    }
  }
  if (e.contains("kill_hosts")) {
    if (prev == nullptr)
      return InvalidArgument(where + ": kill_hosts needs running workers (not on the first entry)");
    if (!e["kill_hosts"].is_array())
      return InvalidArgument(where + ": 'kill_hosts' must be a list of host indexes");
    for (const json& h : e["kill_hosts"]) {
      if (!h.is_number_integer() || h.get<int64_t>() < 0 || h.get<int64_t>() > 1 << 20) {
        return InvalidArgument(where + ": kill host " + h.dump() +
                               " is not a host index of the cluster file");
      }
      s.kill_hosts.push_back(h.get<int>());
    }
  }
  return Status::Ok();
}

// "slowdown": {"RANK": FACTOR}, ranks of the entry's own config.
Status ParseSlowdown(const json& e, const std::string& where, ScheduleEntry& s) {
  if (!e.contains("slowdown")) return Status::Ok();
  if (!e["slowdown"].is_object())
    return InvalidArgument(where + ": 'slowdown' must be an object {\"RANK\": FACTOR}");
  std::map<int, double> slow;
  const int world = s.stop ? 0 : s.config.world_size();
  for (auto& [k, v] : e["slowdown"].items()) {
    char* endp = nullptr;
    const long r = std::strtol(k.c_str(), &endp, 10);
    if (k.empty() || *endp != '\0' || r < 0 || r >= world) {
      return InvalidArgument(where + ": slowdown rank '" + k + "' is not a rank of " +
                             (s.stop ? std::string("a stop entry") : s.config.ToString()));
    }
    if (!v.is_number() || !(v.get<double>() >= 1.0) || v.get<double>() > 1000) {
      return InvalidArgument(where + ": slowdown factor of rank " + k + " must be in [1, 1000]");
    }
    slow[static_cast<int>(r)] = v.get<double>();
  }
  s.slowdown = std::move(slow);
  return Status::Ok();
}

// Entry i of the schedule (prev: the entry before it, null for the first; last: whether
// it is the last one).
Result<ScheduleEntry> ParseEntry(const json& e, std::size_t i, const ScheduleEntry* prev, bool last,
                                 const Model& model, const ConfigChooser& choose) {
  const std::string where = "schedule entry " + std::to_string(i);
  if (!e.is_object()) return InvalidArgument(where + " is not an object");
  for (auto& [k, v] : e.items()) {
    (void)v;
    static const std::set<std::string> known = {"step",           "config",     "stop",
                                                "kill_ranks",     "kill_hosts", "gpus",
                                                "device_profile", "gpu_memory", "slowdown"};
    if (!known.count(k)) return InvalidArgument(where + ": unknown field '" + k + "'");
  }
  ScheduleEntry s;
  if (!e.contains("step") || !e["step"].is_number_integer()) {
    return InvalidArgument(where + ": 'step' must be an integer");
  }
  s.step = e["step"].get<int64_t>();
  if (s.step < 0) return InvalidArgument(where + ": step must be >= 0");
  if (prev == nullptr && s.step != 0) return InvalidArgument("schedule must start at step 0");
  if (prev != nullptr && s.step <= prev->step) {
    return InvalidArgument(where + ": step " + std::to_string(s.step) + " is not after step " +
                           std::to_string(prev->step));
  }
  s.stop = e.contains("stop") && e["stop"].is_boolean() && e["stop"].get<bool>();
  if (e.contains("stop") && !e["stop"].is_boolean())
    return InvalidArgument(where + ": 'stop' must be true or false");
  TP_RETURN_IF_ERROR(ParseEntryConfig(e, where, model, choose, s));
  TP_RETURN_IF_ERROR(ParseKills(e, where, prev, s));
  TP_RETURN_IF_ERROR(ParseSlowdown(e, where, s));
  if (s.stop && !last) return InvalidArgument(where + ": a stop entry must be the last entry");
  return s;
}

}  // namespace

Result<std::vector<ScheduleEntry>> ParseSchedule(const std::string& text, const Model& model,
                                                 const ConfigChooser& choose) {
  TP_RETURN_IF_ERROR(CheckJsonDepth(text, "schedule"));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return InvalidArgument("schedule is not valid JSON");
  if (!j.is_array() || j.empty())
    return InvalidArgument("schedule must be a non-empty JSON list of entries");
  std::vector<ScheduleEntry> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    TP_ASSIGN_OR_RETURN(ScheduleEntry s, ParseEntry(j[i], i, out.empty() ? nullptr : &out.back(),
                                                    i + 1 == j.size(), model, choose));
    out.push_back(std::move(s));
  }
  if (!out.back().stop)
    return InvalidArgument("schedule must end with a {\"step\": N, \"stop\": true} entry");
  if (out.size() < 2) return InvalidArgument("schedule needs a config entry before the stop entry");
  return out;
}

std::string SlowdownArg(const std::map<int, double>& slowdown) {
  std::string out;
  for (const auto& [r, f] : slowdown) {
    if (f == 1.0) continue;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%d=%g", out.empty() ? "" : ",", r, f);
    out += buf;
  }
  return out;
}

}  // namespace tenplex::runtime
