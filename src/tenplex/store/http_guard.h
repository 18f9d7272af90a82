// The connection layer of the store's HTTP server (internal to store/): cpp-httplib
// parses requests and writes replies, this class owns the sockets.
//
// cpp-httplib serves one connection per worker thread and bounds each read of a socket
// by a timeout, but not a whole request: a client that sends one header byte every few
// seconds (slow loris), or keeps idle connections open, holds a worker for as long as
// it likes, and 8 such connections stopped every other client of the daemon (issue 19).
// GuardedServer replaces the per-connection loop:
//   - a new connection waits in a poller, holding no worker, until its first request
//     line and headers have arrived whole (checked by peeking, nothing is consumed);
//     only then does a worker read and serve it. So idle and slow-loris connections
//     of clients without the token cannot occupy the workers that authenticated
//     clients need (issue 35): a connection still pending after `pending_timeout` is
//     closed, one address holds at most `pending_per_client` pending connections and
//     all together `pending_total`; a newcomer beyond either bound evicts the oldest
//     pending one (which had the longest to send its request). A client that sends its
//     request with the connection (every real client) is served at once, whatever
//     other connections its address holds. The exact bound (http_guard_test.cc): a
//     connection is closed unserved only if its request line and headers have not
//     arrived whole within pending_timeout, or while they have not, pending_per_client
//     newer connections from its address (pending_total from all) were admitted; one
//     whose request arrived is never evicted (an evictee is peeked first, and served
//     when its request is whole);
//   - the request line and headers must arrive within `header_timeout` in total, and
//     a body within `body_base_timeout` + its length / `min_body_rate` (each single read
//     also within `read_timeout`); a connection that misses a deadline is closed;
//   - an idle kept-alive connection is closed after `idle_timeout`;
//   - a connection whose request passed the token check (MarkAuthenticated) counts
//     against its address's `per_client`; beyond it the connection is closed after its
//     reply, so one address keeps at most per_client workers between requests;
//   - a handler may ask to close the connection after its reply (CloseAfterReply), for
//     requests whose body was not read (a refused request must not leave its body to
//     be parsed as the next request). A request that fails the token check is refused
//     that way, so an unauthenticated connection never holds a worker past one reply.
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
  std::size_t threads = 64;             // connections served at once
  std::size_t per_client = 24;          // authenticated connections kept open per client address
  std::size_t pending_per_client = 64;  // connections waiting for their first request
  std::size_t pending_total = 256;
  std::chrono::milliseconds pending_timeout{2000};
  std::size_t pending_peek_bytes = 32 << 10;  // a longer head is passed on (and refused)
  int backlog = 1024;                         // of the listening socket (WidenBacklog)
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
  // refused(remote): a pending connection closed unserved (evicted for a newer one or
  // past pending_timeout).
  GuardedServer(ConnectionLimits limits, RequestCallback on_request,
                std::function<void(const std::string&)> refused);
  ~GuardedServer() override;

  // Closes the connection of the request this thread is serving after its reply.
  static void CloseAfterReply();
  // The request this thread is serving passed the token check.
  static void MarkAuthenticated();
  // After a bind: a listen backlog of `backlog` (cpp-httplib's is 5: a burst of
  // connections, hostile or not, made clients wait a second for a SYN retry).
  void WidenBacklog();
  // Connections open now (all clients, pending ones included).
  std::size_t open_connections() const;

  class Pending;  // the poller (http_guard.cc)

 private:
  bool process_and_close_socket(socket_t sock) override;
  void Serve(int sock, const std::string& ip);
  void Authenticated(const std::string& ip);

  ConnectionLimits limits_;
  RequestCallback on_request_;
  std::function<void(const std::string&)> refused_;
  Pending* pending_ = nullptr;  // the running listen's poller (owned by its task queue)
  mutable std::mutex mu_;
  std::map<std::string, std::size_t> authenticated_;  // per client address; guarded by mu_
  std::size_t open_ = 0;                              // served now; guarded by mu_
};

}  // namespace tenplex::store
