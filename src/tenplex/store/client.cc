#include "tenplex/store/client.h"

#include <fcntl.h>
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tenplex/store/server.h"
#include "tenplex/util/file.h"
#include "tenplex/util/hash.h"
#include "tenplex/util/json_depth.h"
#include "tenplex/util/json_value.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::store {

using nlohmann::json;

namespace {

// Percent-encodes everything but unreserved characters and the separators the API
// uses in paths and queries.
std::string Encode(std::string_view s) {
  std::string out;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/' || c == ':' ||
        c == ',') {
      out += c;
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", u);
      out += buf;
    }
  }
  return out;
}

Result<json> ParseJson(const std::string& text) {
  TP_RETURN_IF_ERROR(CheckJsonDepth(text, "the store's reply"));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return DataLoss("store: the reply is not JSON: " + text.substr(0, 200));
  return j;
}

Result<TensorInfo> TensorFromJson(const json& j) {
  if (!j.is_object() || !j.contains("path") || !j.contains("dtype") || !j.contains("shape") ||
      !j.contains("bytes")) {
    return DataLoss("store: malformed tensor description " + j.dump().substr(0, 200));
  }
  TensorInfo t;
  t.path = j["path"].get<std::string>();
  TP_ASSIGN_OR_RETURN(t.dtype, ParseDType(j["dtype"].get<std::string>()));
  t.shape = j["shape"].get<Shape>();
  t.bytes = j["bytes"].get<uint64_t>();
  t.committed = JsonValueOr(j, "committed", false);
  t.file = JsonValueOr(j, "file", "");
  t.xxh64 = JsonValueOr(j, "xxh64", "");
  return t;
}

// The Status of an error reply {"error": ..., "code": ...} (one place for every call).
Status ReplyError(const std::string& url, const std::string& what, int status,
                  const std::string& body) {
  json j = CheckJsonDepth(body).ok() ? json::parse(body, nullptr, false) : json();
  const bool ok = j.is_object() && j.contains("error") && j["error"].is_string();
  std::string msg = ok ? j["error"].get<std::string>() : body.substr(0, 200);
  std::string code = j.is_object() && j.contains("code") && j["code"].is_string()
                         ? j["code"].get<std::string>()
                         : "";
  return Status(StatusCodeFromName(code, status),
                "store " + url + ": " + what.substr(0, 200) + ": " + msg);
}

Status Unreachable(const std::string& url, httplib::Error e) {
  return Unavailable("cannot reach the store at " + url + " (" + httplib::to_string(e) + ")");
}

}  // namespace

struct Client::Http {
  httplib::Client cli;
  Http(const std::string& host, int port) : cli(host, port) {}
};

Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const std::string& url,
                                                const ClientOptions& options) {
  TP_ASSIGN_OR_RETURN(HostPort hp, ParseUrl(url));
  std::unique_ptr<Client> c(new Client());
  c->url_ = "http://" + (hp.host.find(':') != std::string::npos ? "[" + hp.host + "]" : hp.host) +
            ":" + std::to_string(hp.port);
  c->http_ = std::make_unique<Http>(hp.host, hp.port);
  auto& cli = c->http_->cli;
  cli.set_keep_alive(true);
  cli.set_tcp_nodelay(true);
  cli.set_connection_timeout(10, 0);
  cli.set_read_timeout(options.timeout_s, 0);
  cli.set_write_timeout(options.timeout_s, 0);
  if (!options.token.empty()) cli.set_bearer_token_auth(options.token.c_str());
  if (!options.coordinator.empty()) TP_RETURN_IF_ERROR(c->SetCoordinator(options.coordinator));
  TP_ASSIGN_OR_RETURN(std::string text, c->Call("GET", "/v1/health"));
  TP_ASSIGN_OR_RETURN(json health, ParseJson(text));
  c->store_id_ = JsonValueOr(health, "store_id", "");
  c->host_id_ = JsonValueOr(health, "host_id", "");
  const std::string shm_dir = JsonValueOr(health, "shm_dir", "");
  if (options.use_shm && IsLoopbackHost(hp.host) && !shm_dir.empty() && !c->store_id_.empty()) {
    auto id = ReadFile(shm_dir + "/STORE_ID");
    c->local_ = id.ok() && *id == c->store_id_ + "\n";
    if (c->local_ && health.contains("pid") && health["pid"].is_number_integer()) {
      c->pid_ = health["pid"].get<int64_t>();
    }
  }
  return c;
}

Result<std::string> Client::Call(const std::string& method, const std::string& target,
                                 const std::string& body, const std::string& content_type,
                                 int* status) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& cli = http_->cli;
  auto send = [&] {
    return method == "GET"    ? cli.Get(target.c_str())
           : method == "POST" ? cli.Post(target.c_str(), body, content_type.c_str())
           : method == "PUT"  ? cli.Put(target.c_str(), body, content_type.c_str())
                              : cli.Delete(target.c_str());
  };
  // A GET whose connection was closed quickly without any reply is sent again on a new
  // connection (GETs change nothing): a daemon under a connection flood may evict a
  // connection whose request had not arrived whole yet, within its 2 s pending deadline
  // (http_guard.h). A read that timed out is not retried: a stopped daemon must cost one
  // timeout, not three.
  constexpr auto kQuickClose = std::chrono::seconds(3);
  auto t0 = std::chrono::steady_clock::now();
  httplib::Result r = send();
  for (int again = 0; !r && method == "GET" && r.error() == httplib::Error::Read && again < 2 &&
                      std::chrono::steady_clock::now() - t0 < kQuickClose;
       ++again) {
    t0 = std::chrono::steady_clock::now();
    r = send();
  }
  if (!r) return Unreachable(url_, r.error());
  if (status) *status = r->status;
  if (r->status >= 400) return ReplyError(url_, method + " " + target, r->status, r->body);
  return std::move(r->body);
}

Status Client::SetCoordinator(const std::string& holder) {
  TP_RETURN_IF_ERROR(JobLeases::CheckHolder(holder));
  std::lock_guard<std::mutex> lock(mu_);
  coordinator_ = holder;
  http_->cli.set_default_headers({{kCoordinatorHeader, holder}});
  return Status::Ok();
}

namespace {
Result<LeaseView> LeaseFromJson(const std::string& text) {
  TP_ASSIGN_OR_RETURN(json j, ParseJson(text));
  LeaseView l;
  if (j.contains("holder") && j["holder"].is_string()) l.holder = j["holder"].get<std::string>();
  l.remaining_ms = JsonValueOr(j, "remaining_ms", int64_t{0});
  return l;
}
}  // namespace

Result<LeaseView> Client::AcquireLease(const std::string& job, int64_t ttl_ms) {
  if (coordinator_.empty()) return FailedPrecondition("AcquireLease before SetCoordinator");
  TP_ASSIGN_OR_RETURN(
      std::string text,
      Call("POST", "/v1/jobs/" + Encode(job) + "/lease?ttl_ms=" + std::to_string(ttl_ms)));
  return LeaseFromJson(text);
}

Status Client::ReleaseLease(const std::string& job) {
  if (coordinator_.empty()) return FailedPrecondition("ReleaseLease before SetCoordinator");
  return Call("DELETE", "/v1/jobs/" + Encode(job) + "/lease").status();
}

Result<LeaseView> Client::Lease(const std::string& job) {
  TP_ASSIGN_OR_RETURN(std::string text, Call("GET", "/v1/jobs/" + Encode(job) + "/lease"));
  return LeaseFromJson(text);
}

Result<uint64_t> Client::BeginVersion(const std::string& job, std::optional<uint64_t> version,
                                      const std::string& info) {
  std::string target = "/v1/jobs/" + Encode(job) + "/versions";
  if (version) target += "?version=" + std::to_string(*version);
  TP_ASSIGN_OR_RETURN(std::string text, Call("POST", target, info));
  TP_ASSIGN_OR_RETURN(json j, ParseJson(text));
  return JsonValueOr(j, "version", uint64_t{0});
}

Status Client::SetVersionInfo(const std::string& job, uint64_t version, const std::string& info) {
  return Call("PUT", "/v1/jobs/" + Encode(job) + "/versions/" + std::to_string(version) + "/info",
              info)
      .status();
}

Status Client::Commit(const std::string& job, uint64_t version, bool keep_old) {
  return Call("POST", "/v1/jobs/" + Encode(job) + "/versions/" + std::to_string(version) +
                          "/commit" + (keep_old ? "?keep_old=1" : ""))
      .status();
}

Status Client::Prepare(const std::string& job, uint64_t version) {
  return Call("POST",
              "/v1/jobs/" + Encode(job) + "/versions/" + std::to_string(version) + "/prepare")
      .status();
}

Status Client::Abort(const std::string& job, uint64_t version) {
  return Call("POST", "/v1/jobs/" + Encode(job) + "/versions/" + std::to_string(version) + "/abort")
      .status();
}

namespace {
VersionInfo VersionFromJson(const json& j) {
  VersionInfo v;
  v.job = JsonValueOr(j, "job", "");
  v.version = JsonValueOr(j, "version", uint64_t{0});
  v.committed = JsonValueOr(j, "state", "") == "committed";
  v.prepared = JsonValueOr(j, "state", "") == "prepared";
  v.current = JsonValueOr(j, "current", false);
  v.bytes = JsonValueOr(j, "bytes", uint64_t{0});
  v.tensors = JsonValueOr(j, "tensors", std::size_t{0});
  v.info = j.contains("info") ? j["info"].dump() : "{}";
  if (j.contains("info_xxh64") && j["info_xxh64"].is_string()) {
    v.info = "";
    v.info_xxh64 = j["info_xxh64"].get<std::string>();
  }
  return v;
}
}  // namespace

Result<VersionInfo> Client::Version(const std::string& job, VersionRef version) {
  TP_ASSIGN_OR_RETURN(std::string text,
                      Call("GET", "/v1/jobs/" + Encode(job) + "/versions/" +
                                      (version ? std::to_string(*version) : "current")));
  TP_ASSIGN_OR_RETURN(json j, ParseJson(text));
  return VersionFromJson(j);
}

Result<std::vector<std::string>> Client::Jobs() {
  TP_ASSIGN_OR_RETURN(std::string text, Call("GET", "/v1/jobs"));
  TP_ASSIGN_OR_RETURN(json j, ParseJson(text));
  std::vector<std::string> out;
  if (!j.contains("jobs") || !j["jobs"].is_array())
    return DataLoss(url_ + "/v1/jobs: reply without a jobs list");
  for (const json& e : j["jobs"]) {
    if (e.is_object() && e.contains("job") && e["job"].is_string())
      out.push_back(e["job"].get<std::string>());
  }
  return out;
}

Result<JobInfo> Client::Job(const std::string& job) { return GetJob(job, false); }

Result<JobInfo> Client::JobDigests(const std::string& job) { return GetJob(job, true); }

Result<JobInfo> Client::GetJob(const std::string& job, bool digests) {
  TP_ASSIGN_OR_RETURN(std::string text,
                      Call("GET", "/v1/jobs/" + Encode(job) + (digests ? "?info=digest" : "")));
  TP_ASSIGN_OR_RETURN(json j, ParseJson(text));
  JobInfo info;
  info.job = JsonValueOr(j, "job", job);
  if (j.contains("current") && j["current"].is_number_unsigned())
    info.current = j["current"].get<uint64_t>();
  info.last = JsonValueOr(j, "last_version", uint64_t{0});
  info.incarnation = JsonValueOr(j, "incarnation", std::string());
  info.closed = JsonValueOr(j, "closed_transforms", uint64_t{0});
  if (j.contains("versions") && j["versions"].is_array()) {
    for (const json& v : j["versions"]) {
      if (v.is_object()) info.versions.push_back(VersionFromJson(v));
    }
  }
  return info;
}

Status Client::DeleteJob(const std::string& job) {
  return Call("DELETE", "/v1/jobs/" + Encode(job)).status();
}

Status Client::DropVersion(const std::string& job, uint64_t version) {
  return Call("DELETE", "/v1/jobs/" + Encode(job) + "/versions/" + std::to_string(version))
      .status();
}

Result<std::vector<TensorInfo>> Client::List(const std::string& prefix) {
  TP_ASSIGN_OR_RETURN(std::string text, Call("GET", "/v1/list/" + Encode(prefix) + "?detail=1"));
  TP_ASSIGN_OR_RETURN(json j, ParseJson(text));
  if (!j.is_array()) return DataLoss("store: /v1/list did not return a list");
  std::vector<TensorInfo> out;
  for (const json& e : j) {
    TP_ASSIGN_OR_RETURN(TensorInfo t, TensorFromJson(e));
    if (!local_) t.file.clear();
    out.push_back(std::move(t));
  }
  return out;
}

Result<std::pair<TensorInfo, std::string>> Client::Meta(const std::string& path) {
  TP_ASSIGN_OR_RETURN(std::string text, Call("GET", "/v1/meta/" + Encode(path)));
  TP_ASSIGN_OR_RETURN(json j, ParseJson(text));
  TP_ASSIGN_OR_RETURN(TensorInfo t, TensorFromJson(j));
  return std::make_pair(std::move(t), JsonValueOr(j, "xxh64", ""));
}

Status Client::Delete(const std::string& path) {
  return Call("DELETE", "/v1/tensors/" + Encode(path)).status();
}

Result<TensorInfo> Client::Put(const std::string& path, DType dtype, const Shape& shape,
                               const void* data, uint64_t size) {
  std::string target = "/v1/tensors/" + Encode(path) + "?dtype=" + std::string(DTypeName(dtype)) +
                       "&shape=" + ShapeToString(shape);
  std::lock_guard<std::mutex> lock(mu_);
  // Streamed from the caller's buffer (the buffer-taking overload copies it first).
  const char* bytes = static_cast<const char*>(data);
  auto r = http_->cli.Put(
      target.c_str(), static_cast<std::size_t>(size),
      [bytes, size](std::size_t offset, std::size_t length, httplib::DataSink& sink) {
        std::size_t n = std::min<std::size_t>(
            {length, std::size_t{4} << 20, static_cast<std::size_t>(size - offset)});
        return sink.write(bytes + offset, n);
      },
      "application/octet-stream");
  if (!r) return Unreachable(url_, r.error());
  if (r->status >= 400) return ReplyError(url_, "PUT " + path, r->status, r->body);
  TP_ASSIGN_OR_RETURN(json j, ParseJson(r->body));
  return TensorFromJson(j);
}

Result<std::string> Client::Get(const std::string& path, const std::string& range, DType* dtype,
                                Shape* shape) {
  std::string target =
      "/v1/tensors/" + Encode(path) + (range.empty() ? "" : "?range=" + Encode(range));
  std::lock_guard<std::mutex> lock(mu_);
  auto r = http_->cli.Get(target.c_str());
  if (!r) return Unreachable(url_, r.error());
  if (r->status >= 400) return ReplyError(url_, "GET " + path, r->status, r->body);
  if (dtype) {
    TP_ASSIGN_OR_RETURN(*dtype, ParseDType(r->get_header_value("X-Tensor-Dtype")));
  }
  if (shape) {
    auto dt = ParseDType(r->get_header_value("X-Tensor-Dtype"));
    TP_ASSIGN_OR_RETURN(
        *shape, ParseShape(r->get_header_value("X-Tensor-Shape"), dt.ok() ? *dt : DType::kU8));
  }
  return std::move(r->body);
}

Status Client::GetInto(const std::string& path, const std::string& range, void* dst,
                       uint64_t size) {
  std::string target =
      "/v1/tensors/" + Encode(path) + (range.empty() ? "" : "?range=" + Encode(range));
  uint64_t got = 0;
  bool overflow = false;
  std::string error_body;
  int status = 0;
  std::lock_guard<std::mutex> lock(mu_);
  auto r = http_->cli.Get(
      target.c_str(),
      [&](const httplib::Response& res) {
        status = res.status;
        return true;
      },
      [&](const char* data, std::size_t n) {
        if (status >= 400) {
          error_body.append(data, n);
          return true;
        }
        if (n > size - got) {
          overflow = true;
          return false;
        }
        std::memcpy(static_cast<char*>(dst) + got, data, n);
        got += n;
        return true;
      });
  if (overflow)
    return DataLoss("store: GET " + path + " returned more than the expected " +
                    std::to_string(size) + " bytes");
  if (!r) return Unreachable(url_, r.error());
  if (status >= 400) return ReplyError(url_, "GET " + path, status, error_body);
  if (got != size) {
    return DataLoss("store: GET " + path + " returned " + std::to_string(got) +
                    " bytes, expected " + std::to_string(size));
  }
  return Status::Ok();
}

Result<std::vector<TensorInfo>> Client::Allocate(const std::vector<Store::AllocRequest>& tensors,
                                                 bool zero_fill) {
  if (!local_)
    return FailedPrecondition("store " + url_ +
                              " is not on this machine: no shared-memory allocation");
  json req = json::array();
  for (const auto& t : tensors) {
    req.push_back(
        {{"path", t.path}, {"dtype", std::string(DTypeName(t.dtype))}, {"shape", t.shape}});
  }
  TP_ASSIGN_OR_RETURN(std::string text,
                      Call("POST", "/v1/alloc",
                           json{{"tensors", req}, {"fill", zero_fill ? "zero" : "none"}}.dump()));
  TP_ASSIGN_OR_RETURN(json j, ParseJson(text));
  if (JsonValueOr(j, "store_id", "") != store_id_)
    return Aborted("store " + url_ + " restarted; reconnect");
  std::vector<TensorInfo> out;
  for (const json& e : j["tensors"]) {
    TP_ASSIGN_OR_RETURN(TensorInfo t, TensorFromJson(e));
    out.push_back(std::move(t));
  }
  if (out.size() != tensors.size())
    return DataLoss("store: /v1/alloc returned the wrong number of tensors");
  return out;
}

Result<TensorInfo> Client::ShmInfo(const std::string& path) {
  if (!local_)
    return FailedPrecondition("store " + url_ + " is not on this machine: no shared-memory access");
  TP_ASSIGN_OR_RETURN(std::string text, Call("GET", "/v1/shm/" + Encode(path)));
  TP_ASSIGN_OR_RETURN(json j, ParseJson(text));
  return TensorFromJson(j);
}

Result<ShmMapping> Client::Map(const TensorInfo& info, bool writable, bool populate) {
  if (info.file.empty())
    return FailedPrecondition("tensor " + info.path + " has no shared-memory file here");
  if (writable && info.committed)
    return FailedPrecondition("tensor " + info.path + " is committed and immutable");
  return ShmMapping::Map(info.file, 0, info.bytes, writable, populate);
}

Status Client::WriteMany(const std::vector<Store::AllocRequest>& tensors,
                         const std::vector<const void*>& data) {
  if (data.size() != tensors.size())
    return InvalidArgument("WriteMany: one data pointer per tensor");
  if (!local_) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      TP_ASSIGN_OR_RETURN(int64_t vol,
                          CheckedVolume(tensors[i].shape, DTypeSize(tensors[i].dtype)));
      TP_RETURN_IF_ERROR(Put(tensors[i].path, tensors[i].dtype, tensors[i].shape, data[i],
                             static_cast<uint64_t>(vol) * DTypeSize(tensors[i].dtype))
                             .status());
    }
    return Status::Ok();
  }
  TP_ASSIGN_OR_RETURN(std::vector<TensorInfo> infos, Allocate(tensors, /*zero_fill=*/false));
  for (std::size_t i = 0; i < infos.size(); ++i) {
    TP_RETURN_IF_ERROR(PwriteAll(infos[i].file, 0, data[i], infos[i].bytes));
  }
  return Status::Ok();
}

Status Client::Write(const std::string& path, DType dtype, const Shape& shape, const void* data,
                     uint64_t size) {
  TP_ASSIGN_OR_RETURN(int64_t vol, CheckedVolume(shape, DTypeSize(dtype)));
  if (static_cast<uint64_t>(vol) * DTypeSize(dtype) != size) {
    return InvalidArgument("Write " + path + ": " + std::to_string(size) +
                           " bytes do not match dtype x shape");
  }
  return WriteMany({{path, dtype, shape}}, {data});
}

Status Client::Read(const TensorInfo& info, void* dst) {
  Status s = Status::Ok();
  if (local_ && !info.file.empty()) s = PreadAll(info.file, 0, dst, info.bytes);
  // Without shared memory, or the file was released meanwhile: the HTTP path reports it.
  if (!local_ || info.file.empty() || !s.ok())
    TP_RETURN_IF_ERROR(GetInto(info.path, "", dst, info.bytes));
  if (!info.xxh64.empty()) {
    const std::string sum = Xxh64Hex(dst, info.bytes);
    if (sum != info.xxh64) {
      return DataLoss("tensor " + info.path + " on " + url_ + " is corrupt: its bytes have xxh64 " +
                      sum + " but " + info.xxh64 +
                      " was recorded when its version was committed (its shared-memory file was "
                      "changed behind the store's back)");
    }
  }
  return Status::Ok();
}

}  // namespace tenplex::store
