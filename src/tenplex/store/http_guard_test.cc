// The exact bound of the pending-connection eviction of GuardedServer (issue 35,
// docs/reliability.md "Connection admission"): a connection whose request has not
// arrived whole survives pending_per_client - 1 newer pending connections from its
// address and is closed unserved by the pending_per_client-th (the daemon cannot tell it
// from a hostile idle one then); a connection whose request has arrived is never
// evicted, however many follow. Small limits here; the daemon's are 64 per address and
// 256 in all.
#include "tenplex/store/http_guard.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace tenplex::store {
namespace {

constexpr std::size_t kPerClient = 8;
constexpr char kRequest[] = "GET /ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";

class GuardedServerBound : public ::testing::Test {
 protected:
  void SetUp() override {
    ConnectionLimits limits;
    limits.pending_per_client = kPerClient;
    limits.pending_total = 256;
    limits.pending_timeout = std::chrono::milliseconds(20000);  // never the cause here
    server_ = std::make_unique<GuardedServer>(limits, nullptr,
                                              [this](const std::string&) { ++refused_; });
    server_->Get("/ping", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("pong", "text/plain");
    });
    port_ = server_->bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    server_->WidenBacklog();
    thread_ = std::thread([this] { server_->listen_after_bind(); });
    for (int i = 0; i < 500 && !server_->is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
    server_->stop();
    thread_.join();
  }

  // A new connection from 127.0.0.1, once the server holds it (with `wait`: it is then
  // the newest pending one, eviction order being admission order).
  int Connect(bool wait = true) {
    const std::size_t before = server_->open_connections();
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    fds_.push_back(fd);
    if (!wait) return fd;
    // Admitted: one more open, or (at the bound) as many with one evicted.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (server_->open_connections() <= before && refused_ == refused_seen_ &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    refused_seen_ = refused_.load();
    return fd;
  }

  // Sends the request on fd; true when a 200 reply comes back, false when the
  // connection was closed with no reply.
  static bool Served(int fd) {
    (void)!::send(fd, kRequest, sizeof(kRequest) - 1, MSG_NOSIGNAL);
    std::string got;
    char buf[512];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) got.append(buf, n);
    return got.rfind("HTTP/1.1 200", 0) == 0;
  }

  std::unique_ptr<GuardedServer> server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> refused_{0};
  int refused_seen_ = 0;
  std::vector<int> fds_;
};

TEST_F(GuardedServerBound, APendingConnectionSurvivesOneFewerThanTheBound) {
  const int mine = Connect();
  for (std::size_t i = 0; i + 1 < kPerClient; ++i) Connect();  // idle ones, all newer
  EXPECT_EQ(refused_.load(), 0);
  EXPECT_TRUE(Served(mine));
}

TEST_F(GuardedServerBound, TheBoundthNewerConnectionEvictsIt) {
  const int mine = Connect();
  for (std::size_t i = 0; i < kPerClient; ++i) Connect();
  EXPECT_EQ(refused_.load(), 1);
  EXPECT_FALSE(Served(mine));  // closed unserved: the client's retry (client.cc) covers it
  // The next oldest is evicted by the next newcomer, and so on: one per newcomer.
  for (std::size_t i = 0; i < 3; ++i) Connect();
  EXPECT_EQ(refused_.load(), 4);
}

TEST_F(GuardedServerBound, AConnectionWhoseRequestArrivedIsNeverEvicted) {
  const int mine = Connect();
  ASSERT_EQ(::send(mine, kRequest, sizeof(kRequest) - 1, MSG_NOSIGNAL),
            static_cast<ssize_t>(sizeof(kRequest) - 1));
  for (std::size_t i = 0; i < 4 * kPerClient; ++i) Connect(/*wait=*/false);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = ::recv(mine, buf, sizeof(buf), 0)) > 0;) got.append(buf, n);
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  // A request sent with its connection is served at once, amid the flood.
  const int late = Connect(/*wait=*/false);
  EXPECT_TRUE(Served(late));
}

}  // namespace
}  // namespace tenplex::store
