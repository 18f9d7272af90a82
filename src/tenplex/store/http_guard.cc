#include "tenplex/store/http_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <list>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace tenplex::store {

namespace {

using Clock = std::chrono::steady_clock;

std::string SockAddrIp(const sockaddr_storage& ss, int* port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    if (port) *port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    if (port) *port = ntohs(a->sin6_port);
  }
  std::string ip = buf;
  if (ip.rfind("::ffff:", 0) == 0 && ip.find('.') != std::string::npos)
    ip = ip.substr(7);  // IPv4-mapped
  return ip;
}

std::string PeerIp(int sock, int* port = nullptr) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(sock, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  return SockAddrIp(ss, port);
}

std::string LocalIp(int sock, int* port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(sock, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  return SockAddrIp(ss, port);
}

std::string Printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c > 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char b[4];
      std::snprintf(b, sizeof(b), "%%%02X", c);
      out += b;
    }
  }
  return out;
}

int PollFor(int sock, short events, Clock::duration wait) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wait).count();
  pollfd p{sock, events, 0};
  int r;
  do {
    r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, ms)));
  } while (r < 0 && errno == EINTR);
  return r > 0 && (p.revents & (events | POLLHUP | POLLERR)) ? 1 : 0;
}

// One connection: cpp-httplib's Stream with deadlines and byte counts.
class Connection final : public httplib::Stream {
 public:
  Connection(int sock, const ConnectionLimits& limits) : sock_(sock), limits_(limits) {}

  // Waits up to idle_timeout for the next request; false: close the connection.
  bool WaitForRequest(const std::atomic<int>& server_socket) {
    if (off_ < len_) return true;  // a pipelined request is buffered
    const Clock::time_point end = Clock::now() + limits_.idle_timeout;
    while (server_socket != INVALID_SOCKET) {
      const Clock::time_point now = Clock::now();
      if (now >= end) return false;
      if (PollFor(sock_, POLLIN,
                  std::min<Clock::duration>(end - now, std::chrono::milliseconds(100))))
        return true;
    }
    return false;
  }
  void BeginRequest() {
    start_ = Clock::now();
    deadline_ = start_ + limits_.header_timeout;
    bytes_in_ = bytes_out_ = 0;
  }
  void BeginBody(const httplib::Request& req, uint64_t max_body) {
    uint64_t len = max_body;
    if (req.has_header("Content-Length")) {
      len = std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10);
    }
    const double secs = static_cast<double>(len) /
                        static_cast<double>(std::max<uint64_t>(1, limits_.min_body_rate));
    deadline_ = Clock::now() + limits_.body_base_timeout +
                std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(std::min(secs, 1e7)));
  }

  bool is_readable() const override { return off_ < len_ || WaitReadable(); }
  bool is_writable() const override {
    return PollFor(sock_, POLLOUT, limits_.write_timeout) == 1 && SocketAlive();
  }
  ssize_t read(char* ptr, size_t size) override {
    if (off_ < len_) {
      const size_t n = std::min(size, len_ - off_);
      std::memcpy(ptr, buf_.data() + off_, n);
      off_ += n;
      return static_cast<ssize_t>(n);
    }
    if (!WaitReadable()) return -1;
    off_ = len_ = 0;
    if (size < buf_.size()) {
      const ssize_t n = Recv(buf_.data(), buf_.size());
      if (n <= 0) return n;
      const size_t take = std::min(size, static_cast<size_t>(n));
      std::memcpy(ptr, buf_.data(), take);
      off_ = take;
      len_ = static_cast<size_t>(n);
      return static_cast<ssize_t>(take);
    }
    return Recv(ptr, size);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n > 0) bytes_out_ += static_cast<uint64_t>(n);
    return n;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = PeerIp(sock_, &port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = LocalIp(sock_, &port);
  }
  socket_t socket() const override { return sock_; }

  std::string ip;              // the client's address
  bool authenticated = false;  // a request of it passed the token check

  uint64_t bytes_in() const { return bytes_in_; }
  uint64_t bytes_out() const { return bytes_out_; }
  double Seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  bool close_after = false;

 private:
  bool WaitReadable() const {
    const Clock::time_point now = Clock::now();
    if (now >= deadline_) return false;
    return PollFor(sock_, POLLIN,
                   std::min<Clock::duration>(deadline_ - now, limits_.read_timeout)) == 1;
  }
  bool SocketAlive() const {
    char c;
    const ssize_t n = ::recv(sock_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
  }
  ssize_t Recv(char* ptr, size_t size) {
    ssize_t n;
    do {
      n = ::recv(sock_, ptr, size, 0);
    } while (n < 0 && errno == EINTR);
    if (n > 0) bytes_in_ += static_cast<uint64_t>(n);
    return n;
  }

  int sock_;
  const ConnectionLimits& limits_;
  std::array<char, 4096> buf_{};
  size_t off_ = 0, len_ = 0;
  Clock::time_point start_{}, deadline_{};
  uint64_t bytes_in_ = 0, bytes_out_ = 0;
};

thread_local Connection* current = nullptr;
thread_local GuardedServer* current_server = nullptr;

enum class Head { kWhole, kPartial, kClosed };

// What has arrived of a connection's first request, read without consuming it: whole
// (the blank line that ends the headers, or more than `max` bytes: the server then
// refuses it), partial, or closed (the peer left, or an error).
Head PeekHead(int sock, std::size_t max) {
  thread_local std::vector<char> buf;
  buf.resize(max);
  ssize_t n;
  do {
    n = ::recv(sock, buf.data(), max, MSG_PEEK | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n == 0) return Head::kClosed;
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? Head::kPartial : Head::kClosed;
  const std::string_view v(buf.data(), static_cast<std::size_t>(n));
  if (static_cast<std::size_t>(n) >= max || v.find("\n\r\n") != std::string_view::npos ||
      v.find("\n\n") != std::string_view::npos) {
    return Head::kWhole;
  }
  return Head::kPartial;
}

void CloseSocket(int sock) {
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
}

}  // namespace

// The poller of connections whose first request has not arrived whole, and the task
// queue of the workers (cpp-httplib takes it through new_task_queue for one listen()).
class GuardedServer::Pending final : public httplib::TaskQueue {
 public:
  Pending(GuardedServer& server, std::size_t threads)
      : server_(server),
        pool_(threads),
        epfd_(::epoll_create1(EPOLL_CLOEXEC)),
        wakefd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = wakefd_;
    ::epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev);
    thread_ = std::thread([this] { Loop(); });
  }
  ~Pending() override {
    StopPoller();
    ::close(epfd_);
    ::close(wakefd_);
  }

  void enqueue(std::function<void()> fn) override { pool_.enqueue(std::move(fn)); }
  void shutdown() override {
    StopPoller();
    pool_.shutdown();
    std::lock_guard<std::mutex> l(server_.mu_);
    if (server_.pending_ == this) server_.pending_ = nullptr;
  }

  // Takes a new connection. True: its first request is here whole, the caller serves
  // it now. False: the poller holds it (or it was closed).
  bool Admit(int sock, const std::string& ip) {
    const Head head = PeekHead(sock, server_.limits_.pending_peek_bytes);
    if (head == Head::kWhole) return true;
    std::vector<std::string> evicted;
    std::vector<Entry> ready;  // pending ones whose request arrived meanwhile
    {
      std::lock_guard<std::mutex> l(mu_);
      if (head == Head::kClosed || stop_) {
        CloseSocket(sock);
        return false;
      }
      if (per_ip_[ip] >= server_.limits_.pending_per_client) EvictOldestLocked(ip, evicted, ready);
      if (order_.size() >= server_.limits_.pending_total) EvictOldestLocked("", evicted, ready);
      order_.push_back({sock, ip, Clock::now()});
      by_sock_[sock] = std::prev(order_.end());
      ++per_ip_[ip];
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
      ev.data.fd = sock;
      ::epoll_ctl(epfd_, EPOLL_CTL_ADD, sock, &ev);
    }
    Refused(evicted);
    for (const Entry& e : ready) {
      pool_.enqueue([this, sock = e.sock, ip = e.ip] { server_.Serve(sock, ip); });
    }
    return false;
  }

  std::size_t size() const {
    std::lock_guard<std::mutex> l(mu_);
    return order_.size();
  }

 private:
  struct Entry {
    int sock;
    std::string ip;
    Clock::time_point since;
  };
  using Iter = std::list<Entry>::iterator;

  void Loop() {
    std::array<epoll_event, 64> events{};
    std::vector<std::string> closed;
    while (!stop_) {
      const int n = ::epoll_wait(epfd_, events.data(), static_cast<int>(events.size()), WaitMs());
      for (int i = 0; i < n; ++i) {
        if (events[i].data.fd == wakefd_) continue;
        OnReadable(events[i].data.fd, (events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0);
      }
      ExpireAndCollect(closed);
      Refused(closed);
      closed.clear();
    }
  }

  // Milliseconds until the oldest pending connection's deadline (at most 100).
  int WaitMs() const {
    std::lock_guard<std::mutex> l(mu_);
    if (order_.empty()) return 100;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        order_.front().since + server_.limits_.pending_timeout - Clock::now());
    return static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, 100));
  }

  void OnReadable(int sock, bool hung_up) {
    std::unique_lock<std::mutex> l(mu_);
    auto it = by_sock_.find(sock);
    if (it == by_sock_.end()) return;  // evicted meanwhile
    const Head head = PeekHead(sock, server_.limits_.pending_peek_bytes);
    if (head == Head::kPartial && !hung_up) return;
    const std::string ip = it->second->ip;
    RemoveLocked(it->second);
    if (head != Head::kWhole) {  // left with a partial request: nothing to answer
      CloseSocket(sock);
      return;
    }
    l.unlock();
    pool_.enqueue([this, sock, ip] { server_.Serve(sock, ip); });
  }

  void ExpireAndCollect(std::vector<std::string>& closed) {
    std::lock_guard<std::mutex> l(mu_);
    const Clock::time_point now = Clock::now();
    while (!order_.empty() && now - order_.front().since >= server_.limits_.pending_timeout) {
      closed.push_back(order_.front().ip);
      const int sock = order_.front().sock;
      RemoveLocked(order_.begin());
      CloseSocket(sock);
    }
  }

  // Makes room: the oldest pending connection of `ip` ("": of any address) leaves the
  // pending set, closed, or (its request is whole, the poller has not seen it yet: a
  // client of `ip` amid a flood of reconnecting connections on a loaded machine) to
  // `ready`, to be served.
  void EvictOldestLocked(const std::string& ip, std::vector<std::string>& evicted,
                         std::vector<Entry>& ready) {
    for (Iter it = order_.begin(); it != order_.end(); ++it) {
      if (!ip.empty() && it->ip != ip) continue;
      const Entry e = *it;
      RemoveLocked(it);
      if (PeekHead(e.sock, server_.limits_.pending_peek_bytes) == Head::kWhole) {
        ready.push_back(e);
      } else {
        evicted.push_back(e.ip);
        CloseSocket(e.sock);
      }
      return;
    }
  }

  void RemoveLocked(Iter it) {
    ::epoll_ctl(epfd_, EPOLL_CTL_DEL, it->sock, nullptr);
    if (--per_ip_[it->ip] == 0) per_ip_.erase(it->ip);
    by_sock_.erase(it->sock);
    order_.erase(it);
  }

  void Refused(const std::vector<std::string>& ips) {
    if (!server_.refused_) return;
    for (const std::string& ip : ips) server_.refused_(ip);
  }

  void StopPoller() {
    if (!thread_.joinable()) return;
    stop_ = true;
    const uint64_t one = 1;
    (void)!::write(wakefd_, &one, sizeof(one));
    thread_.join();
    std::lock_guard<std::mutex> l(mu_);
    while (!order_.empty()) {
      const int sock = order_.front().sock;
      RemoveLocked(order_.begin());
      CloseSocket(sock);
    }
  }

  GuardedServer& server_;
  httplib::ThreadPool pool_;
  const int epfd_;
  const int wakefd_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::list<Entry> order_;                     // oldest first; guarded by mu_
  std::unordered_map<int, Iter> by_sock_;      // guarded by mu_
  std::map<std::string, std::size_t> per_ip_;  // guarded by mu_
  std::thread thread_;
};

GuardedServer::GuardedServer(ConnectionLimits limits, RequestCallback on_request,
                             std::function<void(const std::string&)> refused)
    : limits_(limits), on_request_(std::move(on_request)), refused_(std::move(refused)) {
  const std::size_t threads = std::max<std::size_t>(limits_.threads, limits_.per_client + 1);
  new_task_queue = [this, threads] {
    auto* queue = new Pending(*this, threads);
    std::lock_guard<std::mutex> l(mu_);
    pending_ = queue;
    return queue;
  };
  set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (!current || !on_request_) return;
    RequestRecord r;
    r.remote = req.remote_addr;
    r.method = Printable(req.method);
    r.target = Printable(req.target);
    r.status = res.status;
    r.bytes_in = current->bytes_in();
    r.bytes_out = current->bytes_out();
    r.seconds = current->Seconds();
    on_request_(r);
  });
}

GuardedServer::~GuardedServer() = default;

void GuardedServer::CloseAfterReply() {
  if (current) current->close_after = true;
}

void GuardedServer::MarkAuthenticated() {
  if (!current || !current_server || current->authenticated) return;
  current->authenticated = true;
  current_server->Authenticated(current->ip);
}

void GuardedServer::Authenticated(const std::string& ip) {
  std::lock_guard<std::mutex> l(mu_);
  if (++authenticated_[ip] > limits_.per_client) CloseAfterReply();
}

void GuardedServer::WidenBacklog() {
  const socket_t sock = svr_sock_;
  if (sock != INVALID_SOCKET) ::listen(sock, limits_.backlog);  // Linux: re-sets the backlog
}

std::size_t GuardedServer::open_connections() const {
  std::lock_guard<std::mutex> l(mu_);
  return open_ + (pending_ ? pending_->size() : 0);
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  const std::string ip = PeerIp(sock);
  Pending* pending;
  {
    std::lock_guard<std::mutex> l(mu_);
    pending = pending_;
  }
  if (pending == nullptr || pending->Admit(sock, ip)) Serve(sock, ip);
  return true;
}

void GuardedServer::Serve(int sock, const std::string& ip) {
  {
    std::lock_guard<std::mutex> l(mu_);
    ++open_;
  }
  bool authenticated = false;
  {
    Connection conn(sock, limits_);
    conn.ip = ip;
    current = &conn;
    current_server = this;
    const uint64_t max_body = payload_max_length_;
    for (std::size_t count = keep_alive_max_count_; count > 0; --count) {
      if (!conn.WaitForRequest(svr_sock_)) break;
      conn.BeginRequest();
      bool closed = false;
      const bool ok = process_request(
          conn, count == 1, closed, [&](httplib::Request& req) { conn.BeginBody(req, max_body); });
      if (!ok || closed || conn.close_after) break;
    }
    authenticated = conn.authenticated;
    current = nullptr;
    current_server = nullptr;
  }
  CloseSocket(sock);
  std::lock_guard<std::mutex> l(mu_);
  if (authenticated && --authenticated_[ip] == 0) authenticated_.erase(ip);
  --open_;
}

}  // namespace tenplex::store
