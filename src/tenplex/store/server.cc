#include "tenplex/store/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tenplex/geometry/copy.h"
#include "tenplex/util/format.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::store {

using nlohmann::json;

namespace {

// Bytes handed to the socket per provider call when streaming a tensor.
constexpr std::size_t kStreamChunk = 4 << 20;
// Largest JSON request body (version info, allocation lists).
constexpr std::size_t kMaxJsonBody = 64 << 20;

void SendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump() + "\n", "application/json");
}

void SendError(httplib::Response& res, const Status& s) {
  SendJson(res, HttpStatusFor(s.code()), {{"error", s.message()}, {"code", std::string(StatusCodeName(s.code()))}});
}

void SendError(httplib::Response& res, int status, const std::string& message, std::string_view code) {
  SendJson(res, status, {{"error", message}, {"code", std::string(code)}});
}

json TensorJson(const TensorInfo& t, bool with_file) {
  json j = {{"path", t.path},
            {"dtype", std::string(DTypeName(t.dtype))},
            {"shape", t.shape},
            {"bytes", t.bytes},
            {"committed", t.committed}};
  if (with_file) {
    j["file"] = t.file;
    j["offset"] = 0;
    j["writable"] = !t.committed;
  }
  return j;
}

json VersionJson(const VersionInfo& v) {
  return {{"job", v.job},
          {"version", v.version},
          {"state", v.committed ? "committed" : "open"},
          {"current", v.current},
          {"bytes", v.bytes},
          {"tensors", v.tensors},
          {"info", json::parse(v.info, nullptr, false)}};
}

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

// The value of a query parameter or a header (X-Tensor-Dtype); they must agree when
// both are given.
Result<std::string> ParamOrHeader(const Target& t, const httplib::Request& req, const std::string& key,
                                  const std::string& header) {
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

}  // namespace

int HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kAlreadyExists: return 409;
    case StatusCode::kOutOfRange: return 416;
    case StatusCode::kFailedPrecondition: return 409;
    case StatusCode::kResourceExhausted: return 507;
    case StatusCode::kDataLoss: return 500;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kPermissionDenied: return 403;
    case StatusCode::kUnauthenticated: return 401;
    case StatusCode::kAborted: return 409;
    case StatusCode::kInternal: return 500;
    case StatusCode::kUnimplemented: return 501;
  }
  return 500;
}

StatusCode StatusCodeFromName(std::string_view name, int http_status) {
  for (int c = 0; c <= static_cast<int>(StatusCode::kUnimplemented); ++c) {
    if (StatusCodeName(static_cast<StatusCode>(c)) == name) return static_cast<StatusCode>(c);
  }
  switch (http_status) {
    case 400: return StatusCode::kInvalidArgument;
    case 401: return StatusCode::kUnauthenticated;
    case 403: return StatusCode::kPermissionDenied;
    case 404: return StatusCode::kNotFound;
    case 409: return StatusCode::kFailedPrecondition;
    case 413:
    case 414:
    case 431: return StatusCode::kInvalidArgument;
    case 416: return StatusCode::kOutOfRange;
    case 503: return StatusCode::kUnavailable;
    case 507: return StatusCode::kResourceExhausted;
    default: return StatusCode::kInternal;
  }
}

struct Server::Impl {
  Store& store;
  ServerOptions options;
  httplib::Server http;
  std::atomic<bool> bound{false};
  std::atomic<bool> serving{false};
  std::atomic<bool> stopping{false};

  std::vector<std::pair<std::string, JsonHandler>> extra_routes;

  Impl(Store& s, ServerOptions o) : store(s), options(std::move(o)) {}

  // The request body: read on first use from the content reader (PUT and POST
  // stream), so a tensor PUT can go straight into shared memory.
  struct Body {
    const httplib::Request& req;
    const httplib::ContentReader* reader = nullptr;
    bool consumed = false;
    std::string text;
    // The whole body as text (JSON endpoints), at most kMaxJsonBody bytes.
    Result<std::string> Text();
    // Streams the body into fn(data, n); false when fn or the connection failed.
    bool Stream(const std::function<bool(const char*, std::size_t)>& fn);
    void Drain();
  };

  void Install();
  void Handle(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader* reader);
  Status Route(const httplib::Request& req, Body& body, const Target& t, httplib::Response& res);
  Status Tensors(const httplib::Request& req, Body& body, const Target& t, const std::string& path,
                 httplib::Response& res);
  Status GetTensor(const Target& t, const std::string& path, httplib::Response& res);
  Status PutTensor(const httplib::Request& req, Body& body, const Target& t, const std::string& path,
                   httplib::Response& res);
  Status Jobs(const httplib::Request& req, Body& body, const Target& t, const std::string& rest,
              httplib::Response& res);
  Status Alloc(const httplib::Request& req, Body& body, const Target& t, httplib::Response& res);
  static Status RequireLocal(const httplib::Request& req) {
    if (!IsLoopbackHost(req.remote_addr)) {
      return PermissionDenied("shared-memory endpoints answer local (loopback) clients only; " + req.remote_addr +
                              " must use the tensor endpoints");
    }
    return Status::Ok();
  }
};

void Server::Impl::Install() {
  http.set_payload_max_length(options.max_body_bytes);
  http.set_keep_alive_max_count(1000);
  http.set_read_timeout(10, 0);
  http.set_write_timeout(30, 0);
  http.set_tcp_nodelay(true);
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    std::size_t header_bytes = 0;
    for (const auto& [k, v] : req.headers) header_bytes += k.size() + v.size() + 4;
    if (header_bytes > options.max_header_bytes) {
      SendError(res, 431,
                "request headers total " + std::to_string(header_bytes) + " bytes, more than the limit of " +
                    std::to_string(options.max_header_bytes),
                "INVALID_ARGUMENT");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!options.token.empty()) {
      const std::string auth = req.get_header_value("Authorization");
      if (!ConstantTimeEqual(auth, "Bearer " + options.token)) {
        res.set_header("WWW-Authenticate", "Bearer");
        SendError(res, 401,
                  auth.empty() ? "this store needs 'Authorization: Bearer <token>'" : "wrong bearer token",
                  "UNAUTHENTICATED");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  auto handler = [this](const httplib::Request& req, httplib::Response& res) { Handle(req, res, nullptr); };
  auto streaming = [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    Handle(req, res, &reader);
  };
  http.Get(".*", handler);
  http.Put(".*", httplib::Server::HandlerWithContentReader(streaming));
  http.Post(".*", httplib::Server::HandlerWithContentReader(streaming));
  http.Delete(".*", handler);
  http.Patch(".*", handler);
  http.Options(".*", handler);
  // Errors cpp-httplib produces itself (malformed requests, 413 bodies, 414 targets,
  // oversized header lines) get a JSON body too.
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const bool no_length = (req.method == "POST" || req.method == "PUT" || req.method == "PATCH") &&
                           !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding");
    std::string what = res.status == 413   ? "request body is larger than the store's limit (--max-body)"
                       : res.status == 414 ? "request target is too long"
                       : res.status == 431 ? "request headers are too large"
                       : no_length ? req.method + " needs a Content-Length header (send an empty body: curl -d '')"
                       : res.status == 400 ? "malformed HTTP request (a header line longer than 8 KiB?)"
                                           : "HTTP error " + std::to_string(res.status);
    SendJson(res, res.status, {{"error", what}, {"code", "INVALID_ARGUMENT"}});
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    SendJson(res, 500, {{"error", what}, {"code", "INTERNAL"}});
  });
}

Result<std::string> Server::Impl::Body::Text() {
  if (!consumed) {
    consumed = true;
    if (reader) {
      bool too_long = false;
      (*reader)([&](const char* data, std::size_t n) {
        if (text.size() + n > kMaxJsonBody) {
          too_long = true;
          return false;
        }
        text.append(data, n);
        return true;
      });
      if (too_long) text = "\x01too long";
    } else {
      text = req.body;
    }
  }
  if (text == "\x01too long" || text.size() > kMaxJsonBody) {
    return InvalidArgument("JSON body is larger than " + std::to_string(kMaxJsonBody >> 20) + " MiB");
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

void Server::Impl::Handle(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader* reader) {
  Body body{req, reader, false, {}};
  auto t = ParseTarget(req.target);
  Status s = t.ok() ? Route(req, body, *t, res) : t.status();
  if (!s.ok()) SendError(res, s);
  body.Drain();
}

Status Server::Impl::Route(const httplib::Request& req, Body& body, const Target& t, httplib::Response& res) {
  const std::string& p = t.path;
  const std::string& m = req.method;
  auto method_error = [&]() {
    SendError(res, 405, m + " is not allowed on " + p, "INVALID_ARGUMENT");
    return Status::Ok();
  };
  auto starts = [&](std::string_view prefix) { return std::string_view(p).substr(0, prefix.size()) == prefix; };
  if (p == "/v1/health") {
    if (m != "GET") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    SendJson(res, 200,
             {{"ok", true},
              {"store_id", store.id()},
              {"shm_dir", store.shm_dir()},
              {"pid", static_cast<int64_t>(::getpid())},
              {"used_bytes", store.used_bytes()},
              {"memory_limit", store.memory_limit()}});
    return Status::Ok();
  }
  if (starts("/v1/tensors/")) return Tensors(req, body, t, p.substr(12), res);
  if (starts("/v1/meta/")) {
    if (m != "GET") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    TP_ASSIGN_OR_RETURN(TensorInfo info, store.Meta(p.substr(9)));
    TP_ASSIGN_OR_RETURN(std::string sum, store.Checksum(info.path));
    json j = TensorJson(info, false);
    j["xxh64"] = sum;
    SendJson(res, 200, j);
    return Status::Ok();
  }
  if (p == "/v1/list" || starts("/v1/list/")) {
    if (m != "GET") return method_error();
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
  if (starts("/v1/shm/")) {
    if (m != "GET") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    TP_RETURN_IF_ERROR(RequireLocal(req));
    TP_ASSIGN_OR_RETURN(TensorInfo info, store.Meta(p.substr(8)));
    json j = TensorJson(info, true);
    j["store_id"] = store.id();
    SendJson(res, 200, j);
    return Status::Ok();
  }
  if (p == "/v1/alloc") {
    if (m != "POST") return method_error();
    return Alloc(req, body, t, res);
  }
  if (p == "/v1/jobs" || starts("/v1/jobs/")) return Jobs(req, body, t, p.size() > 8 ? p.substr(9) : "", res);
  for (const auto& [prefix, handler] : extra_routes) {
    if (!starts(prefix)) continue;
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    std::string text;
    if (m == "POST" || m == "PUT") {
      TP_ASSIGN_OR_RETURN(text, body.Text());
    }
    TP_ASSIGN_OR_RETURN(std::string reply, handler(m, p, text));
    res.status = 200;
    res.set_content(reply, "application/json");
    return Status::Ok();
  }
  return NotFound("no endpoint " + m + " " + p + " (see docs/store.md)");
}

Status Server::Impl::Tensors(const httplib::Request& req, Body& body, const Target& t, const std::string& path,
                             httplib::Response& res) {
  if (req.method == "GET") return GetTensor(t, path, res);
  if (req.method == "PUT") return PutTensor(req, body, t, path, res);
  if (req.method == "DELETE") {
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    TP_RETURN_IF_ERROR(store.Delete(path));
    res.status = 204;
    return Status::Ok();
  }
  SendError(res, 405, req.method + " is not allowed on tensors (GET, PUT, DELETE)", "INVALID_ARGUMENT");
  return Status::Ok();
}

Status Server::Impl::GetTensor(const Target& t, const std::string& path, httplib::Response& res) {
  TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {"range"}));
  auto r = t.query.find("range");
  TP_ASSIGN_OR_RETURN(std::vector<RangeItem> items, ParseRange(r == t.query.end() ? "" : r->second));
  TP_ASSIGN_OR_RETURN(TensorRef ref, store.Get(path));
  const TensorInfo info = ref.info();  // a copy: ref is moved into the stream below
  TP_ASSIGN_OR_RETURN(Box box, ResolveRange(items, info.shape));
  const std::size_t elem = DTypeSize(info.dtype);
  const Shape extents = box.extents();
  const uint64_t bytes = static_cast<uint64_t>(Volume(box)) * elem;
  res.status = 200;
  res.set_header("X-Tensor-Dtype", std::string(DTypeName(info.dtype)));
  res.set_header("X-Tensor-Shape", ShapeToString(extents));
  res.set_header("X-Tensor-Path", info.path);
  if (bytes == 0) {
    res.set_content("", "application/octet-stream");
    return Status::Ok();
  }
  // A contiguous box streams straight from the shared memory; any other box is
  // gathered by the strided copy, a slab of whole dim-0 rows (about kStreamChunk
  // bytes) per provider call into one reused buffer.
  auto holder = std::make_shared<TensorRef>(std::move(ref));
  if (IsContiguous(info.shape, box)) {
    const uint8_t* base = holder->data() + static_cast<uint64_t>(FlatOffset(info.shape, box)) * elem;
    res.set_content_provider(
        bytes, "application/octet-stream",
        [holder, base, bytes](std::size_t offset, std::size_t length, httplib::DataSink& sink) {
          if (offset >= bytes) return false;
          std::size_t n = std::min<std::size_t>({length, kStreamChunk, bytes - offset});
          return sink.write(reinterpret_cast<const char*>(base + offset), n);
        });
    return Status::Ok();
  }
  const uint64_t row_bytes = bytes / static_cast<uint64_t>(extents[0]);  // a non-contiguous box has rank >= 2
  const int64_t rows_per = static_cast<int64_t>(std::max<uint64_t>(1, kStreamChunk / row_bytes));
  const uint64_t slab_bytes = static_cast<uint64_t>(rows_per) * row_bytes;
  auto buffer = std::make_shared<std::vector<uint8_t>>();
  res.set_content_provider(
      bytes, "application/octet-stream",
      [holder, buffer, box, extents, elem, rows_per, slab_bytes, row_bytes](std::size_t offset, std::size_t,
                                                                           httplib::DataSink& sink) {
        if (offset % slab_bytes != 0) return false;  // every call writes one whole slab
        const int64_t r0 = static_cast<int64_t>(offset / slab_bytes) * rows_per;
        const int64_t r1 = std::min(extents[0], r0 + rows_per);
        if (r0 >= r1) return false;
        Box sub = box;
        sub[0] = Interval{box[0].begin + r0, box[0].begin + r1};
        const Shape sub_ext = sub.extents();
        const std::size_t n = static_cast<std::size_t>(r1 - r0) * row_bytes;
        if (buffer->size() < n) buffer->resize(n);
        Status s = CopyBox(ConstRegion{holder->data(), holder->info().shape, sub},
                           MutRegion{buffer->data(), sub_ext, BoxOf(sub_ext)}, elem, &ThreadPool::Default());
        return s.ok() && sink.write(reinterpret_cast<const char*>(buffer->data()), n);
      });
  return Status::Ok();
}

Status Server::Impl::PutTensor(const httplib::Request& req, Body& body, const Target& t, const std::string& path,
                               httplib::Response& res) {
  TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {"dtype", "shape"}));
  auto dtype_text = ParamOrHeader(t, req, "dtype", "X-Tensor-Dtype");
  if (!dtype_text.ok()) {
    if (dtype_text.status().code() != StatusCode::kNotFound) return dtype_text.status();
    return InvalidArgument("PUT needs ?dtype= (or X-Tensor-Dtype)");
  }
  auto shape_text = ParamOrHeader(t, req, "shape", "X-Tensor-Shape");
  if (!shape_text.ok()) {
    if (shape_text.status().code() != StatusCode::kNotFound) return shape_text.status();
    return InvalidArgument("PUT needs ?shape= (or X-Tensor-Shape; empty for a scalar)");
  }
  TP_ASSIGN_OR_RETURN(DType dtype, ParseDType(*dtype_text));
  TP_ASSIGN_OR_RETURN(Shape shape, ParseShape(*shape_text, dtype));
  const uint64_t want = static_cast<uint64_t>(Volume(shape)) * DTypeSize(dtype);
  if (want > options.max_body_bytes) {
    SendError(res, 413,
              "a tensor of " + std::to_string(want) + " bytes is larger than the store's body limit of " +
                  std::to_string(options.max_body_bytes) + " bytes (--max-body); local clients use shared memory",
              "INVALID_ARGUMENT");
    return Status::Ok();
  }
  if (req.has_header("Content-Length")) {
    const std::string len = req.get_header_value("Content-Length");
    if (len != std::to_string(want)) {
      return InvalidArgument("body has " + len + " bytes but dtype " + std::string(DTypeName(dtype)) + " x shape [" +
                             ShapeToString(shape) + "] needs " + std::to_string(want));
    }
  }
  // The body goes from the socket into the new tensor's file in large writes; the
  // tensor is published only when every byte arrived.
  auto fill = [&](TensorSink& sink) -> Status {
    std::string buf;
    buf.reserve(static_cast<std::size_t>(std::min<uint64_t>(want, kStreamChunk)));
    Status st;
    bool ok = body.Stream([&](const char* data, std::size_t n) {
      if (n > want - sink.written() - buf.size()) {
        st = InvalidArgument("body is longer than the " + std::to_string(want) + " bytes dtype x shape needs");
        return false;
      }
      buf.append(data, n);
      if (buf.size() >= kStreamChunk) {
        st = sink.Write(buf.data(), buf.size());
        buf.clear();
      }
      return st.ok();
    });
    if (st.ok() && !buf.empty()) st = sink.Write(buf.data(), buf.size());
    if (st.ok() && !ok) st = InvalidArgument("the request body ended early or could not be read (or passed --max-body)");
    return st;
  };
  TP_ASSIGN_OR_RETURN(TensorInfo info, store.PutFrom(path, dtype, shape, fill));
  SendJson(res, 201, TensorJson(info, false));
  return Status::Ok();
}

Status Server::Impl::Alloc(const httplib::Request& req, Body& request_body, const Target& t,
                           httplib::Response& res) {
  TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
  TP_RETURN_IF_ERROR(RequireLocal(req));
  TP_ASSIGN_OR_RETURN(std::string text, request_body.Text());
  json body = json::parse(text, nullptr, false);
  if (body.is_discarded() || !body.is_object() || !body.contains("tensors") || !body["tensors"].is_array()) {
    return InvalidArgument("POST /v1/alloc needs a JSON body {\"tensors\": [{\"path\", \"dtype\", \"shape\"}, ...]}");
  }
  std::vector<Store::AllocRequest> reqs;
  for (const json& e : body["tensors"]) {
    if (!e.is_object() || !e.contains("path") || !e["path"].is_string() || !e.contains("dtype") ||
        !e["dtype"].is_string() || !e.contains("shape") || !e["shape"].is_array()) {
      return InvalidArgument("each tensor of /v1/alloc needs path, dtype and shape");
    }
    Store::AllocRequest r;
    r.path = e["path"].get<std::string>();
    TP_ASSIGN_OR_RETURN(r.dtype, ParseDType(e["dtype"].get<std::string>()));
    if (e["shape"].size() > kMaxRank) return InvalidArgument(r.path + ": too many dimensions");
    for (const json& d : e["shape"]) {
      if (!d.is_number_integer()) return InvalidArgument(r.path + ": shape entries must be integers");
      r.shape.push_back(d.get<int64_t>());
    }
    reqs.push_back(std::move(r));
  }
  bool zero_fill = true;
  if (body.contains("fill")) {
    if (!body["fill"].is_string() || (body["fill"] != "zero" && body["fill"] != "none")) {
      return InvalidArgument("/v1/alloc: \"fill\" is \"zero\" (default) or \"none\" (sparse; write every byte)");
    }
    zero_fill = body["fill"] == "zero";
  }
  TP_ASSIGN_OR_RETURN(std::vector<TensorInfo> infos, store.AllocateMany(reqs, zero_fill));
  json out = json::array();
  for (const TensorInfo& i : infos) out.push_back(TensorJson(i, true));
  SendJson(res, 201, {{"store_id", store.id()}, {"tensors", out}});
  return Status::Ok();
}

Status Server::Impl::Jobs(const httplib::Request& req, Body& body, const Target& t, const std::string& rest,
                          httplib::Response& res) {
  const std::string& m = req.method;
  std::vector<std::string_view> seg;
  if (!rest.empty()) seg = SplitString(rest, '/');
  auto method_error = [&]() {
    SendError(res, 405, m + " is not allowed on " + t.path, "INVALID_ARGUMENT");
    return Status::Ok();
  };
  if (seg.empty()) {  // /v1/jobs
    if (m != "GET") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    json out = json::array();
    for (const std::string& name : store.Jobs()) {
      auto j = store.Job(name);
      if (!j.ok()) continue;  // deleted meanwhile
      out.push_back({{"job", name}, {"current", j->current ? json(*j->current) : json(nullptr)}});
    }
    SendJson(res, 200, {{"jobs", out}});
    return Status::Ok();
  }
  const std::string job(seg[0]);
  TP_RETURN_IF_ERROR(CheckJobName(job));
  if (seg.size() == 1) {  // /v1/jobs/{job}
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    if (m == "GET") {
      TP_ASSIGN_OR_RETURN(JobInfo info, store.Job(job));
      json versions = json::array();
      for (const VersionInfo& v : info.versions) versions.push_back(VersionJson(v));
      SendJson(res, 200,
               {{"job", job}, {"current", info.current ? json(*info.current) : json(nullptr)}, {"versions", versions}});
      return Status::Ok();
    }
    if (m == "DELETE") {
      TP_RETURN_IF_ERROR(store.DeleteJob(job));
      res.status = 204;
      return Status::Ok();
    }
    return method_error();
  }
  if (seg.size() == 2 && seg[1] == "release") {
    if (m != "POST") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    TP_RETURN_IF_ERROR(store.ReleaseOld(job));
    res.status = 204;
    return Status::Ok();
  }
  if (seg[1] != "versions" || seg.size() > 4) return NotFound("no endpoint " + m + " " + t.path);
  if (seg.size() == 2) {  // POST /v1/jobs/{job}/versions[?version=N]
    if (m != "POST") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {"version"}));
    std::optional<uint64_t> want;
    if (auto it = t.query.find("version"); it != t.query.end()) {
      TP_ASSIGN_OR_RETURN(want, VersionNumber(it->second));
    }
    TP_ASSIGN_OR_RETURN(std::string info, body.Text());
    TP_ASSIGN_OR_RETURN(uint64_t v, store.BeginVersion(job, want, info));
    SendJson(res, 201, {{"job", job}, {"version", v}});
    return Status::Ok();
  }
  TP_ASSIGN_OR_RETURN(VersionRef ref, ParseVersion(seg[2]));
  if (seg.size() == 3) {  // /v1/jobs/{job}/versions/{v}
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    if (m == "GET") {
      TP_ASSIGN_OR_RETURN(VersionInfo vi, store.Version(job, ref));
      SendJson(res, 200, VersionJson(vi));
      return Status::Ok();
    }
    if (m == "DELETE") {
      TP_ASSIGN_OR_RETURN(uint64_t v, VersionNumber(seg[2]));
      TP_RETURN_IF_ERROR(store.DropVersion(job, v));
      res.status = 204;
      return Status::Ok();
    }
    return method_error();
  }
  TP_ASSIGN_OR_RETURN(uint64_t v, VersionNumber(seg[2]));
  if (seg[3] == "commit") {
    if (m != "POST") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {"keep_old"}));
    TP_ASSIGN_OR_RETURN(bool keep_old, FlagParam(t, "keep_old"));
    TP_RETURN_IF_ERROR(store.Commit(job, v, keep_old));
    SendJson(res, 200, {{"job", job}, {"version", v}, {"current", v}});
    return Status::Ok();
  }
  if (seg[3] == "abort") {
    if (m != "POST") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    TP_ASSIGN_OR_RETURN(VersionInfo vi, store.Version(job, v));
    if (vi.committed) {
      return FailedPrecondition("version " + std::to_string(v) + " of job '" + job +
                                "' is committed; DELETE /v1/jobs/" + job + "/versions/" + std::to_string(v) +
                                " releases an old committed version");
    }
    TP_RETURN_IF_ERROR(store.DropVersion(job, v));
    res.status = 204;
    return Status::Ok();
  }
  if (seg[3] == "info") {
    if (m != "PUT") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    TP_ASSIGN_OR_RETURN(std::string info, body.Text());
    TP_RETURN_IF_ERROR(store.SetVersionInfo(job, v, info));
    res.status = 204;
    return Status::Ok();
  }
  return NotFound("no endpoint " + m + " " + t.path);
}

Server::Server(Store& store, ServerOptions options) : impl_(std::make_unique<Impl>(store, std::move(options))) {
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
  if (port < 0 || port > 65535) return InvalidArgument("port " + std::to_string(port) + " out of range");
  int bound = port;
  if (port == 0) {
    bound = impl_->http.bind_to_any_port(host);
    if (bound <= 0) return Unavailable("cannot bind " + host + " to a free port");
  } else if (!impl_->http.bind_to_port(host, port)) {
    return Unavailable("cannot listen on " + host + ":" + std::to_string(port) + " (in use or not an address here)");
  }
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
  while (impl_->serving && !impl_->http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl_->http.stop();
}

}  // namespace tenplex::store
