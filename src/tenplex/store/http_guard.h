// The connection layer of the store's HTTP server (internal to store/): cpp-httplib
// parses requests and writes replies, this class owns the sockets.
//
// cpp-httplib serves one connection per worker thread and bounds each read of a socket
// by a timeout, but not a whole request: a client that sends one header byte every few
// seconds (slow loris), or keeps idle connections open, holds a worker for as long as
// it likes, and 8 such connections stopped every other client of the daemon (issue 19).
// GuardedServer replaces the per-connection loop:
//   - the request line and headers must arrive within `header_timeout` in total, and
//     a body within `body_base_timeout` + its length / `min_body_rate` (each single read
//     also within `read_timeout`); a connection that misses a deadline is closed;
//   - an idle kept-alive connection is closed after `idle_timeout`;
//   - one client address holds at most `per_client` connections; more are answered
//     503 and closed at once, and `threads` (> per_client) workers serve connections,
//     so one address cannot occupy every worker;
//   - a handler may ask to close the connection after its reply (CloseAfterReply), for
//     requests whose body was not read (a refused request must not leave its body to
//     be parsed as the next request).
// Every request that got a reply is reported to `on_request` (method, target, status,
// bytes read and written on the socket, seconds), on the serving thread, after the
// reply was written: the access log and the request metrics hang there.
//
// Thread-safety: the callbacks run on worker threads, several at once.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace tenplex::store {

struct ConnectionLimits {
  std::size_t threads = 64;     // connections served at once
  std::size_t per_client = 24;  // open connections of one client address (503 above)
  std::chrono::milliseconds header_timeout{5000};
  std::chrono::milliseconds idle_timeout{5000};
  std::chrono::milliseconds read_timeout{10000};
  std::chrono::milliseconds write_timeout{30000};
  std::chrono::milliseconds body_base_timeout{10000};
  uint64_t min_body_rate = 1 << 20;  // bytes per second
};

struct RequestRecord {
  std::string remote;  // client address
  std::string method;
  std::string target;  // as sent, with bytes outside printable ASCII escaped as %XX
  int status = 0;
  uint64_t bytes_in = 0;   // request line, headers and body
  uint64_t bytes_out = 0;  // status line, headers and body
  double seconds = 0;      // first byte of the request to the last byte of the reply
};

class GuardedServer : public httplib::Server {
 public:
  using RequestCallback = std::function<void(const RequestRecord&)>;
  // refused(remote): a connection refused by the per-client limit.
  GuardedServer(ConnectionLimits limits, RequestCallback on_request,
                std::function<void(const std::string&)> refused);

  // Closes the connection of the request this thread is serving after its reply.
  static void CloseAfterReply();
  // Connections open now (all clients).
  std::size_t open_connections() const;

 private:
  bool process_and_close_socket(socket_t sock) override;

  ConnectionLimits limits_;
  RequestCallback on_request_;
  std::function<void(const std::string&)> refused_;
  mutable std::mutex mu_;
  std::map<std::string, std::size_t> per_client_;  // guarded by mu_
  std::size_t open_ = 0;                           // guarded by mu_
};

}  // namespace tenplex::store
