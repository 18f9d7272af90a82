// tenplex store ls [--url U | --cluster C] [JOB] [--json]
// tenplex store rm JOB [--version V] [--url U | --cluster C] [--json]
//
// What a store daemon (or every daemon of a cluster) holds, and removing it. On a
// cluster, a job's row merges the hosts: its current version when all hosts agree
// ("mixed" otherwise), bytes summed; a host that does not answer is reported, not fatal,
// for ls; rm removes from every host that has the job and fails if a host is down
// (state must not survive on a host the user thinks was cleaned).
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "tenplex/cli/command.h"
#include "tenplex/cluster/cluster.h"
#include "tenplex/io/state_info.h"
#include "tenplex/store/client.h"
#include "tenplex/util/format.h"

namespace tenplex::cli {
namespace {

using nlohmann::json;

constexpr const char* kDefaultUrl = "http://127.0.0.1:7480";

struct AdminOpts {
  std::string url, cluster, job;
  TokenOptions token;
  uint64_t version = 0;
  bool json = false;
};

struct Host {
  std::string url;
  std::unique_ptr<store::Client> client;  // null: did not answer
  std::string error;
};

Result<std::vector<Host>> Connect(const AdminOpts& o) {
  if (!o.url.empty() && !o.cluster.empty())
    return InvalidArgument("give at most one of --url and --cluster");
  store::ClientOptions co;
  TP_ASSIGN_OR_RETURN(co.token, ResolveToken(o.token));
  co.use_shm = false;  // control calls only
  std::vector<std::string> urls;
  if (!o.cluster.empty()) {
    TP_ASSIGN_OR_RETURN(io::Cluster c, io::ReadClusterFile(o.cluster));
    urls = c.hosts;
  } else {
    urls.push_back(o.url.empty() ? kDefaultUrl : o.url);
  }
  std::vector<Host> hosts;
  for (const std::string& u : urls) {
    Host h;
    h.url = u;
    auto c = store::Client::Connect(u, co);
    if (c.ok()) {
      h.client = std::move(*c);
    } else {
      h.error = c.status().message();
    }
    hosts.push_back(std::move(h));
  }
  if (o.cluster.empty() && !hosts[0].client) return Unavailable(hosts[0].error);
  return hosts;
}

// The fields of a version's info that `store ls` shows (InfoFields' keys).
constexpr const char* kInfoColumns[] = {"config", "step", "samples_consumed"};

// Those fields, read by the info's typed owner; none when the info is not a version
// info (empty, or written by something other than tenplex), "-" in the table.
json InfoFields(const std::string& info_text) {
  json out = json::object();
  Result<io::StateInfo> info = io::StateInfo::Parse(info_text, io::StateInfo::ModelRequired::kNo);
  if (!info.ok()) return out;
  out["config"] = info->config().ToString();
  if (info->step()) out["step"] = *info->step();
  if (info->samples_consumed()) out["samples_consumed"] = *info->samples_consumed();
  return out;
}

std::string Field(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return "-";
  return j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
}

// One job's versions on every answering host, merged by version number.
Result<json> JobJson(std::vector<Host>& hosts, const std::string& job, bool* found) {
  std::map<uint64_t, json> versions;
  json per_host = json::array();
  std::set<std::string> currents;
  *found = false;
  for (Host& h : hosts) {
    if (!h.client) continue;
    auto info = h.client->Job(job);
    if (!info.ok()) {
      if (info.status().code() == StatusCode::kNotFound) continue;
      return info.status();
    }
    *found = true;
    per_host.push_back(
        {{"host", h.url}, {"current", info->current ? json(*info->current) : json(nullptr)}});
    currents.insert(info->current ? std::to_string(*info->current) : "none");
    for (const store::VersionInfo& v : info->versions) {
      json& e = versions[v.version];
      if (e.is_null()) {
        e = {{"version", v.version}, {"state", v.committed ? "committed" : "open"},
             {"current", v.current}, {"bytes", 0},
             {"tensors", 0},         {"hosts", 0}};
        e.update(InfoFields(v.info));
      }
      e["bytes"] = e["bytes"].get<uint64_t>() + v.bytes;
      e["tensors"] = e["tensors"].get<uint64_t>() + v.tensors;
      e["hosts"] = e["hosts"].get<int>() + 1;
      if (!v.current) e["current"] = false;
    }
  }
  json out = {{"job", job}, {"hosts", per_host}};
  json current = nullptr;
  if (currents.size() == 1 && *currents.begin() != "none") current = std::stoull(*currents.begin());
  if (currents.size() > 1) current = "mixed";
  out["current"] = current;
  json vs = json::array();
  for (auto& [n, v] : versions) vs.push_back(v);
  out["versions"] = vs;
  return out;
}

Status List(const AdminOpts& o) {
  TP_ASSIGN_OR_RETURN(std::vector<Host> hosts, Connect(o));
  json unreachable = json::array();
  for (const Host& h : hosts) {
    if (!h.client) unreachable.push_back({{"host", h.url}, {"error", h.error}});
  }
  json out;
  if (!o.job.empty()) {
    bool found = false;
    TP_ASSIGN_OR_RETURN(out, JobJson(hosts, o.job, &found));
    if (!found)
      return NotFound("job '" + o.job + "' is not in the store" + (hosts.size() > 1 ? "s" : ""));
  } else {
    std::set<std::string> names;
    for (Host& h : hosts) {
      if (!h.client) continue;
      TP_ASSIGN_OR_RETURN(auto jobs, h.client->Jobs());
      names.insert(jobs.begin(), jobs.end());
    }
    json jobs = json::array();
    for (const std::string& name : names) {
      bool found = false;
      TP_ASSIGN_OR_RETURN(json j, JobJson(hosts, name, &found));
      if (!found) continue;  // deleted meanwhile
      json row = {{"job", name},
                  {"current", j["current"]},
                  {"versions", j["versions"].size()},
                  {"hosts", j["hosts"]}};
      for (const json& v : j["versions"]) {
        if (!j["current"].is_number() || v["version"] != j["current"]) continue;
        row["bytes"] = v["bytes"];
        for (const char* k : kInfoColumns) {
          if (v.contains(k)) row[k] = v[k];
        }
      }
      jobs.push_back(row);
    }
    out = {{"jobs", jobs}};
  }
  if (!unreachable.empty()) out["unreachable"] = unreachable;
  if (o.json) return WriteOutput("", out.dump() + "\n");
  std::string text;
  char line[512];
  if (!o.job.empty()) {
    std::snprintf(line, sizeof(line), "job %s: current version %s\n", o.job.c_str(),
                  Field(out, "current").c_str());
    text += line;
    std::snprintf(line, sizeof(line), "%8s  %-9s  %-7s  %10s  %7s  %-24s  %8s  %10s\n", "version",
                  "state", "current", "bytes", "tensors", "config", "step", "samples");
    text += line;
    for (const json& v : out["versions"]) {
      std::snprintf(line, sizeof(line), "%8s  %-9s  %-7s  %10s  %7s  %-24s  %8s  %10s\n",
                    Field(v, "version").c_str(), Field(v, "state").c_str(),
                    v["current"].get<bool>() ? "yes" : "",
                    HumanBytes(v["bytes"].get<int64_t>()).c_str(), Field(v, "tensors").c_str(),
                    Field(v, "config").c_str(), Field(v, "step").c_str(),
                    Field(v, "samples_consumed").c_str());
      text += line;
    }
  } else {
    std::snprintf(line, sizeof(line), "%-24s  %8s  %8s  %10s  %-24s  %8s\n", "job", "current",
                  "versions", "bytes", "config", "step");
    text += line;
    for (const json& j : out["jobs"]) {
      std::snprintf(line, sizeof(line), "%-24s  %8s  %8s  %10s  %-24s  %8s\n",
                    j["job"].get<std::string>().c_str(), Field(j, "current").c_str(),
                    Field(j, "versions").c_str(),
                    j.contains("bytes") ? HumanBytes(j["bytes"].get<int64_t>()).c_str() : "-",
                    Field(j, "config").c_str(), Field(j, "step").c_str());
      text += line;
    }
    if (out["jobs"].empty()) text += "(no jobs)\n";
  }
  for (const json& u : unreachable) {
    text += "host " + u["host"].get<std::string>() +
            " did not answer: " + u["error"].get<std::string>() + "\n";
  }
  return WriteOutput("", text);
}

Status Remove(const AdminOpts& o, bool has_version) {
  TP_ASSIGN_OR_RETURN(std::vector<Host> hosts, Connect(o));
  for (const Host& h : hosts) {
    if (!h.client) {
      return Unavailable(
          "host " + h.url + " did not answer (" + h.error +
          "): nothing removed, the job's state there "
          "would survive; retry when it is back or remove the host from the cluster file");
    }
  }
  // Check every host first so that an error (e.g. the current version) removes nothing.
  std::vector<Host*> holders;
  uint64_t bytes = 0;
  for (Host& h : hosts) {
    auto info = h.client->Job(o.job);
    if (!info.ok()) {
      if (info.status().code() == StatusCode::kNotFound) continue;
      // A quarantined job (unreadable files moved aside when the daemon started): rm
      // of the whole job forgets it.
      if (info.status().code() == StatusCode::kDataLoss && !has_version) {
        holders.push_back(&h);
        continue;
      }
      return info.status();
    }
    if (has_version) {
      bool there = false;
      for (const store::VersionInfo& v : info->versions) {
        if (v.version != o.version) continue;
        there = true;
        bytes += v.bytes;
      }
      if (!there) continue;
      if (info->current && *info->current == o.version) {
        return FailedPrecondition("version " + std::to_string(o.version) +
                                  " is the current version of job '" + o.job + "' on " + h.url +
                                  ": remove the whole job (without --version) or commit "
                                  "a newer version first");
      }
    } else {
      for (const store::VersionInfo& v : info->versions) bytes += v.bytes;
    }
    holders.push_back(&h);
  }
  const std::string what = has_version
                               ? "version " + std::to_string(o.version) + " of job '" + o.job + "'"
                               : "job '" + o.job + "'";
  if (holders.empty())
    return NotFound(what + " is not in the store" + (hosts.size() > 1 ? "s" : ""));
  for (Host* h : holders) {
    Status s = has_version ? h->client->DropVersion(o.job, o.version) : h->client->DeleteJob(o.job);
    if (!s.ok()) return s.WithContext("removing " + what + " from " + h->url);
  }
  if (o.json) {
    // "hosts": the URLs it was removed from, a list as in `store ls` and `load`/`save`.
    json urls = json::array();
    for (const Host* h : holders) urls.push_back(h->url);
    json out = {{"job", o.job}, {"hosts", urls}, {"bytes", bytes}};
    out["version"] = has_version ? json(o.version) : json(nullptr);
    return WriteOutput("", out.dump() + "\n");
  }
  char line[512];
  std::snprintf(line, sizeof(line), "removed %s (%s) from %zu host%s\n", what.c_str(),
                HumanBytes(static_cast<int64_t>(bytes)).c_str(), holders.size(),
                holders.size() == 1 ? "" : "s");
  return WriteOutput("", line);
}

void AddWhere(CLI::App* cmd, AdminOpts* o) {
  cmd->add_option("--url", o->url, std::string("Store URL (default ") + kDefaultUrl + ")");
  cmd->add_option("--cluster", o->cluster, "Cluster file (docs/transform.md): every host's daemon");
  AddTokenOptions(cmd, &o->token);
  cmd->add_flag("--json", o->json, "Print the result as JSON");
}

}  // namespace

void RegisterStoreAdmin(CLI::App& store_cmd, Context& ctx) {
  auto lo = std::make_shared<AdminOpts>();
  auto* ls = store_cmd.add_subcommand(
      "ls", "List the jobs of a store (or cluster), or one job's versions");
  ls->add_option("job", lo->job, "Job whose versions to list (default: all jobs)");
  AddWhere(ls, lo.get());
  ls->callback([lo, &ctx] { Finish(ctx, List(*lo)); });

  auto ro = std::make_shared<AdminOpts>();
  auto* rm = store_cmd.add_subcommand("rm", "Remove a job (all versions) or one old version of it");
  rm->add_option("job", ro->job, "Job to remove")->required();
  auto* version = rm->add_option("--version", ro->version,
                                 "Only this version (open, or committed but not the current one)");
  AddWhere(rm, ro.get());
  rm->callback([ro, version, &ctx] { Finish(ctx, Remove(*ro, version->count() > 0)); });
}

}  // namespace tenplex::cli
