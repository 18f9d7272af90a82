#include "tenplex/cluster/control_replies.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "tenplex/util/json_depth.h"

namespace tenplex::cluster {

using nlohmann::json;

namespace {

// Bounds of what a real reply can carry; anything past them is a broken or hostile
// daemon's, refused rather than summed into a report.
constexpr int64_t kMaxCount = int64_t{1} << 62;  // bytes, ops, tensors
constexpr int kMaxIndex = 1 << 30;               // hosts, peers
constexpr double kMaxSeconds = 1e9;              // ~31 years
constexpr double kMaxGbps = 1e6;                 // GB/s
constexpr std::size_t kMaxText = 4096;           // an address, a directory, an id

// The two directions of one reply's field list (the *Fields templates below, which name
// each field once with its kind): Writer puts each field into a JSON object; Reader
// checks each present field's type and range and stores it, keeping the first failure
// (status()) and doing nothing after it. Absent fields keep the struct's default.
class Writer {
 public:
  void Count(const char* key, int64_t v) { j_[key] = v; }
  void Unsigned(const char* key, uint64_t v) { j_[key] = v; }
  void Index(const char* key, int v) { j_[key] = v; }
  void Seconds(const char* key, double v) { j_[key] = v; }
  void Gbps(const char* key, double v) { j_[key] = v; }
  void Text(const char* key, const std::string& v) { j_[key] = v; }
  json& object() { return j_; }

 private:
  json j_ = json::object();
};

class Reader {
 public:
  Reader(const json& j, std::string reply) : j_(j), reply_(std::move(reply)) {}

  void Count(const char* key, int64_t& out) {
    const json* v = Find(key);
    if (v == nullptr) return;
    if (!v->is_number_integer() || v->get<int64_t>() < 0 ||
        (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(kMaxCount))) {
      return Fail(key, "a non-negative integer below 2^62");
    }
    out = v->get<int64_t>();
  }
  void Unsigned(const char* key, uint64_t& out) {
    const json* v = Find(key);
    if (v == nullptr) return;
    if (!v->is_number_unsigned()) return Fail(key, "a non-negative integer below 2^64");
    out = v->get<uint64_t>();
  }
  void Index(const char* key, int& out) {
    const json* v = Find(key);
    if (v == nullptr) return;
    if (!v->is_number_unsigned() || v->get<uint64_t>() > static_cast<uint64_t>(kMaxIndex))
      return Fail(key, "a non-negative integer up to 2^30");
    out = static_cast<int>(v->get<uint64_t>());
  }
  void Seconds(const char* key, double& out) { Real(key, kMaxSeconds, out); }
  void Gbps(const char* key, double& out) { Real(key, kMaxGbps, out); }
  void Text(const char* key, std::string& out) {
    const json* v = Find(key);
    if (v == nullptr) return;
    if (!v->is_string() || v->get_ref<const std::string&>().size() > kMaxText)
      return Fail(key, "a string of at most 4096 bytes");
    out = v->get<std::string>();
  }
  // The object `key`: null when absent, null or on failure (another type is one).
  const json* Object(const char* key) {
    const json* v = Find(key);
    if (v == nullptr || v->is_null()) return nullptr;
    if (!v->is_object()) {
      Fail(key, "an object");
      return nullptr;
    }
    return v;
  }
  const Status& status() const { return status_; }

 private:
  const json* Find(const char* key) const {
    if (!status_.ok()) return nullptr;
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  void Real(const char* key, double max, double& out) {
    const json* v = Find(key);
    if (v == nullptr) return;
    const double d = v->is_number() ? v->get<double>() : -1;
    if (!v->is_number() || !std::isfinite(d) || d < 0 || d > max) {
      return Fail(key, "a finite non-negative number up to " + json(max).dump());
    }
    out = d;
  }
  void Fail(const char* key, const std::string& want) {
    status_ = InvalidArgument(reply_ + ": \"" + key + "\" must be " + want);
  }

  const json& j_;
  std::string reply_;
  Status status_;
};

// The reply's object, or InvalidArgument naming the reply.
Result<json> ReplyObject(std::string_view body, const char* reply) {
  TP_RETURN_IF_ERROR(CheckJsonDepth(body, reply));
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument(std::string(reply) + ": not a JSON object");
  return j;
}

// Each reply's fields, once: R is the reply or a const one, V a Writer or a Reader.
template <class V, class R>
void PrepareFields(V& v, R& r) {
  v.Unsigned("version", r.version);
  v.Index("host", r.host);
  v.Text("incarnation", r.incarnation);
  v.Count("bytes_kept", r.bytes_kept);
  v.Count("bytes_linked", r.bytes_linked);
  v.Count("bytes_local", r.bytes_local);
  v.Count("bytes_fetched", r.bytes_fetched);
  v.Count("bytes_fetched_shm", r.bytes_fetched_shm);
  v.Count("remote_ops", r.remote_ops);
  v.Index("peers", r.peers);
  v.Index("peers_shm", r.peers_shm);
  v.Seconds("plan_seconds", r.plan_seconds);
  v.Seconds("warm_seconds", r.warm_seconds);
  v.Seconds("alloc_seconds", r.alloc_seconds);
  v.Seconds("local_seconds", r.local_seconds);
  v.Seconds("fetch_seconds", r.fetch_seconds);
  v.Seconds("landed_seconds", r.landed_seconds);
  v.Seconds("seal_seconds", r.seal_seconds);
  v.Seconds("seconds", r.seconds);
}

template <class V, class R>
void PresizeFields(V& v, R& r) {
  v.Index("host", r.host);
  v.Count("tensors", r.tensors);
  v.Count("wanted_bytes", r.wanted_bytes);
  v.Count("poolable_bytes", r.poolable_bytes);
  v.Count("pooled_bytes", r.pooled_bytes);
  v.Unsigned("pool_limit", r.pool_limit);
  v.Seconds("seconds", r.seconds);
}

template <class V, class R>
void WarmFields(V& v, R& r) {
  v.Index("host", r.host);
  v.Count("tensors", r.tensors);
  v.Seconds("seconds", r.seconds);
}

template <class V, class R>
void ProbeFields(V& v, R& r) {
  v.Unsigned("bytes", r.bytes);
  v.Gbps("fetch_gbps", r.fetch_gbps);
  v.Gbps("fetch_large_gbps", r.fetch_large_gbps);
  v.Gbps("fetch_into_shm_gbps", r.fetch_into_shm_gbps);
  v.Gbps("fetch_into_shm_first_gbps", r.fetch_into_shm_first_gbps);
  v.Gbps("fresh_write_gbps", r.fresh_write_gbps);
  v.Gbps("memcpy_gbps", r.memcpy_gbps);
}

template <class V, class R>
void LocalFields(V& v, R& r) {
  v.Text("host_id", r.host_id);
  v.Text("shm_dir", r.shm_dir);
  v.Text("store_id", r.store_id);
}

template <class V, class R>
void FileFields(V& v, R& r) {
  v.Text("tensor", r.tensor);
  v.Text("file", r.file);
  v.Unsigned("bytes", r.bytes);
  v.Unsigned("dev", r.dev);
  v.Unsigned("ino", r.ino);
}

template <class T, class Fields>
std::string Encode(const T& reply, Fields fields) {
  Writer w;
  fields(w, reply);
  return w.object().dump();
}

template <class T, class Fields>
Result<T> Decode(std::string_view body, const char* what, Fields fields) {
  TP_ASSIGN_OR_RETURN(json j, ReplyObject(body, what));
  T reply;
  Reader r(j, what);
  fields(r, reply);
  TP_RETURN_IF_ERROR(r.status());
  return reply;
}

}  // namespace

std::string EncodePrepareReply(const PrepareReply& r) {
  return Encode(r, [](auto& v, auto& x) { PrepareFields(v, x); });
}
Result<PrepareReply> DecodePrepareReply(std::string_view body) {
  return Decode<PrepareReply>(body, "prepare reply", [](auto& v, auto& x) { PrepareFields(v, x); });
}

std::string EncodePresizeReply(const PresizeReply& r) {
  return Encode(r, [](auto& v, auto& x) { PresizeFields(v, x); });
}
Result<PresizeReply> DecodePresizeReply(std::string_view body) {
  return Decode<PresizeReply>(body, "presize reply", [](auto& v, auto& x) { PresizeFields(v, x); });
}

std::string EncodeWarmReply(const WarmReply& r) {
  return Encode(r, [](auto& v, auto& x) { WarmFields(v, x); });
}
Result<WarmReply> DecodeWarmReply(std::string_view body) {
  return Decode<WarmReply>(body, "warm reply", [](auto& v, auto& x) { WarmFields(v, x); });
}

std::string EncodeProbeReply(const ProbeReply& r) {
  return Encode(r, [](auto& v, auto& x) { ProbeFields(v, x); });
}
Result<ProbeReply> DecodeProbeReply(std::string_view body) {
  return Decode<ProbeReply>(body, "probe reply", [](auto& v, auto& x) { ProbeFields(v, x); });
}

std::string EncodeAddressReply(const AddressReply& r) {
  Writer w;
  w.Text("address", r.address);
  w.Text("kind", r.kind);
  if (!r.incarnation.empty()) w.Text("incarnation", r.incarnation);
  if (r.local) {
    Writer l;
    LocalFields(l, *r.local);
    w.object()["local"] = std::move(l.object());
  }
  return w.object().dump();
}

Result<AddressReply> DecodeAddressReply(std::string_view body) {
  TP_ASSIGN_OR_RETURN(json j, ReplyObject(body, "address reply"));
  if (!j.contains("address")) return InvalidArgument("address reply: no \"address\"");
  AddressReply reply;
  Reader r(j, "address reply");
  r.Text("address", reply.address);
  r.Text("kind", reply.kind);
  r.Text("incarnation", reply.incarnation);
  if (const json* local = r.Object("local")) {
    Reader lr(*local, "address reply \"local\"");
    LocalFields(lr, reply.local.emplace());
    TP_RETURN_IF_ERROR(lr.status());
  }
  TP_RETURN_IF_ERROR(r.status());
  return reply;
}

std::string EncodeLocateReply(const LocateReply& r) {
  json files = json::array();
  for (const LocateReply::File& f : r.files) {
    Writer w;
    FileFields(w, f);
    files.push_back(std::move(w.object()));
  }
  return json{{"files", std::move(files)}}.dump();
}

Result<LocateReply> DecodeLocateReply(std::string_view body) {
  TP_ASSIGN_OR_RETURN(json j, ReplyObject(body, "locate reply"));
  auto it = j.find("files");
  if (it == j.end() || !it->is_array() || it->size() > LocateReply::kMaxLocated) {
    return InvalidArgument("locate reply: \"files\" must be an array of at most " +
                           std::to_string(LocateReply::kMaxLocated) + " objects");
  }
  LocateReply reply;
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string what = "locate reply \"files\"[" + std::to_string(i) + "]";
    if (!e.is_object()) return InvalidArgument(what + ": not an object");
    Reader r(e, what);
    FileFields(r, reply.files.emplace_back());
    TP_RETURN_IF_ERROR(r.status());
  }
  return reply;
}

}  // namespace tenplex::cluster
