#include "tenplex/store/http_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>

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

}  // namespace

GuardedServer::GuardedServer(ConnectionLimits limits, RequestCallback on_request,
                             std::function<void(const std::string&)> refused)
    : limits_(limits), on_request_(std::move(on_request)), refused_(std::move(refused)) {
  const std::size_t threads = std::max<std::size_t>(limits_.threads, limits_.per_client + 1);
  new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
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

void GuardedServer::CloseAfterReply() {
  if (current) current->close_after = true;
}

std::size_t GuardedServer::open_connections() const {
  std::lock_guard<std::mutex> l(mu_);
  return open_;
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  const std::string ip = PeerIp(sock);
  bool admitted = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (per_client_[ip] < limits_.per_client) {
      ++per_client_[ip];
      ++open_;
      admitted = true;
    } else if (per_client_[ip] == 0) {
      per_client_.erase(ip);
    }
  }
  if (!admitted) {
    static const std::string body =
        "{\"error\":\"too many connections from this client; close idle "
        "ones\",\"code\":\"UNAVAILABLE\"}\n";
    const std::string reply =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" + body;
    (void)!::send(sock, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    if (refused_) refused_(ip);
    return true;
  }
  {
    Connection conn(sock, limits_);
    current = &conn;
    const uint64_t max_body = payload_max_length_;
    for (std::size_t count = keep_alive_max_count_; count > 0; --count) {
      if (!conn.WaitForRequest(svr_sock_)) break;
      conn.BeginRequest();
      bool closed = false;
      const bool ok = process_request(
          conn, count == 1, closed, [&](httplib::Request& req) { conn.BeginBody(req, max_body); });
      if (!ok || closed || conn.close_after) break;
    }
    current = nullptr;
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  std::lock_guard<std::mutex> l(mu_);
  if (--per_client_[ip] == 0) per_client_.erase(ip);
  --open_;
  return true;
}

}  // namespace tenplex::store
