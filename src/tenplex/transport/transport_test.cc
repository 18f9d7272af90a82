// Both transports, two of them in this process: random boxes of random tensors fetched
// and checked byte by byte against CopyBox from the serving side's memory; errors.
#include "tenplex/transport/transport.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "tenplex/geometry/copy.h"
#include "tenplex/transport/bandwidth.h"
#include "tenplex/transport/box_reads.h"
#include "tenplex/transport/pattern.h"

namespace tenplex::transport {
namespace {

// Tensors a server exposes: name -> (shape, elem size, bytes).
struct Tensor {
  Shape shape;
  std::size_t elem = 4;
  std::shared_ptr<std::vector<uint8_t>> bytes;
};

struct Exposed {
  std::mutex mu;
  std::map<std::string, Tensor, std::less<>> tensors;
  int lookups = 0;

  RegionLookup Lookup() {
    return [this](std::string_view name, std::string_view) -> Result<Region> {
      std::lock_guard<std::mutex> l(mu);
      ++lookups;
      auto it = tensors.find(name);
      if (it == tensors.end()) return NotFound("no tensor '" + std::string(name) + "'");
      return Region{it->second.bytes->data(), it->second.bytes->size(), it->second.bytes};
    };
  }
};

Box RandomBox(std::mt19937& rng, const Shape& shape) {
  Box b;
  for (int64_t d : shape) {
    int64_t s = rng() % d, e = s + 1 + rng() % (d - s);
    b.dims.push_back({s, e});
  }
  return b;
}

TransportOptions TestOptions() {
  TransportOptions o;
  o.ucx_tls = "tcp";
  o.timeout = std::chrono::milliseconds(20000);
  // Many messages per request, several requests per Fetch, a small window.
  o.max_message_bytes = 256 << 10;
  o.max_request_bytes = 1 << 20;
  o.max_inflight_bytes = 3 << 20;
  return o;
}

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto s = NewTransport(GetParam(), exposed_.Lookup(), TestOptions());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    auto c = NewTransport(GetParam(), nullptr, TestOptions());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(c).value();
    auto p = client_->Connect(server_->LocalAddress());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    peer_ = *p;
  }

  void AddTensor(const std::string& name, Shape shape, std::size_t elem, std::mt19937& rng) {
    Tensor t{shape, elem, std::make_shared<std::vector<uint8_t>>(Volume(shape) * elem)};
    for (auto& b : *t.bytes) b = static_cast<uint8_t>(rng());
    std::lock_guard<std::mutex> l(exposed_.mu);
    exposed_.tensors[name] = t;
  }

  Exposed exposed_;
  std::unique_ptr<Transport> server_, client_;
  PeerId peer_ = 0;
};

TEST_P(TransportTest, RandomBoxesMatchDirectCopy) {
  std::mt19937 rng(17);
  std::vector<std::string> names;
  for (int t = 0; t < 6; ++t) {
    const int rank = 1 + rng() % 4;
    Shape shape;
    for (int k = 0; k < rank; ++k) shape.push_back(1 + rng() % (rank <= 2 ? 300 : 24));
    names.push_back("t" + std::to_string(t));
    AddTensor(names.back(), shape, std::size_t{1} << (rng() % 4), rng);
  }
  for (int round = 0; round < 12; ++round) {
    // Several requests per Fetch, each a few boxes of one tensor, into fresh buffers.
    std::vector<ReadRequest> requests;
    std::vector<std::vector<uint8_t>> got, want;
    for (int q = 0; q < 4; ++q) {
      const std::string& name = names[rng() % names.size()];
      const Tensor& t = exposed_.tensors.at(name);
      ReadRequest req{name, {}};
      for (int b = 0; b < 3; ++b) {
        const Box box = RandomBox(rng, t.shape);
        // Destination: a larger local tensor with the box at a random place, or flat.
        Shape ds;
        Box db;
        if (rng() % 3 == 0) {
          ds = {Volume(box) + 3};
          db = Box({{2, 2 + Volume(box)}});
        } else {
          for (std::size_t k = 0; k < t.shape.size(); ++k) {
            const int64_t e = box[k].size(), extra = rng() % 3, off = rng() % (extra + 1);
            ds.push_back(e + extra);
            db.dims.push_back({off, off + e});
          }
        }
        got.emplace_back(Volume(ds) * t.elem, 0xAB);
        want.emplace_back(Volume(ds) * t.elem, 0xAB);
        ASSERT_TRUE(
            CopyBox({t.bytes->data(), t.shape, box}, {want.back().data(), ds, db}, t.elem).ok());
        ASSERT_TRUE(
            AppendBoxReads(t.shape, box, 0, {got.back().data(), ds, db}, t.elem, &req.runs).ok());
      }
      requests.push_back(std::move(req));
    }
    Status s = client_->Fetch(peer_, requests);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "round " << round;
  }
}

TEST_P(TransportTest, LargeRunsAndManySmallRuns) {
  std::mt19937 rng(3);
  AddTensor("big", {3 << 20}, 1, rng);
  const auto& src = *exposed_.tensors.at("big").bytes;
  // Two long runs across many messages, then 40000 runs of 1..64 bytes (three request
  // messages) whose destinations interleave.
  std::vector<uint8_t> a(2 << 20), b(20000 * 64 * 2, 0);
  ReadRequest r1{"big", {{5, 1 << 20, a.data()}, {(2 << 20) - 1, 1 << 20, a.data() + (1 << 20)}}};
  ReadRequest r2{"big", {}};
  std::vector<std::pair<uint64_t, uint64_t>> small;
  uint64_t at = 0;
  for (int i = 0; i < 40000; ++i) {
    const uint64_t len = 1 + rng() % 64, off = rng() % (src.size() - len);
    r2.runs.push_back({off, len, b.data() + at});
    small.push_back({off, len});
    at += len;
  }
  ASSERT_LE(at, b.size());
  Status s = client_->Fetch(peer_, {r1, r2});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + (1 << 20), src.begin() + 5));
  EXPECT_TRUE(std::equal(a.begin() + (1 << 20), a.end(), src.begin() + (2 << 20) - 1));
  at = 0;
  for (auto [off, len] : small) {
    ASSERT_TRUE(std::equal(b.begin() + at, b.begin() + at + len, src.begin() + off));
    at += len;
  }
}

TEST_P(TransportTest, ConcurrentFetches) {
  std::mt19937 rng(8);
  AddTensor("x", {1 << 20}, 1, rng);
  const auto& src = *exposed_.tensors.at("x").bytes;
  std::vector<std::thread> threads;
  std::vector<Status> results(4);
  std::vector<std::vector<uint8_t>> dst(4, std::vector<uint8_t>(1 << 20));
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5 && results[t].ok(); ++i) {
        std::fill(dst[t].begin(), dst[t].end(), 0);
        // Reversed 4 KiB blocks.
        ReadRequest r{"x", {}};
        for (uint64_t k = 0; k < 256; ++k) {
          r.runs.push_back({k * 4096, 4096, dst[t].data() + (255 - k) * 4096});
        }
        results[t] = client_->Fetch(peer_, {r});
        for (uint64_t k = 0; k < 256 && results[t].ok(); ++k) {
          if (!std::equal(src.begin() + k * 4096, src.begin() + (k + 1) * 4096,
                          dst[t].begin() + (255 - k) * 4096)) {
            results[t] = Internal("block " + std::to_string(k) + " differs");
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_P(TransportTest, Errors) {
  std::mt19937 rng(1);
  AddTensor("x", {100}, 1, rng);
  const auto& src = *exposed_.tensors.at("x").bytes;
  std::vector<uint8_t> buf(100, 0);
  // Unknown region: NotFound; the other request of the same Fetch still completes.
  Status s = client_->Fetch(peer_, {{"nope", {{0, 4, buf.data()}}}, {"x", {{0, 100, buf.data()}}}});
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("nope"), std::string::npos);
  EXPECT_TRUE(std::equal(buf.begin(), buf.end(), src.begin()));
  // Out of range, also with zero length past the end, and overflow.
  EXPECT_EQ(client_->Fetch(peer_, {{"x", {{0, 10, buf.data()}, {95, 6, buf.data()}}}}).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(client_->Fetch(peer_, {{"x", {{101, 0, buf.data()}}}}).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(client_->Fetch(peer_, {{"x", {{~0ull - 1, 1, buf.data()}}}}).code(),
            StatusCode::kOutOfRange);
  // Bad requests never leave this process.
  EXPECT_EQ(client_->Fetch(peer_, {{"x", {{0, 10, nullptr}}}}).code(),
            StatusCode::kInvalidArgument);
  // Empty requests: a region check only.
  EXPECT_TRUE(client_->Fetch(peer_, {{"x", {}}}).ok());
  EXPECT_EQ(client_->Fetch(peer_, {{"y", {}}}).code(), StatusCode::kNotFound);
  EXPECT_TRUE(client_->Fetch(peer_, {}).ok());
  // Unknown peer, bad addresses.
  EXPECT_FALSE(client_->Fetch(peer_ + 100, {{"x", {{0, 1, buf.data()}}}}).ok());
  EXPECT_EQ(client_->Connect("garbage").status().code(), StatusCode::kInvalidArgument);
  const std::string other =
      GetParam() == "ucx" ? "inproc:00:0000000000000000" : "ucx:00:0000000000000000";
  EXPECT_EQ(client_->Connect(other).status().code(), StatusCode::kInvalidArgument);
  // The connection is still good.
  EXPECT_TRUE(client_->Fetch(peer_, {{"x", {{0, 100, buf.data()}}}}).ok());
}

TEST_P(TransportTest, ProbeRegionAndHolds) {
  std::vector<uint8_t> buf(1 << 20);
  ASSERT_TRUE(client_
                  ->Fetch(peer_, {{std::string(kProbeRegion),
                                   {{kProbeRegionBytes - buf.size(), buf.size(), buf.data()}}}})
                  .ok());
  for (uint64_t i = 0; i < buf.size(); ++i) {
    ASSERT_EQ(buf[i], ProbeByte(kProbeRegionBytes - buf.size() + i)) << i;
  }
  // The server drops its hold on a region once the fetch is done.
  std::mt19937 rng(2);
  AddTensor("h", {1 << 16}, 1, rng);
  std::weak_ptr<std::vector<uint8_t>> weak = exposed_.tensors.at("h").bytes;
  ASSERT_TRUE(client_->Fetch(peer_, {{"h", {{0, 1 << 16, buf.data()}}}}).ok());
  {
    std::lock_guard<std::mutex> l(exposed_.mu);
    exposed_.tensors.erase("h");
  }
  // The UCX server may release the hold just after the client saw the last byte.
  for (int i = 0; i < 200 && !weak.expired(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(weak.expired());
}

TEST_P(TransportTest, ConnectIsIdempotentAndSelfWorks) {
  auto again = client_->Connect(server_->LocalAddress());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, peer_);
  // A transport can read its own regions.
  auto self = server_->Connect(server_->LocalAddress());
  ASSERT_TRUE(self.ok());
  std::mt19937 rng(4);
  AddTensor("s", {1000}, 1, rng);
  std::vector<uint8_t> buf(1000);
  ASSERT_TRUE(server_->Fetch(*self, {{"s", {{0, 1000, buf.data()}}}}).ok());
  EXPECT_EQ(buf, *exposed_.tensors.at("s").bytes);
  server_->Disconnect(*self);
}

TEST_P(TransportTest, DestroyedPeerIsUnavailable) {
  std::vector<uint8_t> buf(16);
  server_.reset();
  const auto t0 = std::chrono::steady_clock::now();
  Status s = client_->Fetch(peer_, {{std::string(kProbeRegion), {{0, 16, buf.data()}}}});
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  // It stays failed.
  EXPECT_EQ(client_->Fetch(peer_, {{std::string(kProbeRegion), {{0, 16, buf.data()}}}}).code(),
            StatusCode::kUnavailable);
}

TEST_P(TransportTest, FetchBandwidthProbe) {
  for (uint64_t run : {uint64_t{0}, uint64_t{4096}}) {
    auto gbps = MeasureFetchBandwidth(*client_, peer_, {8 << 20, run, 2});
    ASSERT_TRUE(gbps.ok()) << gbps.status().ToString();
    EXPECT_GT(*gbps, 0.0);
  }
  EXPECT_FALSE(MeasureFetchBandwidth(*client_, peer_, {1 << 20, kProbeRegionBytes, 1}).ok());
}

INSTANTIATE_TEST_SUITE_P(Kinds, TransportTest, ::testing::Values("inproc", "ucx"),
                         [](const auto& info) { return info.param; });

TEST(TransportFactory, BadArguments) {
  EXPECT_EQ(NewTransport("carrier-pigeon", nullptr).status().code(), StatusCode::kInvalidArgument);
  TransportOptions o;
  o.max_message_bytes = 1000;
  EXPECT_EQ(NewUcxTransport(nullptr, o).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.ucx_tls = "no-such-transport";
  EXPECT_FALSE(NewUcxTransport(nullptr, o).ok());
}

// UCX over shared memory (peer failure detection off, as UCX 1.13 requires): the
// bytes of long and short runs arrive intact.
TEST(UcxSharedMemory, LongAndShortRuns) {
  TransportOptions o;
  o.ucx_tls = "sm";
  o.peer_failure_detection = false;
  auto server = NewUcxTransport(PatternLookup(), o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto client = NewUcxTransport(nullptr, o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto peer = (*client)->Connect((*server)->LocalAddress());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  const uint64_t bytes = 6 << 20;
  std::vector<uint8_t> buf(bytes, 0);
  ReadRequest r{PatternName(5, bytes), {}};
  r.runs.push_back({1, 3 << 20, buf.data()});                    // long
  for (uint64_t at = 3 << 20; at + 1000 <= bytes; at += 1000) {  // short, reversed
    r.runs.push_back({bytes - at - 1000 + (at % 7), 1000, buf.data() + at});
  }
  ASSERT_TRUE((*client)->Fetch(*peer, {r}).ok());
  for (const ReadRun& run : r.runs) {
    const uint8_t* d = static_cast<const uint8_t*>(run.dest);
    for (uint64_t k = 0; k < run.length; ++k) ASSERT_EQ(d[k], PatternByte(5, run.offset + k));
  }
  client->reset();  // the client goes first: without detection a dead peer is fatal
}

TEST(Bandwidth, Limits) {
  EXPECT_GT(MeasureMemcpyBandwidth(8 << 20, 2), 0.0);
  auto tcp = MeasureTcpLoopbackBandwidth(8 << 20, 2);
  ASSERT_TRUE(tcp.ok()) << tcp.status().ToString();
  EXPECT_GT(*tcp, 0.0);
}

TEST(BoxReads, RunsAreTheCopy) {
  std::mt19937 rng(12);
  for (int iter = 0; iter < 200; ++iter) {
    const int rank = 1 + rng() % 4;
    Shape shape;
    for (int k = 0; k < rank; ++k) shape.push_back(1 + rng() % 6);
    const std::size_t elem = 1 + rng() % 8;
    const uint64_t base = rng() % 32;
    std::vector<uint8_t> region(base + Volume(shape) * elem);
    for (auto& b : region) b = static_cast<uint8_t>(rng());
    const Box box = RandomBox(rng, shape);
    Shape ds = box.extents();
    std::vector<uint8_t> got(Volume(ds) * elem, 0), want(Volume(ds) * elem, 0);
    std::vector<ReadRun> runs;
    ASSERT_TRUE(AppendBoxReads(shape, box, base, {got.data(), ds, BoxOf(ds)}, elem, &runs).ok());
    for (const ReadRun& r : runs) std::memcpy(r.dest, region.data() + r.offset, r.length);
    ASSERT_TRUE(
        CopyBox({region.data() + base, shape, box}, {want.data(), ds, BoxOf(ds)}, elem).ok());
    EXPECT_EQ(got, want);
  }
  std::vector<ReadRun> runs;
  std::vector<uint8_t> d(16);
  EXPECT_EQ(
      AppendBoxReads({4, 4}, Box({{0, 5}, {0, 1}}), 0, {d.data(), {5, 1}, BoxOf({5, 1})}, 1, &runs)
          .code(),
      StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace tenplex::transport
