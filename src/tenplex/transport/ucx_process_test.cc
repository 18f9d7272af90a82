// UCX between two processes: this test and a tenplex_transport_peer child serving
// pattern regions. Random boxes checked byte by byte; a peer killed or stopped
// mid-transfer fails the fetch with UNAVAILABLE within seconds.
#include <gtest/gtest.h>
#include <signal.h>

#include <random>
#include <thread>

#include "tenplex/geometry/copy.h"
#include "tenplex/transport/box_reads.h"
#include "tenplex/transport/pattern.h"
#include "tenplex/transport/peer_process.h"
#include "tenplex/transport/transport.h"

namespace tenplex::transport {
namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<PeerProcess> StartPeer() {
  auto p = PeerProcess::Start({TENPLEX_TRANSPORT_PEER, "ucx", "tcp"});
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(p).value() : nullptr;
}

TransportOptions Options(std::chrono::milliseconds timeout) {
  TransportOptions o;
  o.ucx_tls = "tcp";
  o.timeout = timeout;
  o.max_message_bytes = 1 << 20;
  return o;
}

// A UCX client connected to a fresh peer process.
struct Connected {
  std::unique_ptr<PeerProcess> peer;
  std::unique_ptr<Transport> client;
  PeerId id = 0;

  bool Open(std::chrono::milliseconds timeout) {
    peer = StartPeer();
    if (!peer) return false;
    auto c = NewUcxTransport(nullptr, Options(timeout));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return false;
    client = std::move(c).value();
    auto p = client->Connect(peer->address());
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    id = p.ok() ? *p : 0;
    return p.ok();
  }
};

TEST(UcxTwoProcesses, RandomBoxesMatchDirectCopy) {
  Connected c;
  ASSERT_TRUE(c.Open(std::chrono::milliseconds(20000)));
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
    Status s = c.client->Fetch(c.id, requests);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << round;
  }
  // Unknown regions are NotFound across processes too.
  std::vector<uint8_t> b(8);
  EXPECT_EQ(c.client->Fetch(c.id, {{"nope", {{0, 8, b.data()}}}}).code(), StatusCode::kNotFound);
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
  Connected c;
  ASSERT_TRUE(c.Open(std::chrono::milliseconds(20000)));
  std::vector<uint8_t> buf(64 << 20);
  Clock::time_point killed;
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    killed = Clock::now();
    c.peer->Signal(SIGKILL);
  });
  auto [s, when] = FetchUntilFailure(*c.client, c.id, buf, std::chrono::seconds(60));
  killer.join();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_LT(when - killed, std::chrono::seconds(5));
  RecordProperty("ms_after_kill", static_cast<int>((when - killed) / std::chrono::milliseconds(1)));
  // The peer stays failed; a new peer at a new address works.
  EXPECT_EQ(c.client->Fetch(c.id, {{std::string(kProbeRegion), {{0, 8, buf.data()}}}}).code(),
            StatusCode::kUnavailable);
  auto other = StartPeer();
  ASSERT_TRUE(other);
  auto id2 = c.client->Connect(other->address());
  ASSERT_TRUE(id2.ok());
  ASSERT_TRUE(
      c.client->Fetch(*id2, {{std::string(kProbeRegion), {{0, 1 << 20, buf.data()}}}}).ok());
  for (uint64_t i = 0; i < (1 << 20); i += 4099) ASSERT_EQ(buf[i], ProbeByte(i));
}

TEST(UcxTwoProcesses, StoppedPeerTimesOut) {
  const auto timeout = std::chrono::milliseconds(1500);
  Connected c;
  ASSERT_TRUE(c.Open(timeout));
  std::vector<uint8_t> buf(64 << 20);
  // Warm up (the peer builds its probe region on first use, which under sanitizers on
  // a busy machine can take longer than the short timeout: then reconnect and retry).
  Status warm = c.client->Fetch(c.id, {{std::string(kProbeRegion), {{0, 8, buf.data()}}}});
  for (int attempt = 0; !warm.ok() && warm.code() == StatusCode::kUnavailable && attempt < 10;
       ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto id = c.client->Connect(c.peer->address());
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    c.id = *id;
    warm = c.client->Fetch(c.id, {{std::string(kProbeRegion), {{0, 8, buf.data()}}}});
  }
  ASSERT_TRUE(warm.ok()) << warm.ToString();
  Clock::time_point stopped;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stopped = Clock::now();
    c.peer->Signal(SIGSTOP);
  });
  auto [s, when] = FetchUntilFailure(*c.client, c.id, buf, std::chrono::seconds(60));
  stopper.join();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  // Not before the timeout ran out (counted from the last byte, which came a little
  // before the stop on a busy machine), and not long after.
  EXPECT_GE(when - stopped, timeout / 2);
  EXPECT_LT(when - stopped, timeout + std::chrono::seconds(5));
  RecordProperty("ms_after_stop",
                 static_cast<int>((when - stopped) / std::chrono::milliseconds(1)));
}

TEST(UcxTwoProcesses, DeadBeforeFirstFetch) {
  std::string address;
  {
    auto peer = StartPeer();
    ASSERT_TRUE(peer);
    address = peer->address();
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
