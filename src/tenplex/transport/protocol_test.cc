#include "tenplex/transport/protocol.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>

namespace tenplex::transport {
namespace {

TEST(ProtocolTest, RequestRoundTrip) {
  std::vector<ReadRun> runs = {{0, 10, nullptr}, {1ull << 40, 7, nullptr}, {5, 0, nullptr}};
  const std::string payload = EncodeRequestPayload("tensor/a", runs.data(), 3);
  RequestHeader h{kProtocolVersion, 3, 42, 8, 0};
  auto r = DecodeRequest(&h, sizeof(h), payload.data(), payload.size());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->request_id, 42u);
  EXPECT_EQ(r->region, "tensor/a");
  ASSERT_EQ(r->runs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r->runs[i].offset, runs[i].offset);
    EXPECT_EQ(r->runs[i].length, runs[i].length);
  }
  // A sub-range of runs.
  const std::string tail = EncodeRequestPayload("x", runs.data() + 1, 2);
  RequestHeader h2{kProtocolVersion, 2, 43, 1, 0};
  auto r2 = DecodeRequest(&h2, sizeof(h2), tail.data(), tail.size());
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->runs[0].offset, 1ull << 40);
}

TEST(ProtocolTest, RequestCarriesCapability) {
  std::vector<ReadRun> runs = {{3, 4, nullptr}};
  const std::string cap = "tpc1:1:2:99:abc:job";
  const std::string payload = EncodeRequestPayload("t", runs.data(), 1, cap);
  RequestHeader h{kProtocolVersion, 1, 7, 1, static_cast<uint32_t>(cap.size())};
  auto r = DecodeRequest(&h, sizeof(h), payload.data(), payload.size());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->region, "t");
  EXPECT_EQ(r->capability, cap);
  // Without the capability's length in the header the payload is inconsistent.
  RequestHeader none = h;
  none.capability_length = 0;
  EXPECT_EQ(DecodeRequest(&none, sizeof(none), payload.data(), payload.size()).status().code(),
            StatusCode::kInvalidArgument);
  RequestHeader big = h;
  big.capability_length = kMaxCapabilityLength + 1;
  EXPECT_EQ(DecodeRequest(&big, sizeof(big), payload.data(), payload.size()).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<ReadRequest> long_cap = {{"t", {}, std::string(kMaxCapabilityLength + 1, 'x')}};
  EXPECT_EQ(CheckReadRequests(long_cap).code(), StatusCode::kInvalidArgument);
}

TEST(ProtocolTest, RequestRejectsMalformed) {
  std::vector<ReadRun> runs = {{0, 10, nullptr}};
  const std::string payload = EncodeRequestPayload("ab", runs.data(), 1);
  RequestHeader h{kProtocolVersion, 1, 1, 2, 0};
  // Header of the wrong size.
  EXPECT_EQ(DecodeRequest(&h, sizeof(h) - 1, payload.data(), payload.size()).status().code(),
            StatusCode::kInvalidArgument);
  // Other version.
  RequestHeader v2 = h;
  v2.version = 1;
  EXPECT_EQ(DecodeRequest(&v2, sizeof(v2), payload.data(), payload.size()).status().code(),
            StatusCode::kFailedPrecondition);
  // Truncated and overlong payloads.
  for (std::size_t n : {std::size_t{0}, payload.size() - 1, payload.size() + 1}) {
    std::string p = payload;
    p.resize(n);
    EXPECT_EQ(DecodeRequest(&h, sizeof(h), p.data(), p.size()).status().code(),
              StatusCode::kInvalidArgument)
        << n;
  }
  // Counts past the limits, whatever the payload.
  RequestHeader big = h;
  big.run_count = kMaxRunsPerMessage + 1;
  EXPECT_FALSE(DecodeRequest(&big, sizeof(big), payload.data(), payload.size()).ok());
  big = h;
  big.name_length = kMaxNameLength + 1;
  EXPECT_FALSE(DecodeRequest(&big, sizeof(big), payload.data(), payload.size()).ok());
  // Random bytes never crash and are accepted only when consistent.
  std::mt19937 rng(3);
  for (int i = 0; i < 2000; ++i) {
    char hdr[sizeof(RequestHeader)];
    for (char& c : hdr) c = static_cast<char>(rng());
    std::string p(rng() % 64, '\0');
    for (char& c : p) c = static_cast<char>(rng());
    auto r = DecodeRequest(hdr, sizeof(hdr), p.data(), p.size());
    if (r.ok()) {
      EXPECT_EQ(r->runs.size() * sizeof(WireRun) + r->region.size(), p.size());
    }
  }
}

TEST(ProtocolTest, StatusRoundTrip) {
  for (const Status& s : {Status::Ok(), NotFound("no region 'x'"), OutOfRange("run 3"),
                          Unavailable("gone"), Unimplemented("?")}) {
    StatusHeader h = EncodeStatusHeader(9, s);
    EXPECT_EQ(h.request_id, 9u);
    Status back = DecodeStatus(h, s.message());
    EXPECT_EQ(back.code(), s.code());
    EXPECT_EQ(back.message(), s.message());
  }
  StatusHeader bad{kProtocolVersion, 99, 1};
  EXPECT_EQ(DecodeStatus(bad, "").code(), StatusCode::kDataLoss);
  bad = {7, 2, 1};
  EXPECT_EQ(DecodeStatus(bad, "").code(), StatusCode::kDataLoss);
}

TEST(ProtocolTest, CheckRunsBounds) {
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  std::vector<WireRun> ok = {{0, 100}, {100, 0}, {40, 60}, {0, 0}};
  EXPECT_TRUE(CheckRuns("r", 100, ok.data(), ok.size()).ok());
  for (WireRun bad : {WireRun{1, 100}, WireRun{101, 0}, WireRun{max, 2}, WireRun{2, max}}) {
    Status s = CheckRuns("r", 100, &bad, 1);
    EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << bad.offset << "+" << bad.length;
    EXPECT_NE(s.message().find("'r'"), std::string::npos);
  }
  int x = 0;
  EXPECT_TRUE(CheckReadRequests({{"a", {{0, 4, &x}, {5, 0, nullptr}}}}).ok());
  EXPECT_EQ(CheckReadRequests({{"a", {{0, 4, nullptr}}}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckReadRequests({{"a", {{max, 4, &x}}}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckReadRequests({{std::string(kMaxNameLength + 1, 'n'), {}}}).code(),
            StatusCode::kInvalidArgument);
}

// ForEachPiece against a byte-by-byte reference over random runs (some empty).
TEST(ProtocolTest, PiecesMatchBruteForce) {
  std::mt19937 rng(5);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<WireRun> runs(rng() % 8);
    for (auto& r : runs) r = {0, rng() % 3 == 0 ? 0 : rng() % 20};
    const auto starts = StreamStarts(runs.data(), runs.size());
    std::vector<std::pair<std::size_t, uint64_t>> want;  // (run, offset) per stream byte
    for (std::size_t i = 0; i < runs.size(); ++i) {
      for (uint64_t j = 0; j < runs[i].length; ++j) want.push_back({i, j});
    }
    ASSERT_EQ(starts.back(), want.size());
    const uint64_t b = want.empty() ? 0 : rng() % (want.size() + 1);
    const uint64_t e = b + (want.size() - b == 0 ? 0 : rng() % (want.size() - b + 1));
    std::vector<std::pair<std::size_t, uint64_t>> got;
    ForEachPiece(starts, b, e, [&](std::size_t i, uint64_t off, uint64_t len) {
      EXPECT_GT(len, 0u);
      for (uint64_t j = 0; j < len; ++j) got.push_back({i, off + j});
    });
    const std::vector<std::pair<std::size_t, uint64_t>> expected(want.begin() + b,
                                                                 want.begin() + e);
    EXPECT_EQ(got, expected);
  }
}

// Expands runs to (remote offset, destination) per byte.
std::vector<std::pair<uint64_t, char*>> Bytes(const std::vector<ReadRun>& runs) {
  std::vector<std::pair<uint64_t, char*>> out;
  for (const ReadRun& r : runs) {
    for (uint64_t j = 0; j < r.length; ++j) {
      out.push_back({r.offset + j, static_cast<char*>(r.dest) + j});
    }
  }
  return out;
}

TEST(ProtocolTest, SplitReadsKeepsTheBytes) {
  std::mt19937 rng(8);
  std::vector<char> dst(1 << 16);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<ReadRun> runs(rng() % 12);
    uint64_t at = 0;
    for (auto& r : runs) {
      r = {rng() % 1000, rng() % 4 == 0 ? 0 : rng() % 300, dst.data() + at};
      at += r.length;
    }
    const uint32_t max_runs = 1 + rng() % 4;
    const uint64_t max_bytes = 1 + rng() % 200;
    auto groups = SplitReads(runs, max_runs, max_bytes);
    ASSERT_FALSE(groups.empty());
    std::vector<ReadRun> joined;
    for (const auto& g : groups) {
      EXPECT_LE(g.size(), max_runs);
      uint64_t bytes = 0;
      for (const ReadRun& r : g) bytes += r.length;
      EXPECT_LE(bytes, max_bytes);
      if (groups.size() > 1) {
        EXPECT_FALSE(g.empty());
      }
      joined.insert(joined.end(), g.begin(), g.end());
    }
    EXPECT_EQ(Bytes(joined), Bytes(runs));
  }
  EXPECT_EQ(SplitReads({}, 4, 100).size(), 1u);
}

TEST(ProtocolTest, PlanMessagesCoversTheStream) {
  std::mt19937 rng(9);
  for (int iter = 0; iter < 500; ++iter) {
    std::vector<WireRun> runs(rng() % 10);
    for (auto& r : runs) r = {0, rng() % 5 == 0 ? 0 : rng() % 100};
    const auto starts = StreamStarts(runs.data(), runs.size());
    const uint64_t max_message = 10 + rng() % 60, max_packed = 5 + rng() % 40;
    const uint64_t direct = 1 + rng() % max_packed;
    const auto msgs = PlanMessages(starts, max_message, max_packed, direct);
    uint64_t at = 0;
    for (auto [b, e] : msgs) {
      EXPECT_EQ(b, at);
      EXPECT_LT(b, e);
      EXPECT_LE(e - b, max_message);
      // A message is one piece of a long run, or short runs only.
      int pieces = 0;
      bool long_run = false;  // a run sent on its own
      ForEachPiece(starts, b, e, [&](std::size_t i, uint64_t, uint64_t) {
        ++pieces;
        long_run |= runs[i].length >= direct || runs[i].length > std::min(max_packed, max_message);
      });
      if (long_run) {
        EXPECT_EQ(pieces, 1);
      } else {
        EXPECT_LE(e - b, max_packed);
      }
      at = e;
    }
    EXPECT_EQ(at, starts.back());
  }
}

TEST(ProtocolTest, AddressTokens) {
  const std::string payload("\x00\x01\xfe\xff worker", 11);
  const std::string token = EncodeAddress("ucx", payload);
  EXPECT_EQ(token.find(' '), std::string::npos);
  auto back = DecodeAddress("ucx", token);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, payload);
  EXPECT_EQ(DecodeAddress("inproc", token).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(DecodeAddress("ucx", token.substr(0, token.size() - 1)).ok());
  EXPECT_FALSE(DecodeAddress("ucx", "ucx").ok());
  EXPECT_FALSE(DecodeAddress("ucx", "ucx:zz:0000000000000000").ok());
  EXPECT_FALSE(DecodeAddress("ucx", "").ok());
  // Every single-character change is caught.
  for (std::size_t i = 4; i < token.size(); ++i) {
    std::string t = token;
    t[i] = t[i] == '0' ? '1' : '0';
    EXPECT_FALSE(DecodeAddress("ucx", t).ok()) << i;
  }
}

TEST(ProtocolTest, ProbeRegion) {
  const Region& p = ProbeRegion();
  ASSERT_EQ(p.size, kProbeRegionBytes);
  const uint8_t* b = static_cast<const uint8_t*>(p.data);
  for (uint64_t i :
       {uint64_t{0}, uint64_t{1}, uint64_t{4095}, uint64_t{4096}, kProbeRegionBytes - 1}) {
    EXPECT_EQ(b[i], ProbeByte(i));
  }
  EXPECT_EQ(FindRegion(nullptr, "x", "").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(FindRegion(nullptr, kProbeRegion, "").ok());
  // The lookup sees the capability; the probe region needs none.
  RegionLookup strict = [](std::string_view, std::string_view cap) -> Result<Region> {
    if (cap != "yes") return PermissionDenied("no");
    return ProbeRegion();
  };
  EXPECT_EQ(FindRegion(strict, "x", "").status().code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(FindRegion(strict, "x", "yes").ok());
  EXPECT_TRUE(FindRegion(strict, kProbeRegion, "").ok());
}

}  // namespace
}  // namespace tenplex::transport
