#include "tenplex/cluster/control_protocol.h"

#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>

#include "tenplex/store/parse.h"
#include "tenplex/util/hash.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::cluster {

using nlohmann::json;

namespace {

Result<uint64_t> U64Field(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number_unsigned()) {
    return InvalidArgument(std::string("'") + key + "' must be a non-negative integer");
  }
  return j[key].get<uint64_t>();
}

Result<std::string> StringField(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_string())
    return InvalidArgument(std::string("'") + key + "' must be a string");
  return j[key].get<std::string>();
}

// A field of 16 lower-case hex digits (an xxh64 digest).
Result<std::string> DigestField(const json& j, const char* key) {
  TP_ASSIGN_OR_RETURN(std::string d, StringField(j, key));
  if (d.size() != 16 || d.find_first_not_of("0123456789abcdef") != std::string::npos)
    return InvalidArgument(std::string("'") + key + "' must be 16 lower-case hex digits");
  return d;
}

// A rank -> host map: integers in [lowest, hosts).
Result<std::vector<int>> HostMap(const json& j, const char* key, int hosts, int lowest) {
  if (!j.contains(key) || !j[key].is_array())
    return InvalidArgument(std::string("'") + key + "' must be an array");
  std::vector<int> out;
  for (const json& v : j[key]) {
    if (!v.is_number_integer() || v.get<int64_t>() < lowest || v.get<int64_t>() >= hosts) {
      return InvalidArgument(std::string("'") + key + "' entries must be host indexes in [" +
                             std::to_string(lowest) + ", " + std::to_string(hosts) + ")");
    }
    out.push_back(v.get<int>());
  }
  return out;
}

void Put(std::string& out, int64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); }

void PutBox(std::string& out, const Box& b) {
  Put(out, static_cast<int64_t>(b.rank()));
  for (const Interval& i : b.dims) {
    Put(out, i.begin);
    Put(out, i.end);
  }
}

// PlanDigest's canonical encoding, streamed into xxh64 (seed 0) an op at a time: the
// same digest as hashing the whole encoding at once, without holding it.
class DigestStream {
 public:
  DigestStream() : state_(XXH64_createState(), &XXH64_freeState) { XXH64_reset(state_.get(), 0); }
  void Bytes(const std::string& b) { XXH64_update(state_.get(), b.data(), b.size()); }
  void Count(std::size_t n) {
    buf_.clear();
    Put(buf_, static_cast<int64_t>(n));
    Bytes(buf_);
  }
  // `after` replaces op.after (a per-host plan's numbering).
  void Op(const plan::CopyOp& op, int64_t after) {
    buf_.clear();
    for (int64_t v : {int64_t{op.tensor}, int64_t{op.src_rank}, int64_t{op.src_tensor},
                      int64_t{op.dst_rank}, int64_t{op.dst_tensor}, int64_t{op.src_new}, after}) {
      Put(buf_, v);
    }
    PutBox(buf_, op.global);
    PutBox(buf_, op.src);
    PutBox(buf_, op.dst);
    Bytes(buf_);
  }
  std::string Hex() const { return HashHex(XXH64_digest(state_.get())); }

 private:
  std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> state_;
  std::string buf_;
};

// The encoding's head: the plan's tensor names.
std::string TensorNames(const plan::Plan& plan) {
  std::string out;
  Put(out, static_cast<int64_t>(plan.tensors.size()));
  for (const std::string& t : plan.tensors) {
    Put(out, static_cast<int64_t>(t.size()));
    out += t;
  }
  return out;
}

// "served": an array of [old rank, local tensor, reading host] of old ranks on `host`
// read by other hosts.
Result<std::vector<ServedTensor>> Served(const json& j, const std::vector<int>& from_hosts,
                                         int hosts, int host) {
  if (!j.contains("served") || !j["served"].is_array())
    return InvalidArgument("'served' must be an array");
  std::vector<ServedTensor> out;
  for (const json& e : j["served"]) {
    auto in = [&](std::size_t i, int64_t end) {
      return e[i].is_number_integer() && e[i].get<int64_t>() >= 0 && e[i].get<int64_t>() < end;
    };
    if (!e.is_array() || e.size() != 3 || !in(0, static_cast<int64_t>(from_hosts.size())) ||
        !in(1, int64_t{1} << 30) || !in(2, hosts) || from_hosts[e[0].get<int>()] != host ||
        e[2].get<int>() == host) {
      return InvalidArgument(
          "'served' entries must be [old rank on this host, local tensor, another host]");
    }
    out.push_back({e[0].get<int>(), e[1].get<int>(), e[2].get<int>()});
  }
  return out;
}

// "local_peers": null or an array with one entry (null or an object of strings) per host.
Result<std::vector<LocalPeer>> LocalPeers(const json& j, std::size_t hosts) {
  std::vector<LocalPeer> out;
  if (!j.contains("local_peers") || j["local_peers"].is_null()) return out;
  const json& a = j["local_peers"];
  if (!a.is_array() || a.size() != hosts)
    return InvalidArgument("'local_peers' must be an array with one entry per address");
  for (const json& e : a) {
    LocalPeer p;
    if (!e.is_null()) {
      if (!e.is_object()) return InvalidArgument("'local_peers' entries must be objects or null");
      for (const auto& [k, v] : e.items()) {
        std::string* field = k == "url"        ? &p.url
                             : k == "host_id"  ? &p.host_id
                             : k == "shm_dir"  ? &p.shm_dir
                             : k == "store_id" ? &p.store_id
                                               : nullptr;
        if (field == nullptr) return InvalidArgument("'local_peers': unknown field '" + k + "'");
        if (!v.is_string() || v.get<std::string>().empty() || v.get<std::string>().size() > 4096)
          return InvalidArgument("'local_peers' field '" + k + "' must be a non-empty string");
        *field = v.get<std::string>();
      }
      if (p.url.empty() || p.host_id.empty() || p.shm_dir.empty() || p.store_id.empty())
        return InvalidArgument("'local_peers' entries need url, host_id, shm_dir and store_id");
    }
    out.push_back(std::move(p));
  }
  return out;
}

// "incarnations": an array with one entry ("" or 16 lower-case hex digits) per host.
Result<std::vector<std::string>> Incarnations(const json& j, std::size_t hosts) {
  if (!j.contains("incarnations") || !j["incarnations"].is_array() ||
      j["incarnations"].size() != hosts)
    return InvalidArgument("'incarnations' must be an array with one entry per address");
  std::vector<std::string> out;
  for (const json& e : j["incarnations"]) {
    const std::string s = e.is_string() ? e.get<std::string>() : "?";
    if (!s.empty() &&
        (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos))
      return InvalidArgument("'incarnations' entries must be \"\" or 16 lower-case hex digits");
    out.push_back(s);
  }
  return out;
}

}  // namespace

std::string EncodePrepare(const PrepareRequest& r) {
  return PrepareForHost(EncodeSharedPrepare(r), r.host, {r.host_plan_digest, r.served});
}

std::string PrepareForHost(const std::string& shared, int host, const HostPart& part) {
  json served = json::array();
  for (const ServedTensor& s : part.served) served.push_back({s.rank, s.tensor, s.reader});
  // shared is a JSON object with at least "protocol": "{" + this host's fields + "," +
  // the rest.
  std::string out = "{\"host\":" + std::to_string(host) +
                    ",\"host_plan_digest\":" + json(part.plan_digest).dump() +
                    ",\"served\":" + served.dump() + ",";
  out.append(shared, 1, std::string::npos);
  return out;
}

std::string EncodeSharedPrepare(const PrepareRequest& r) {
  json info = json::parse(r.info, nullptr, false);
  json new_info = json::parse(r.new_info, nullptr, false);
  json j = json{{"protocol", kControlProtocolVersion},
                {"job", r.job},
                {"from_version", r.from_version},
                {"to_version", r.to_version},
                {"info", info},
                {"to_config", r.to_config.ToString()},
                {"new_info", new_info},
                {"addresses", r.addresses},
                {"from_hosts", r.from_hosts},
                {"to_hosts", r.to_hosts}};
  json incarnations = json::array();
  for (std::size_t h = 0; h < r.addresses.size(); ++h)
    incarnations.push_back(h < r.incarnations.size() ? r.incarnations[h] : std::string());
  j["incarnations"] = std::move(incarnations);
  if (!r.local_peers.empty()) {
    json peers = json::array();
    for (const LocalPeer& p : r.local_peers) {
      peers.push_back(p.empty() ? json(nullptr)
                                : json{{"url", p.url},
                                       {"host_id", p.host_id},
                                       {"shm_dir", p.shm_dir},
                                       {"store_id", p.store_id}});
    }
    j["local_peers"] = std::move(peers);
  }
  return j.dump();
}

Result<DecodedPrepare> DecodePrepare(std::string_view body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("prepare: request body is not a JSON object");
  if (!j.contains("protocol") || !j["protocol"].is_number_unsigned()) {
    return FailedPrecondition(
        "prepare: the request has no control protocol version (this daemon speaks version " +
        std::to_string(kControlProtocolVersion) + "): a coordinator of another build?");
  }
  if (j["protocol"].get<uint64_t>() != kControlProtocolVersion) {
    return FailedPrecondition(
        "prepare: control protocol version " + std::to_string(j["protocol"].get<uint64_t>()) +
        " but this daemon speaks version " + std::to_string(kControlProtocolVersion));
  }
  static const char* kKeys[] = {
      "protocol", "job",         "from_version", "to_version",       "host",
      "info",     "to_config",   "new_info",     "addresses",        "from_hosts",
      "to_hosts", "local_peers", "incarnations", "host_plan_digest", "served"};
  for (const auto& [k, v] : j.items()) {
    bool known = false;
    for (const char* key : kKeys) known = known || k == key;
    if (!known) return InvalidArgument("prepare: unknown field '" + k + "'");
  }
  DecodedPrepare d;
  PrepareRequest& r = d.request;
  TP_ASSIGN_OR_RETURN(r.job, StringField(j, "job"));
  TP_RETURN_IF_ERROR(store::CheckJobName(r.job));
  TP_ASSIGN_OR_RETURN(r.from_version, U64Field(j, "from_version"));
  TP_ASSIGN_OR_RETURN(r.to_version, U64Field(j, "to_version"));
  if (r.to_version <= r.from_version)
    return InvalidArgument("'to_version' must be greater than 'from_version'");
  if (!j.contains("addresses") || !j["addresses"].is_array() || j["addresses"].empty()) {
    return InvalidArgument("'addresses' must be a non-empty array of transport addresses");
  }
  for (const json& a : j["addresses"]) {
    if (!a.is_string()) return InvalidArgument("'addresses' entries must be strings");
    r.addresses.push_back(a.get<std::string>());
  }
  const int hosts = static_cast<int>(r.addresses.size());
  TP_ASSIGN_OR_RETURN(uint64_t host, U64Field(j, "host"));
  if (host >= r.addresses.size()) return InvalidArgument("'host' is not an index into 'addresses'");
  r.host = static_cast<int>(host);
  if (!j.contains("info") || !j["info"].is_object())
    return InvalidArgument("'info' must be an object");
  r.info = j["info"].dump();
  Result<StateInfo> from = StateInfo::Parse(r.info);
  if (!from.ok())
    return InvalidArgument("'info' must be the old version's info: " + from.status().message());
  d.from = std::move(from).value();
  TP_ASSIGN_OR_RETURN(std::string to, StringField(j, "to_config"));
  Result<ParallelConfig> to_config = ParseConfig(to);
  if (!to_config.ok()) return to_config.status().WithContext("'to_config'");
  r.to_config = *to_config;
  if (!j.contains("new_info") || !j["new_info"].is_object())
    return InvalidArgument("'new_info' must be an object");
  r.new_info = j["new_info"].dump();
  TP_ASSIGN_OR_RETURN(r.from_hosts, HostMap(j, "from_hosts", hosts, plan::kLostHost));
  TP_ASSIGN_OR_RETURN(r.to_hosts, HostMap(j, "to_hosts", hosts, 0));
  if (static_cast<int>(r.from_hosts.size()) != d.from.config().world_size() ||
      static_cast<int>(r.to_hosts.size()) != r.to_config.world_size()) {
    return InvalidArgument(
        "'from_hosts' and 'to_hosts' must have one entry per old and new rank (" +
        std::to_string(d.from.config().world_size()) + " and " +
        std::to_string(r.to_config.world_size()) + ")");
  }
  for (int h : r.to_hosts) {
    if (r.addresses[h].empty()) {
      return InvalidArgument("a new rank is placed on host " + std::to_string(h) +
                             ", which has no address");
    }
  }
  TP_ASSIGN_OR_RETURN(r.local_peers, LocalPeers(j, r.addresses.size()));
  TP_ASSIGN_OR_RETURN(r.incarnations, Incarnations(j, r.addresses.size()));
  TP_ASSIGN_OR_RETURN(r.host_plan_digest, DigestField(j, "host_plan_digest"));
  TP_ASSIGN_OR_RETURN(r.served, Served(j, r.from_hosts, hosts, r.host));
  return d;
}

std::string PlanDigest(const plan::Plan& plan) {
  DigestStream d;
  d.Bytes(TensorNames(plan));
  d.Count(plan.ops.size());
  for (const plan::CopyOp& op : plan.ops) d.Op(op, op.after);
  d.Count(plan.kept.size());
  for (const plan::CopyOp& op : plan.kept) d.Op(op, op.after);
  return d.Hex();
}

namespace {

// HostPlanParts for the hosts [lo, hi): their digests (ops and kept regions whose
// destination is there) and served lists (ops whose source is there). Each call reads
// the whole plan and writes only its hosts' parts and `local` entries.
void PartsOfHosts(const plan::Plan& plan, const std::vector<int>& from_hosts,
                  const std::vector<int>& to_hosts, const std::string& names, int lo, int hi,
                  std::vector<int32_t>& local, std::vector<HostPart>& parts) {
  const auto mine = [&](int h) { return h >= lo && h < hi; };
  std::vector<int64_t> ops(hi - lo, 0), kept(hi - lo, 0);
  for (const plan::CopyOp& op : plan.ops) {
    if (const int h = to_hosts[op.dst_rank]; mine(h)) ++ops[h - lo];
  }
  for (const plan::CopyOp& op : plan.kept) {
    if (const int h = to_hosts[op.dst_rank]; mine(h)) ++kept[h - lo];
  }
  std::vector<DigestStream> digests(hi - lo);
  for (int h = lo; h < hi; ++h) {
    digests[h - lo].Bytes(names);
    digests[h - lo].Count(ops[h - lo]);
  }
  // local[i]: op i's index among its host's ops, which a per-host plan's `after` uses
  // (an op reading the new layout reads an op of its own host).
  std::vector<int32_t> next(hi - lo, 0);
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    const plan::CopyOp& op = plan.ops[i];
    const int h = to_hosts[op.dst_rank];
    const int src = op.src_new ? h : from_hosts[op.src_rank];
    if (mine(h)) {
      local[i] = next[h - lo]++;
      digests[h - lo].Op(op, op.src_new ? int64_t{local[op.after]} : op.after);
    }
    if (src != h && src != plan::kLostHost && mine(src))
      parts[src].served.push_back({op.src_rank, op.src_tensor, h});
  }
  for (int h = lo; h < hi; ++h) digests[h - lo].Count(kept[h - lo]);
  for (const plan::CopyOp& op : plan.kept) {
    if (const int h = to_hosts[op.dst_rank]; mine(h)) digests[h - lo].Op(op, op.after);
  }
  for (int h = lo; h < hi; ++h) {
    parts[h].plan_digest = digests[h - lo].Hex();
    std::vector<ServedTensor>& s = parts[h].served;
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
  }
}

}  // namespace

std::vector<HostPart> HostPlanParts(const plan::Plan& plan, const std::vector<int>& from_hosts,
                                    const std::vector<int>& to_hosts, std::size_t hosts,
                                    int threads) {
  if (threads <= 0) threads = ThreadsFor(plan.ops.size());
  threads = static_cast<int>(std::min<std::size_t>(threads, std::max<std::size_t>(hosts, 1)));
  const std::string names = TensorNames(plan);
  std::vector<HostPart> parts(hosts);
  std::vector<int32_t> local(plan.ops.size());
  const auto n = static_cast<int64_t>(hosts);
  ForEachConcurrently(threads, threads, [&](std::size_t w) {
    const auto k = static_cast<int64_t>(w);
    PartsOfHosts(plan, from_hosts, to_hosts, names, static_cast<int>(n * k / threads),
                 static_cast<int>(n * (k + 1) / threads), local, parts);
  });
  return parts;
}

}  // namespace tenplex::cluster
