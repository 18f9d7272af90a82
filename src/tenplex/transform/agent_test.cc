// The agent's data plane serves only fetches with a valid capability
// (transport/capability.h): a fetch without one, with a wrong or forged one, an expired
// one, or one for another version is refused and counted.
#include "tenplex/transform/agent.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>

#include "tenplex/store/parse.h"
#include "tenplex/transport/capability.h"

namespace tenplex::transform {
namespace {

uint64_t Counter(const std::string& metrics, const std::string& reason) {
  const std::string key = "tenplex_fetch_refused_total{reason=\"" + reason + "\"} ";
  const std::size_t at = metrics.find(key);
  if (at == std::string::npos) return ~uint64_t{0};
  return std::stoull(metrics.substr(at + key.size()));
}

class AgentCapabilityTest : public ::testing::TestWithParam<const char*> {};

TEST_P(AgentCapabilityTest, FetchesNeedAValidCapability) {
  const std::string kind = GetParam();
  std::unique_ptr<store::Store> st = *store::Store::Open({});
  std::vector<uint8_t> bytes(4096);
  std::iota(bytes.begin(), bytes.end(), 0);
  const std::string path = store::TensorPathOf("j", 1, 0, "w");
  ASSERT_TRUE(st->BeginVersion("j", 1).ok());
  ASSERT_TRUE(st->Put(path, DType::kU8, Shape{4096}, bytes.data(), bytes.size()).ok());
  ASSERT_TRUE(st->Commit("j", 1).ok());
  AgentOptions ao;
  ao.transport = kind;
  ao.capability_key = "the-token";
  std::unique_ptr<Agent> agent = *Agent::Create(*st, ao);

  Result<std::unique_ptr<transport::Transport>> client = transport::NewTransport(kind, nullptr);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Result<transport::PeerId> peer = (*client)->Connect(agent->address());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  std::vector<uint8_t> got(bytes.size());
  auto fetch = [&](const std::string& region, const std::string& capability) {
    std::fill(got.begin(), got.end(), 0xee);
    return (*client)->Fetch(*peer, {{region, {{0, got.size(), got.data()}}, capability}});
  };
  const int64_t now = transport::UnixSeconds();
  const std::string good = transport::MintCapability("the-token", {"j", 1, 2, now + 60});
  struct Case {
    std::string what, capability, reason;
  };
  const std::vector<Case> refused = {
      {"none", "", "missing"},
      {"garbage", "let me in", "wrong"},
      {"another key", transport::MintCapability("a-guess", {"j", 1, 2, now + 60}), "wrong"},
      {"expired", transport::MintCapability("the-token", {"j", 1, 2, now - 1}), "expired"},
      {"another version", transport::MintCapability("the-token", {"j", 7, 8, now + 60}), "scope"},
      {"another job", transport::MintCapability("the-token", {"k", 1, 2, now + 60}), "scope"},
  };
  for (const Case& c : refused) {
    const std::string before = agent->metrics();
    Status s = fetch(path, c.capability);
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << c.what << ": " << s.ToString();
    EXPECT_EQ(got[0], 0xee) << c.what;
    EXPECT_EQ(Counter(agent->metrics(), c.reason), Counter(before, c.reason) + 1) << c.what;
  }
  // A valid one reads the bytes; the probe region needs a probe capability (issue 35:
  // it was open to anyone reaching the endpoint), and a job's capability is not one.
  Status ok = fetch(path, good);
  ASSERT_TRUE(ok.ok()) << ok.ToString();
  EXPECT_EQ(got, bytes);
  std::vector<uint8_t> probe(64);
  auto read_probe = [&](const std::string& capability) {
    return (*client)->Fetch(
        *peer, {{std::string(transport::kProbeRegion), {{0, 64, probe.data()}}, capability}});
  };
  EXPECT_EQ(read_probe("").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(read_probe(good).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(read_probe(transport::MintProbeCapability("a-guess")).code(),
            StatusCode::kPermissionDenied);
  ASSERT_TRUE(read_probe(transport::MintProbeCapability("the-token")).ok());
  EXPECT_EQ(probe[5], transport::ProbeByte(5));
  // Once this daemon committed the transform's new version, its capability is dead.
  ASSERT_TRUE(st->BeginVersion("j", 2).ok());
  ASSERT_TRUE(st->Commit("j", 2, /*keep_old=*/true).ok());
  const std::string before = agent->metrics();
  EXPECT_EQ(fetch(path, good).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(Counter(agent->metrics(), "expired"), Counter(before, "expired") + 1);
  // A capability of the next transform reads the kept old version again.
  EXPECT_TRUE(fetch(path, transport::MintCapability("the-token", {"j", 1, 3, now + 60})).ok());
}

INSTANTIATE_TEST_SUITE_P(Kinds, AgentCapabilityTest, ::testing::Values("inproc", "ucx"));

}  // namespace
}  // namespace tenplex::transform
