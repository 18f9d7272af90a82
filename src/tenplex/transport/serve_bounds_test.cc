// The serving side against peers that ignore the flow control (issue 35): the probe
// region behind a probe capability, requests over the size bound and over a
// connection's window refused before any work, staging bounded (short runs then sent
// in place, the bytes still right). The clients here are transports configured with
// windows far larger than the server's, as a hostile peer would be.
#include <gtest/gtest.h>

#include <map>
#include <utility>
#include <vector>

#include "tenplex/transport/bandwidth.h"
#include "tenplex/transport/capability.h"
#include "tenplex/transport/transport.h"

namespace tenplex::transport {
namespace {

TransportOptions Tcp() {
  TransportOptions o;
  o.ucx_tls = "tcp";
  o.timeout = std::chrono::milliseconds(20000);
  return o;
}

// A client that sends whatever it is asked to in one request, all at once.
TransportOptions Greedy() {
  TransportOptions o = Tcp();
  o.max_request_bytes = 1ull << 40;
  o.max_inflight_bytes = 1ull << 40;
  return o;
}

struct Pair {
  std::unique_ptr<Transport> server, client;
  PeerId peer = 0;
};

Pair Connect(const std::string& kind, const TransportOptions& server,
             const TransportOptions& client) {
  Pair p;
  auto s = NewTransport(kind, nullptr, server);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  auto c = NewTransport(kind, nullptr, client);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!s.ok() || !c.ok()) return p;
  p.server = std::move(s).value();
  p.client = std::move(c).value();
  auto peer = p.client->Connect(p.server->LocalAddress());
  EXPECT_TRUE(peer.ok()) << peer.status().ToString();
  p.peer = peer.ok() ? *peer : 0;
  return p;
}

ReadRequest Probe(uint64_t offset, uint64_t length, void* dest, std::string capability = "") {
  return ReadRequest{std::string(kProbeRegion), {{offset, length, dest}}, std::move(capability)};
}

class ProbeCapabilityTest : public ::testing::TestWithParam<std::string> {};

// A client of a server whose probe key is "cluster-key".
Pair ConnectKeyed(const std::string& kind) {
  TransportOptions keyed = Tcp();
  keyed.probe_key = "cluster-key";
  return Connect(kind, keyed, Tcp());
}

TEST_P(ProbeCapabilityTest, NeededWhereTheServerHasAKey) {
  Pair p = ConnectKeyed(GetParam());
  ASSERT_TRUE(p.client);
  std::vector<uint8_t> buf(4096);
  Status none = p.client->Fetch(p.peer, {Probe(0, buf.size(), buf.data())});
  EXPECT_EQ(none.code(), StatusCode::kPermissionDenied) << none.ToString();
  EXPECT_NE(none.message().find("no capability"), std::string::npos) << none.ToString();
  // Signed with another key, or a job's capability under the right key: refused.
  Status other = p.client->Fetch(
      p.peer, {Probe(0, buf.size(), buf.data(), MintProbeCapability("another-key"))});
  EXPECT_EQ(other.code(), StatusCode::kPermissionDenied) << other.ToString();
  const std::string job_cap = MintCapability("cluster-key", {"job", 1, 2, UnixSeconds() + 60});
  Status job = p.client->Fetch(p.peer, {Probe(0, buf.size(), buf.data(), job_cap)});
  EXPECT_EQ(job.code(), StatusCode::kPermissionDenied) << job.ToString();
  EXPECT_NE(job.message().find("not a probe capability"), std::string::npos) << job.ToString();
  // The right one reads the pattern.
  ASSERT_TRUE(
      p.client
          ->Fetch(p.peer, {Probe(1000, buf.size(), buf.data(), MintProbeCapability("cluster-key"))})
          .ok());
  for (uint64_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], ProbeByte(1000 + i)) << i;
  FetchBandwidthOptions fo;
  fo.bytes = 4 << 20;
  fo.repeats = 1;
  EXPECT_FALSE(MeasureFetchBandwidth(*p.client, p.peer, fo).ok());
  fo.capability = MintProbeCapability("cluster-key");
  EXPECT_TRUE(MeasureFetchBandwidth(*p.client, p.peer, fo).ok());
}

// Every refused probe read is counted by reason (issue 35: they were not, so a probe
// flood left tenplex_fetch_refused_total at 0); accepted reads are not.
TEST_P(ProbeCapabilityTest, RefusalsAreCountedByReason) {
  Pair p = ConnectKeyed(GetParam());
  ASSERT_TRUE(p.client);
  std::vector<uint8_t> buf(4096);
  auto fetch = [&](const std::string& cap) {
    return p.client->Fetch(p.peer, {Probe(0, buf.size(), buf.data(), cap)});
  };
  const std::vector<std::pair<CapabilityRefusal, std::string>> refused = {
      {CapabilityRefusal::kMissing, ""},
      {CapabilityRefusal::kMissing, ""},
      {CapabilityRefusal::kWrong, MintProbeCapability("another-key")},
      {CapabilityRefusal::kWrong, "tpc2:0:0:1:0000000000000000:00:tenplex.probe"},
      {CapabilityRefusal::kWrong, MintProbeCapability("cluster-key", 86400)},  // too long
      {CapabilityRefusal::kExpired, MintProbeCapability("cluster-key", -5)},
      {CapabilityRefusal::kScope, MintCapability("cluster-key", {"job", 1, 2, UnixSeconds() + 60})},
  };
  std::map<CapabilityRefusal, uint64_t> want;
  for (const auto& [reason, cap] : refused) {
    Status s = fetch(cap);
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
    ++want[reason];
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(fetch(MintProbeCapability("cluster-key")).ok());
  for (auto r : {CapabilityRefusal::kMissing, CapabilityRefusal::kWrong,
                 CapabilityRefusal::kExpired, CapabilityRefusal::kScope}) {
    EXPECT_EQ(p.server->ProbeRefused(r), want[r]) << CapabilityRefusalName(r);
    EXPECT_EQ(p.client->ProbeRefused(r), 0u) << "the client served nothing";
  }
  EXPECT_EQ(p.server->ProbeRefused(CapabilityRefusal::kNone), 0u);
}

INSTANTIATE_TEST_SUITE_P(Kinds, ProbeCapabilityTest, ::testing::Values("inproc", "ucx"),
                         [](const auto& info) { return info.param; });

// The finding: 16,384 overlapping runs of 200 KiB (3.2 GB) in one request made the
// server stage gigabytes and, repeated by stalled clients, abort. Now: refused at once.
TEST(UcxServeBounds, OversizedRequestIsRefusedBeforeAnyWork) {
  Pair p = Connect("ucx", Tcp(), Greedy());
  ASSERT_TRUE(p.client);
  std::vector<uint8_t> dest(200 << 10);
  ReadRequest r{std::string(kProbeRegion), {}};
  for (int i = 0; i < 16384; ++i) r.runs.push_back({uint64_t(i) * 1024, 200 << 10, dest.data()});
  // (Overlapping destinations: the client never gets to write them, it is refused.)
  Status s = p.client->Fetch(p.peer, {r});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("serves at most"), std::string::npos) << s.ToString();
  EXPECT_EQ(p.server->RequestsRefused(), 1u);
  EXPECT_EQ(p.server->BytesServed(), 0u);
  EXPECT_EQ(p.server->PeakStagedBytes(), 0u);
  // The connection still serves a well-behaved request.
  std::vector<uint8_t> buf(1 << 20);
  ASSERT_TRUE(p.client->Fetch(p.peer, {Probe(7, buf.size(), buf.data())}).ok());
  for (uint64_t i = 0; i < buf.size(); i += 4093) ASSERT_EQ(buf[i], ProbeByte(7 + i)) << i;
}

TEST(UcxServeBounds, RequestBeyondTheConnectionsWindowIsRefused) {
  TransportOptions server = Tcp();
  server.max_inflight_bytes = 1 << 20;  // the window: 4 x 1 MiB of answers in flight
  Pair p = Connect("ucx", server, Greedy());
  ASSERT_TRUE(p.client);
  std::vector<uint8_t> buf(6 << 20);
  Status s = p.client->Fetch(p.peer, {Probe(0, buf.size(), buf.data())});
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("exceeds the limit of 4194304"), std::string::npos) << s.ToString();
  EXPECT_EQ(p.server->RequestsRefused(), 1u);
  ASSERT_TRUE(p.client->Fetch(p.peer, {Probe(0, 3 << 20, buf.data())}).ok());
}

// Short runs are packed into staging buffers up to max_staged_bytes, then sent in place:
// the bytes are right either way and the staging never exceeds the bound.
TEST(UcxServeBounds, StagingIsBoundedAndShortRunsStillArrive) {
  TransportOptions server = Tcp();
  server.max_staged_bytes = 4 << 20;
  TransportOptions client = Tcp();
  client.max_inflight_bytes = 64 << 20;  // many packed answers in flight at once
  Pair p = Connect("ucx", server, client);
  ASSERT_TRUE(p.client);
  const uint64_t run = 3000, count = 16 << 10;  // 48 MB of short runs
  std::vector<uint8_t> buf(run * count, 0);
  ReadRequest r{std::string(kProbeRegion), {}};
  for (uint64_t i = 0; i < count; ++i) {
    r.runs.push_back({(i * 7919 * run) % (kProbeRegionBytes - run), run, buf.data() + i * run});
  }
  ASSERT_TRUE(p.client->Fetch(p.peer, {r}).ok());
  for (const ReadRun& x : r.runs) {
    const uint8_t* d = static_cast<const uint8_t*>(x.dest);
    for (uint64_t k = 0; k < x.length; k += 97) ASSERT_EQ(d[k], ProbeByte(x.offset + k));
  }
  EXPECT_GT(p.server->PeakStagedBytes(), 0u);
  EXPECT_LE(p.server->PeakStagedBytes(), server.max_staged_bytes);
  EXPECT_EQ(p.server->RequestsRefused(), 0u);
}

}  // namespace
}  // namespace tenplex::transport
