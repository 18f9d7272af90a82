#include "tenplex/store/server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "tenplex/store/mapping.h"
#include "tenplex/store/server_internal.h"

namespace tenplex::store {

namespace {

// SO_REUSEADDR only, so that a restarted daemon binds while its old connections sit in
// TIME_WAIT. cpp-httplib's default sets SO_REUSEPORT, with which a second daemon binds
// the same port and the kernel splits the connections between the two stores (issue 34
// finding 2).
void ExclusivePortOptions(socket_t sock) {
  int yes = 1;
  ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

// Why host:port cannot be bound (cpp-httplib only says that it failed): the errno of a
// bind with the server's own options, EADDRINUSE first.
int BindError(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0)
    return EADDRNOTAVAIL;
  int err = EADDRNOTAVAIL;
  for (addrinfo* a = found; a != nullptr && err != EADDRINUSE; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    ExclusivePortOptions(fd);
    err = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return err;
}

// Compares every byte of the expected value whatever the length of the given one, so
// the time taken tells nothing about the token (not even its length).
bool ConstantTimeEqual(const std::string& given, const std::string& expected) {
  unsigned char d = given.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    d |= static_cast<unsigned char>(g ^ static_cast<unsigned char>(expected[i]));
  }
  return d == 0;
}

bool IsUtf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : -1;
    if (n < 0 || i + static_cast<std::size_t>(n) >= s.size() + (n == 0 ? 1 : 0)) return false;
    uint32_t cp = n == 0 ? c : n == 1 ? (c & 0x1f) : n == 2 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k <= n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) ||
        (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;  // overlong, out of range or a surrogate
    }
    i += static_cast<std::size_t>(n) + 1;
  }
  return true;
}

// A request refused before its body was read: the body must not be parsed as the next
// request, so the connection closes after the reply.
httplib::Server::HandlerResponse Refuse(httplib::Response& res, int status,
                                        const std::string& message, std::string_view code) {
  res.set_header("Connection", "close");
  GuardedServer::CloseAfterReply();
  SendError(res, status, message, code);
  return httplib::Server::HandlerResponse::Handled;
}

// Refuses, before routing and before the body is read, a request with too many header
// bytes, without the bearer token, with ambiguous framing or a target not UTF-8.
httplib::Server::HandlerResponse PreRoute(const ServerOptions& options, const httplib::Request& req,
                                          httplib::Response& res) {
  std::size_t header_bytes = 0;
  for (const auto& [k, v] : req.headers) header_bytes += k.size() + v.size() + 4;
  if (header_bytes > options.max_header_bytes) {
    return Refuse(res, 431,
                  "request headers total " + std::to_string(header_bytes) +
                      " bytes, more than the limit of " + std::to_string(options.max_header_bytes),
                  "INVALID_ARGUMENT");
  }
  if (!options.token.empty()) {
    const std::string auth = req.get_header_value("Authorization");
    if (!ConstantTimeEqual(auth, "Bearer " + options.token)) {
      res.set_header("WWW-Authenticate", "Bearer");
      return Refuse(
          res, 401,
          auth.empty() ? "this store needs 'Authorization: Bearer <token>'" : "wrong bearer token",
          "UNAUTHENTICATED");
    }
  }
  GuardedServer::MarkAuthenticated();  // its connection counts as a known client's now
  // Framing a proxy could read differently (request smuggling): refused.
  if (req.get_header_value_count("Content-Length") > 1) {
    return Refuse(res, 400, "the request has more than one Content-Length header",
                  "INVALID_ARGUMENT");
  }
  if (req.has_header("Content-Length") && req.has_header("Transfer-Encoding")) {
    return Refuse(res, 400, "the request has both Content-Length and Transfer-Encoding",
                  "INVALID_ARGUMENT");
  }
  if (!IsUtf8(req.target)) {
    return Refuse(res, 400, "the request target is not UTF-8", "INVALID_ARGUMENT");
  }
  return httplib::Server::HandlerResponse::Unhandled;
}

// Errors cpp-httplib produces itself (malformed requests, 413 bodies, 414 targets,
// oversized header lines) get a JSON body too.
httplib::Server::HandlerResponse HttpErrorReply(const httplib::Request& req,
                                                httplib::Response& res) {
  if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
  const bool no_length = (req.method == "POST" || req.method == "PUT" || req.method == "PATCH") &&
                         !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding");
  std::string what =
      res.status == 413   ? "request body is larger than the store's limit (--max-body)"
      : res.status == 414 ? "request target is too long"
      : res.status == 431 ? "request headers are too large"
      : no_length ? req.method + " needs a Content-Length header (send an empty body: curl -d '')"
      : res.status == 400 ? "malformed HTTP request (a header line longer than 8 KiB?)"
                          : "HTTP error " + std::to_string(res.status);
  SendJson(res, res.status, {{"error", what}, {"code", "INVALID_ARGUMENT"}});
  // What is left of a request cpp-httplib could not parse must not be read as the
  // next request on this connection.
  GuardedServer::CloseAfterReply();
  return httplib::Server::HandlerResponse::Handled;
}

// A handler's exception: 500 with its message.
void InternalErrorReply(const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
  std::string what = "internal error";
  try {
    if (ep) std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    what = std::string("internal error: ") + e.what();
  } catch (...) {
  }
  SendJson(res, 500, {{"error", what}, {"code", "INTERNAL"}});
}

}  // namespace

void SendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  if (status >= 400 && !res.has_header("Connection")) {
    // A refused request's body may be unread (or only partly read): it must not be
    // parsed as the next request, so the connection closes after an error reply.
    res.set_header("Connection", "close");
    GuardedServer::CloseAfterReply();
  }
  // Replaced, not thrown: an error message may quote a target that is not UTF-8.
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
                  "application/json");
}

void SendError(httplib::Response& res, const Status& s) {
  SendJson(res, HttpStatusFor(s.code()),
           {{"error", s.message()}, {"code", std::string(StatusCodeName(s.code()))}});
}

void SendError(httplib::Response& res, int status, const std::string& message,
               std::string_view code) {
  SendJson(res, status, {{"error", message}, {"code", std::string(code)}});
}

json TensorJson(const TensorInfo& t, bool with_file) {
  json j = {{"path", t.path},
            {"dtype", std::string(DTypeName(t.dtype))},
            {"shape", t.shape},
            {"bytes", t.bytes},
            {"committed", t.committed}};
  if (!t.xxh64.empty()) j["xxh64"] = t.xxh64;
  if (with_file) {
    j["file"] = t.file;
    j["offset"] = 0;
    // A tensor of an open version linked from a committed one shares its file: never
    // writable (ShmMapping::Map refuses to map it so).
    const bool linked = !t.committed && IsSharedFile(t.file);
    j["writable"] = !t.committed && !linked;
    if (linked) j["linked"] = true;
  }
  return j;
}

json VersionJson(const VersionInfo& v, bool with_info) {
  json j = {{"job", v.job},
            {"version", v.version},
            {"state", v.committed ? "committed" : (v.prepared ? "prepared" : "open")},
            {"current", v.current},
            {"bytes", v.bytes},
            {"tensors", v.tensors}};
  if (with_info) j["info"] = json::parse(v.info, nullptr, false);
  return j;
}

// The value of a query parameter or a header (X-Tensor-Dtype); they must agree when
// both are given.
Result<std::string> ParamOrHeader(const Target& t, const httplib::Request& req,
                                  const std::string& key, const std::string& header) {
  auto q = t.query.find(key);
  const bool has_header = req.has_header(header.c_str());
  if (q != t.query.end() && has_header && req.get_header_value(header.c_str()) != q->second) {
    return InvalidArgument("?" + key + "=" + q->second + " and header " + header + " disagree");
  }
  if (q != t.query.end()) return q->second;
  if (has_header) return req.get_header_value(header.c_str());
  return NotFound("");
}

Result<bool> FlagParam(const Target& t, const std::string& key) {
  auto it = t.query.find(key);
  if (it == t.query.end() || it->second == "0" || it->second == "false") return false;
  if (it->second.empty() || it->second == "1" || it->second == "true") return true;
  return InvalidArgument("?" + key + " must be 0 or 1, not '" + it->second + "'");
}

Result<uint64_t> VersionNumber(std::string_view s) {
  TP_ASSIGN_OR_RETURN(VersionRef v, ParseVersion(s));
  if (!v) return InvalidArgument("this endpoint needs a version number, not 'current'");
  return *v;
}

namespace {

// GET /v1/health: liveness, quarantined jobs and the store's identity and memory.
Status Health(Store& store, const Target& t, httplib::Response& res) {
  TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
  json quarantined = json::array();
  for (const Store::Quarantined& q : store.QuarantinedJobs())
    quarantined.push_back({{"job", q.job}, {"reason", q.reason}, {"path", q.path}});
  SendJson(res, 200,
           {{"ok", true},
            {"quarantined", std::move(quarantined)},
            {"store_id", store.id()},
            {"host_id", store.host_id()},
            {"shm_dir", store.shm_dir()},
            {"pid", static_cast<int64_t>(::getpid())},
            {"used_bytes", store.used_bytes()},
            {"pool_bytes", store.pool_bytes()},
            {"memory_limit", store.memory_limit()}});
  return Status::Ok();
}

// GET /v1/meta/{path}: a tensor's metadata and checksum.
Status TensorMeta(Store& store, const Target& t, const std::string& path, httplib::Response& res) {
  TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
  TP_ASSIGN_OR_RETURN(TensorInfo info, store.Meta(path));
  TP_ASSIGN_OR_RETURN(std::string sum, store.Checksum(info.path));
  json j = TensorJson(info, false);
  j["xxh64"] = sum;
  SendJson(res, 200, j);
  return Status::Ok();
}

// GET /v1/list[/{prefix}][?detail]: the tensors' paths, or their metadata (with the
// shared-memory file for a local client).
Status ListTensors(Store& store, const httplib::Request& req, const Target& t,
                   httplib::Response& res) {
  const std::string& p = t.path;
  TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {"detail"}));
  TP_ASSIGN_OR_RETURN(bool detail, FlagParam(t, "detail"));
  TP_ASSIGN_OR_RETURN(std::vector<TensorInfo> list, store.List(p.size() > 9 ? p.substr(9) : ""));
  const bool local = IsLoopbackHost(req.remote_addr);
  json out = json::array();
  for (const TensorInfo& info : list) {
    if (detail) {
      out.push_back(TensorJson(info, local));
    } else {
      out.push_back(info.path);
    }
  }
  SendJson(res, 200, out);
  return Status::Ok();
}

// GET /v1/shm/{path} (local clients): a tensor's shared-memory file.
Status ShmMeta(Store& store, const std::string& path, httplib::Response& res) {
  TP_ASSIGN_OR_RETURN(TensorInfo info, store.Meta(path));
  json j = TensorJson(info, true);
  j["store_id"] = store.id();
  SendJson(res, 200, j);
  return Status::Ok();
}

}  // namespace

int HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kAlreadyExists:
      return 409;
    case StatusCode::kOutOfRange:
      return 416;
    case StatusCode::kFailedPrecondition:
      return 409;
    case StatusCode::kResourceExhausted:
      return 507;
    case StatusCode::kDataLoss:
      return 500;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kUnauthenticated:
      return 401;
    case StatusCode::kAborted:
      return 409;
    case StatusCode::kInternal:
      return 500;
    case StatusCode::kUnimplemented:
      return 501;
  }
  return 500;
}

StatusCode StatusCodeFromName(std::string_view name, int http_status) {
  for (int c = 0; c <= static_cast<int>(StatusCode::kUnimplemented); ++c) {
    if (StatusCodeName(static_cast<StatusCode>(c)) == name) return static_cast<StatusCode>(c);
  }
  switch (http_status) {
    case 400:
      return StatusCode::kInvalidArgument;
    case 401:
      return StatusCode::kUnauthenticated;
    case 403:
      return StatusCode::kPermissionDenied;
    case 404:
      return StatusCode::kNotFound;
    case 409:
      return StatusCode::kFailedPrecondition;
    case 413:
    case 414:
    case 431:
      return StatusCode::kInvalidArgument;
    case 416:
      return StatusCode::kOutOfRange;
    case 503:
      return StatusCode::kUnavailable;
    case 507:
      return StatusCode::kResourceExhausted;
    default:
      return StatusCode::kInternal;
  }
}

void Server::Impl::Install() {
  http.set_payload_max_length(options.max_body_bytes);
  http.set_keep_alive_max_count(1000);
  // Read and write timeouts: http_guard.h (ServerOptions, ConnectionLimits).
  http.set_tcp_nodelay(true);
  http.set_socket_options(ExclusivePortOptions);
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return PreRoute(options, req, res);
  });
  auto handler = [this](const httplib::Request& req, httplib::Response& res) {
    Handle(req, res, nullptr);
  };
  auto streaming = [this](const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& reader) { Handle(req, res, &reader); };
  http.Get(".*", handler);
  http.Put(".*", httplib::Server::HandlerWithContentReader(streaming));
  http.Post(".*", httplib::Server::HandlerWithContentReader(streaming));
  http.Delete(".*", handler);
  http.Patch(".*", handler);
  http.Options(".*", handler);
  // Errors cpp-httplib produces itself (malformed requests, 413 bodies, 414 targets,
  // oversized header lines) get a JSON body too.
  http.set_error_handler(httplib::Server::HandlerWithResponse(HttpErrorReply));
  http.set_exception_handler(InternalErrorReply);
}

Result<std::string> Server::Impl::Body::Text() {
  if (!consumed) {
    consumed = true;
    if (reader) {
      bool too_long = false;
      const bool ok = (*reader)([&](const char* data, std::size_t n) {
        if (text.size() + n > kMaxJsonBody) {
          too_long = true;
          return false;
        }
        text.append(data, n);
        return true;
      });
      if (!ok && !too_long) {
        // cpp-httplib stops at --max-body (or the connection failed): never take what
        // arrived (nothing, or a prefix) for the whole body.
        text.clear();
        GuardedServer::CloseAfterReply();
        const std::string len = req.get_header_value("Content-Length");
        too_large = !len.empty() && std::strtoull(len.c_str(), nullptr, 10) > max_body;
        if (too_large) {
          return InvalidArgument("request body of " + len +
                                 " bytes is larger than the store's limit of " +
                                 std::to_string(max_body) + " bytes (--max-body)");
        }
        return InvalidArgument("the request body could not be read completely");
      }
      if (too_long) text = "\x01too long";
    } else {
      text = req.body;
    }
  }
  if (text == "\x01too long" || text.size() > kMaxJsonBody) {
    return InvalidArgument("JSON body is larger than " + std::to_string(kMaxJsonBody >> 20) +
                           " MiB");
  }
  return text;
}

bool Server::Impl::Body::Stream(const std::function<bool(const char*, std::size_t)>& fn) {
  if (consumed) return fn(text.data(), text.size());
  consumed = true;
  if (!reader) return fn(req.body.data(), req.body.size());
  return (*reader)([&](const char* data, std::size_t n) { return fn(data, n); });
}

// An unread body would be taken for the next request on a kept-alive connection, so
// a request that failed before reading its body still reads (and drops) it. Its size
// is bounded by --max-body.
void Server::Impl::Body::Drain() {
  if (consumed || !reader) return;
  consumed = true;
  (*reader)([](const char*, std::size_t) { return true; });
}

void Server::Impl::Handle(const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader* reader) {
  Body body{req, reader, false, {}, false, options.max_body_bytes};
  auto t = ParseTarget(req.target);
  Status s = t.ok() ? Route(req, body, *t, res) : t.status();
  if (!s.ok()) {
    if (body.too_large) {
      SendError(res, 413, s.message(), "INVALID_ARGUMENT");
    } else {
      SendError(res, s);
    }
  }
  body.Drain();
}

Status Server::Impl::Route(const httplib::Request& req, Body& body, const Target& t,
                           httplib::Response& res) {
  const std::string& p = t.path;
  const std::string& m = req.method;
  auto method_error = [&]() {
    SendError(res, 405, m + " is not allowed on " + p, "INVALID_ARGUMENT");
    return Status::Ok();
  };
  auto starts = [&](std::string_view prefix) {
    return std::string_view(p).substr(0, prefix.size()) == prefix;
  };
  if (p == "/metrics") {
    if (m != "GET") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    res.status = 200;
    res.set_content(Metrics(), "text/plain; version=0.0.4");
    return Status::Ok();
  }
  if (p == "/v1/health") {
    if (m != "GET") return method_error();
    return Health(store, t, res);
  }
  if (starts("/v1/tensors/")) return Tensors(req, body, t, p.substr(12), res);
  if (starts("/v1/meta/")) {
    if (m != "GET") return method_error();
    return TensorMeta(store, t, p.substr(9), res);
  }
  if (p == "/v1/list" || starts("/v1/list/")) {
    if (m != "GET") return method_error();
    return ListTensors(store, req, t, res);
  }
  if (starts("/v1/shm/")) {
    if (m != "GET") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    TP_RETURN_IF_ERROR(RequireLocal(req));
    return ShmMeta(store, p.substr(8), res);
  }
  if (p == "/v1/alloc") {
    if (m != "POST") return method_error();
    return Alloc(req, body, t, res);
  }
  if (p == "/v1/jobs" || starts("/v1/jobs/"))
    return Jobs(req, body, t, p.size() > 8 ? p.substr(9) : "", res);
  for (const auto& [prefix, handler] : extra_routes) {
    if (!starts(prefix)) continue;
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    std::string text;
    if (m == "POST" || m == "PUT") {
      TP_ASSIGN_OR_RETURN(text, body.Text());
    }
    TP_ASSIGN_OR_RETURN(std::string reply,
                        handler(m, p, text, req.get_header_value(kCoordinatorHeader)));
    res.status = 200;
    res.set_content(reply, "application/json");
    return Status::Ok();
  }
  return NotFound("no endpoint " + m + " " + p + " (see docs/store.md)");
}

void Server::AddMetricsSource(std::function<std::string()> source) {
  impl_->metrics_sources.push_back(std::move(source));
}

Server::Server(Store& store, ServerOptions options)
    : impl_(std::make_unique<Impl>(store, std::move(options))) {
  impl_->Install();
}

Server::~Server() { Stop(); }

void Server::AddJsonRoute(const std::string& prefix, JsonHandler handler) {
  impl_->extra_routes.emplace_back(prefix, std::move(handler));
}

Result<int> Server::Bind(const std::string& host, int port) {
  if (!IsLoopbackHost(host) && impl_->options.token.empty()) {
    return InvalidArgument("listening on " + host + " (not loopback) requires --token");
  }
  if (port < 0 || port > 65535)
    return InvalidArgument("port " + std::to_string(port) + " out of range");
  int bound = port;
  if (port == 0) {
    bound = impl_->http.bind_to_any_port(host);
    if (bound <= 0) return Unavailable("cannot bind " + host + " to a free port");
  } else if (!impl_->http.bind_to_port(host, port)) {
    const std::string where = host + ":" + std::to_string(port);
    const int err = BindError(host, port);
    if (err == EADDRINUSE) {
      return Unavailable("cannot listen on " + where + ": port " + std::to_string(port) +
                         " is in use (another tenplex store or another program listens "
                         "there; `ss -ltnp 'sport = :" +
                         std::to_string(port) + "'` shows which)");
    }
    return Unavailable("cannot listen on " + where + ": " +
                       (err == 0 ? std::string("the bind failed") : std::strerror(err)) +
                       " (not an address of this machine?)");
  }
  impl_->http.WidenBacklog();
  impl_->bound = true;
  return bound;
}

Status Server::Serve() {
  if (!impl_->bound) return FailedPrecondition("Serve() before Bind()");
  impl_->serving = true;
  if (impl_->stopping) {
    impl_->serving = false;
    return Status::Ok();
  }
  bool ok = impl_->http.listen_after_bind();
  impl_->serving = false;
  if (!ok && !impl_->stopping) return Internal("the HTTP server stopped with an error");
  return Status::Ok();
}

// Stop() may race with Serve() starting: it waits until the server runs (or Serve
// returned) so that the stop is never lost.
void Server::Stop() {
  impl_->stopping = true;
  while (impl_->serving && !impl_->http.is_running())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl_->http.stop();
}

}  // namespace tenplex::store
