// UCX between two processes: this test and a tenplex_transport_peer child serving
// pattern regions. Random boxes checked byte by byte; a peer killed or stopped
// mid-transfer fails the fetch with UNAVAILABLE within seconds.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "tenplex/geometry/copy.h"
#include "tenplex/transport/box_reads.h"
#include "tenplex/transport/pattern.h"
#include "tenplex/transport/transport.h"

extern char** environ;

namespace tenplex::transport {
namespace {

using Clock = std::chrono::steady_clock;

// The child process; killed (if still running) and reaped on destruction.
class PeerProcess {
 public:
  ~PeerProcess() {
    if (stdin_fd_ >= 0) ::close(stdin_fd_);
    if (pid_ > 0) {
      ::kill(pid_, SIGCONT);
      // Closing stdin ends a healthy peer; give it a moment, then kill.
      for (int i = 0; i < 100 && !Reap(false); ++i) ::usleep(20000);
      if (pid_ > 0) {
        ::kill(pid_, SIGKILL);
        Reap(true);
      }
    }
  }

  // Starts the peer; false (with a test failure) when it does not print its address.
  bool Start(const std::string& tls) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return false;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::string bin = TENPLEX_TRANSPORT_PEER;
    std::string kind = "ucx";
    std::vector<char*> argv = {bin.data(), kind.data(), const_cast<char*>(tls.c_str()), nullptr};
    const int rc = posix_spawn(&pid_, bin.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    stdin_fd_ = in[1];
    if (rc != 0) {
      pid_ = -1;
      ::close(out[0]);
      ADD_FAILURE() << "cannot start " << bin;
      return false;
    }
    // First line: the address.
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    char c;
    while (Clock::now() < deadline) {
      pollfd p{out[0], POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      if (::read(out[0], &c, 1) != 1 || c == '\n') break;
      address_.push_back(c);
    }
    ::close(out[0]);
    if (address_.empty()) ADD_FAILURE() << "the peer printed no address";
    return !address_.empty();
  }

  void Signal(int sig) { ::kill(pid_, sig); }
  const std::string& address() const { return address_; }

  // Waits for the child (blocking or not); true once it is gone.
  bool Reap(bool block) {
    if (pid_ <= 0) return true;
    int st;
    if (::waitpid(pid_, &st, block ? 0 : WNOHANG) == pid_) pid_ = -1;
    return pid_ <= 0;
  }

 private:
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  std::string address_;
};

TransportOptions Options(std::chrono::milliseconds timeout) {
  TransportOptions o;
  o.ucx_tls = "tcp";
  o.timeout = timeout;
  o.max_message_bytes = 1 << 20;
  return o;
}

TEST(UcxTwoProcesses, RandomBoxesMatchDirectCopy) {
  PeerProcess peer;
  ASSERT_TRUE(peer.Start("tcp"));
  auto client = NewUcxTransport(nullptr, Options(std::chrono::milliseconds(20000)));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto id = (*client)->Connect(peer.address());
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  std::mt19937 rng(21);
  for (int round = 0; round < 10; ++round) {
    std::vector<ReadRequest> requests;
    std::vector<std::vector<uint8_t>> got, want;
    for (int q = 0; q < 3; ++q) {
      // A random tensor stored as a pattern region, a random box of it, into a
      // destination tensor with the box at an offset.
      const int rank = 1 + rng() % 3;
      Shape shape;
      for (int k = 0; k < rank; ++k) shape.push_back(1 + rng() % (rank == 1 ? 100000 : 200));
      const std::size_t elem = std::size_t{1} << (rng() % 3);
      const uint64_t seed = rng(), bytes = Volume(shape) * elem;
      std::vector<uint8_t> remote(bytes);
      for (uint64_t i = 0; i < bytes; ++i) remote[i] = PatternByte(seed, i);
      Box box;
      for (int64_t d : shape) {
        const int64_t s = rng() % d;
        box.dims.push_back({s, s + 1 + static_cast<int64_t>(rng() % (d - s))});
      }
      Shape ds;
      Box db;
      for (int k = 0; k < rank; ++k) {
        const int64_t e = box[k].size(), off = rng() % 2;
        ds.push_back(e + off);
        db.dims.push_back({off, off + e});
      }
      got.emplace_back(Volume(ds) * elem, 0);
      want.emplace_back(Volume(ds) * elem, 0);
      ASSERT_TRUE(CopyBox({remote.data(), shape, box}, {want.back().data(), ds, db}, elem).ok());
      ReadRequest r{PatternName(seed, bytes), {}};
      ASSERT_TRUE(AppendBoxReads(shape, box, 0, {got.back().data(), ds, db}, elem, &r.runs).ok());
      requests.push_back(std::move(r));
    }
    Status s = (*client)->Fetch(*id, requests);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << round;
  }
  // Unknown regions are NotFound across processes too.
  std::vector<uint8_t> b(8);
  EXPECT_EQ((*client)->Fetch(*id, {{"nope", {{0, 8, b.data()}}}}).code(), StatusCode::kNotFound);
}

// Fetches the probe region again and again (into one large buffer) until a fetch fails
// or `limit` passes; returns the failing status and when it came.
std::pair<Status, Clock::time_point> FetchUntilFailure(Transport& t, PeerId peer,
                                                       std::vector<uint8_t>& buf,
                                                       std::chrono::seconds limit) {
  ReadRequest r{std::string(kProbeRegion), {}};
  for (uint64_t at = 0; at < buf.size(); at += kProbeRegionBytes / 4) {
    r.runs.push_back({at % kProbeRegionBytes, kProbeRegionBytes / 4, buf.data() + at});
  }
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    Status s = t.Fetch(peer, {r});
    if (!s.ok()) return {s, Clock::now()};
  }
  return {Status::Ok(), Clock::now()};
}

TEST(UcxTwoProcesses, KilledPeerMidTransferIsUnavailable) {
  PeerProcess peer;
  ASSERT_TRUE(peer.Start("tcp"));
  auto client = NewUcxTransport(nullptr, Options(std::chrono::milliseconds(20000)));
  ASSERT_TRUE(client.ok());
  auto id = (*client)->Connect(peer.address());
  ASSERT_TRUE(id.ok());
  std::vector<uint8_t> buf(64 << 20);
  Clock::time_point killed;
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    killed = Clock::now();
    peer.Signal(SIGKILL);
  });
  auto [s, when] = FetchUntilFailure(**client, *id, buf, std::chrono::seconds(60));
  killer.join();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_LT(when - killed, std::chrono::seconds(5));
  // The peer stays failed; a new peer at a new address works.
  EXPECT_EQ((*client)->Fetch(*id, {{std::string(kProbeRegion), {{0, 8, buf.data()}}}}).code(),
            StatusCode::kUnavailable);
  PeerProcess other;
  ASSERT_TRUE(other.Start("tcp"));
  auto id2 = (*client)->Connect(other.address());
  ASSERT_TRUE(id2.ok());
  ASSERT_TRUE((*client)->Fetch(*id2, {{std::string(kProbeRegion), {{0, 1 << 20, buf.data()}}}}).ok());
  for (uint64_t i = 0; i < (1 << 20); i += 4099) ASSERT_EQ(buf[i], ProbeByte(i));
}

TEST(UcxTwoProcesses, StoppedPeerTimesOut) {
  PeerProcess peer;
  ASSERT_TRUE(peer.Start("tcp"));
  const auto timeout = std::chrono::milliseconds(1500);
  auto client = NewUcxTransport(nullptr, Options(timeout));
  ASSERT_TRUE(client.ok());
  auto id = (*client)->Connect(peer.address());
  ASSERT_TRUE(id.ok());
  std::vector<uint8_t> buf(64 << 20);
  // Warm up (the peer builds its probe region on first use).
  ASSERT_TRUE((*client)->Fetch(*id, {{std::string(kProbeRegion), {{0, 8, buf.data()}}}}).ok());
  Clock::time_point stopped;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stopped = Clock::now();
    peer.Signal(SIGSTOP);
  });
  auto [s, when] = FetchUntilFailure(**client, *id, buf, std::chrono::seconds(60));
  stopper.join();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  // Not before the timeout ran out (counted from the last byte, which came a little
  // before the stop on a busy machine), and not long after.
  EXPECT_GE(when - stopped, timeout / 2);
  EXPECT_LT(when - stopped, timeout + std::chrono::seconds(5));
}

TEST(UcxTwoProcesses, DeadBeforeFirstFetch) {
  std::string address;
  {
    PeerProcess peer;
    ASSERT_TRUE(peer.Start("tcp"));
    address = peer.address();
  }  // stdin closed: the peer exits
  auto client = NewUcxTransport(nullptr, Options(std::chrono::milliseconds(20000)));
  ASSERT_TRUE(client.ok());
  // UCX may see the refused connection at once (Connect fails) or later (Fetch fails).
  const auto t0 = Clock::now();
  auto id = (*client)->Connect(address);
  Status s = id.status();
  std::vector<uint8_t> buf(8);
  if (id.ok()) s = (*client)->Fetch(*id, {{std::string(kProbeRegion), {{0, 8, buf.data()}}}});
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
}

}  // namespace
}  // namespace tenplex::transport
