// The store's HTTP API (docs/store.md): tensors, metadata, listing, versions and the
// local shared-memory endpoints, served by cpp-httplib over a Store.
//
// Every request is parsed by the pure functions of parse.h from the raw request
// target; every error is a 4xx/5xx JSON body {"error": "...", "code": "..."} produced
// in one place (HttpStatusFor). A request that fails never changes stored bytes: all
// checks run before the Store is asked to write, and the Store itself creates
// tensors beside the old ones and publishes them by rename. Bulk bytes for local
// clients go through shared memory (/v1/alloc, /v1/shm), never through HTTP bodies.
//
// Security (docs/reliability.md): the server listens on loopback unless told
// otherwise, refuses a non-loopback address without a token, and with a token requires
// "Authorization: Bearer <token>" on every request (401 otherwise, compared in constant
// time). The shared-memory endpoints answer loopback peers only. Connections are
// bounded per client and in time (http_guard.h); JSON bodies are bounded in size and
// nesting (util/json_depth.h); malformed framing (two Content-Lengths, a length with
// chunked encoding, bytes that are not UTF-8 in the target) is 400.
//
// Observability: GET /metrics (Prometheus text: bytes held, versions, requests by
// status, bytes in and out, connections; plus AddMetricsSource lines) and an access
// log (ServerOptions::access_log).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "tenplex/store/store.h"
#include "tenplex/util/status.h"

namespace tenplex::store {

struct ServerOptions {
  std::string token;                        // empty: no authentication
  uint64_t max_body_bytes = 1ull << 30;     // request bodies (413 above)
  std::size_t max_header_bytes = 16 << 10;  // all request headers together (431 above)
  // Connections (http_guard.h): open connections of one client address (503 above),
  // and the time the request line and headers may take in total.
  std::size_t max_connections_per_client = 24;
  int header_timeout_ms = 5000;
  // One line per request (time, client, method, target, status, bytes in and out,
  // seconds): "" none, "-" standard error, else a file appended to.
  std::string access_log{};
};

// The HTTP status for an error code (400 for InvalidArgument, 404 NotFound, 409
// FailedPrecondition/AlreadyExists, 416 OutOfRange, 507 ResourceExhausted, ...).
int HttpStatusFor(StatusCode code);
// The inverse used by clients: the StatusCode named in an error body ("NOT_FOUND").
StatusCode StatusCodeFromName(std::string_view name, int http_status);

class Server {
 public:
  Server(Store& store, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (port 0: any free port) and returns the bound port. A host that
  // is not loopback needs a token.
  Result<int> Bind(const std::string& host, int port);
  // An extra JSON endpoint of another module (the transform agent): requests whose path
  // starts with `prefix` go to `handler` with the method, the path, the body text
  // (at most 64 MiB) and the request's coordinator (lease.h; "" when none); its result is sent as a
  // 200 JSON reply, or its error as a JSON error body (HttpStatusFor). Authentication applies as to
  // every endpoint. The handler runs on a server thread and may block (other requests are served
  // meanwhile). REQUIRES: called before Serve().
  using JsonHandler =
      std::function<Result<std::string>(const std::string& method, const std::string& path,
                                        const std::string& body, const std::string& coordinator)>;
  void AddJsonRoute(const std::string& prefix, JsonHandler handler);
  // Lines of Prometheus text another module adds to GET /metrics (each call of `source`
  // returns complete "# TYPE" and sample lines). REQUIRES: called before Serve().
  void AddMetricsSource(std::function<std::string()> source);

  // Serves until Stop() is called (from any thread or a signal-handling thread).
  Status Serve();
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tenplex::store
