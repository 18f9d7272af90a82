// Internal to the HTTP server (not a public header): the server's state and the
// helpers its implementation files share.
//   server.cc          set-up, limits, authentication, the request body, routing
//   server_tensors.cc  tensor bytes (GET with ranges, PUT streamed into shared memory)
//                      and the local allocation endpoint
//   server_jobs.cc     jobs and versions
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tenplex/store/http_guard.h"
#include "tenplex/store/parse.h"
#include "tenplex/store/server.h"

namespace tenplex::store {

using nlohmann::json;

// Bytes handed to the socket per provider call when streaming a tensor.
inline constexpr std::size_t kStreamChunk = 4 << 20;
// Largest JSON request body (version info, allocation lists).
inline constexpr std::size_t kMaxJsonBody = 64 << 20;

void SendJson(httplib::Response& res, int status, const json& body);
void SendError(httplib::Response& res, const Status& s);
void SendError(httplib::Response& res, int status, const std::string& message,
               std::string_view code);
json TensorJson(const TensorInfo& t, bool with_file);
// A version as the API shows it; without its info (with_info false) for ?info=digest.
json VersionJson(const VersionInfo& v, bool with_info = true);
// The value of a query parameter or a header (X-Tensor-Dtype); they must agree when
// both are given. NotFound when neither is.
Result<std::string> ParamOrHeader(const Target& t, const httplib::Request& req,
                                  const std::string& key, const std::string& header);
// ?key, ?key=1, ?key=true: true; absent, 0, false: false; anything else is an error.
Result<bool> FlagParam(const Target& t, const std::string& key);
// A version number (not "current").
Result<uint64_t> VersionNumber(std::string_view s);

struct Server::Impl {
  Store& store;
  ServerOptions options;
  GuardedServer http;
  std::atomic<bool> bound{false};
  std::atomic<bool> serving{false};
  std::atomic<bool> stopping{false};

  std::vector<std::pair<std::string, JsonHandler>> extra_routes;
  std::vector<std::function<std::string()>> metrics_sources;

  // Request metrics (OnRequest) and the access log.
  std::mutex metrics_mu;
  std::map<int, uint64_t> requests_by_status;  // guarded by metrics_mu
  uint64_t bytes_in = 0, bytes_out = 0;        // guarded by metrics_mu
  double request_seconds = 0;                  // guarded by metrics_mu
  uint64_t refused_connections = 0;            // guarded by metrics_mu
  std::FILE* access_log = nullptr;             // written under metrics_mu
  bool own_access_log = false;

  Impl(Store& s, ServerOptions o);
  ~Impl();
  void OnRequest(const RequestRecord& r);
  std::string Metrics();

  // The request body: read on first use from the content reader (PUT and POST
  // stream), so a tensor PUT can go straight into shared memory.
  struct Body {
    const httplib::Request& req;
    const httplib::ContentReader* reader = nullptr;
    bool consumed = false;
    std::string text;
    bool too_large = false;  // the body passed --max-body (413)
    uint64_t max_body = 0;
    // The whole body as text (JSON endpoints), at most kMaxJsonBody bytes.
    Result<std::string> Text();
    // Streams the body into fn(data, n); false when fn or the connection failed.
    bool Stream(const std::function<bool(const char*, std::size_t)>& fn);
    void Drain();
  };

  void Install();
  void Handle(const httplib::Request& req, httplib::Response& res,
              const httplib::ContentReader* reader);
  Status Route(const httplib::Request& req, Body& body, const Target& t, httplib::Response& res);
  Status Tensors(const httplib::Request& req, Body& body, const Target& t, const std::string& path,
                 httplib::Response& res);
  Status GetTensor(const Target& t, const std::string& path, httplib::Response& res);
  Status PutTensor(const httplib::Request& req, Body& body, const Target& t,
                   const std::string& path, httplib::Response& res);
  Status Jobs(const httplib::Request& req, Body& body, const Target& t, const std::string& rest,
              httplib::Response& res);
  Status Alloc(const httplib::Request& req, Body& body, const Target& t, httplib::Response& res);
  static Status RequireLocal(const httplib::Request& req) {
    if (!IsLoopbackHost(req.remote_addr)) {
      return PermissionDenied("shared-memory endpoints answer local (loopback) clients only; " +
                              req.remote_addr + " must use the tensor endpoints");
    }
    return Status::Ok();
  }
};

}  // namespace tenplex::store
