// The agent's data plane serves only fetches with a valid capability
// (transport/capability.h): a fetch without one, with a wrong or forged one, an expired
// one, or one for another version is refused and counted.
#include "tenplex/cluster/agent.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>

#include "tenplex/cluster/agent_probe.h"
#include "tenplex/cluster/test_hosts.h"
#include "tenplex/store/parse.h"
#include "tenplex/transport/capability.h"

namespace tenplex::cluster {
namespace {

uint64_t Counter(const std::string& metrics, const std::string& reason) {
  return test_hosts::MetricValue(metrics, "tenplex_fetch_refused_total{reason=\"" + reason + "\"}");
}

// A store with version 1 of job j (tensor `path_`) and an agent serving it under the key
// "the-token", over the transport GetParam(); a client connected to it.
class AgentCapabilityTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    st_ = *store::Store::Open({});
    bytes_.resize(4096);
    std::iota(bytes_.begin(), bytes_.end(), 0);
    Load();
    AgentOptions ao;
    ao.transport = GetParam();
    ao.capability_key = "the-token";
    agent_ = *Agent::Create(*st_, ao);
    Result<std::unique_ptr<transport::Transport>> client =
        transport::NewTransport(GetParam(), nullptr);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(*client);
    Result<transport::PeerId> peer = client_->Connect(agent_->address());
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    peer_ = *peer;
  }
  void Load() {
    ASSERT_TRUE(st_->BeginVersion("j", 1).ok());
    ASSERT_TRUE(st_->Put(path_, DType::kU8, Shape{4096}, bytes_.data(), bytes_.size()).ok());
    ASSERT_TRUE(st_->Commit("j", 1).ok());
  }
  // Reads `region` into got_ (0xee before) with `capability`.
  Status Fetch(const std::string& region, const std::string& capability) {
    got_.assign(bytes_.size(), 0xee);
    return client_->Fetch(peer_, {{region, {{0, got_.size(), got_.data()}}, capability}});
  }

  const std::string path_ = store::TensorPathOf("j", 1, 0, "w");
  std::unique_ptr<store::Store> st_;
  std::vector<uint8_t> bytes_, got_;
  std::unique_ptr<Agent> agent_;
  std::unique_ptr<transport::Transport> client_;
  transport::PeerId peer_{};
};

TEST_P(AgentCapabilityTest, FetchesNeedAValidCapability) {
  store::Store* st = st_.get();
  Agent* agent = agent_.get();
  const std::string& path = path_;
  const std::vector<uint8_t>& bytes = bytes_;
  const std::vector<uint8_t>& got = got_;
  auto fetch = [&](const std::string& region, const std::string& capability) {
    return Fetch(region, capability);
  };
  const int64_t now = transport::UnixSeconds();
  const std::string inc = st->Job("j")->incarnation;
  ASSERT_EQ(inc.size(), 16u);
  const std::string good = transport::MintCapability("the-token", {"j", 1, 2, now + 60, inc});
  struct Case {
    std::string what, capability, reason;
  };
  const std::vector<Case> refused = {
      {"none", "", "missing"},
      {"garbage", "let me in", "wrong"},
      {"another key", transport::MintCapability("a-guess", {"j", 1, 2, now + 60, inc}), "wrong"},
      {"expired", transport::MintCapability("the-token", {"j", 1, 2, now - 1, inc}), "expired"},
      {"another version", transport::MintCapability("the-token", {"j", 7, 8, now + 60, inc}),
       "scope"},
      {"another job", transport::MintCapability("the-token", {"k", 1, 2, now + 60, inc}), "scope"},
      {"another incarnation",
       transport::MintCapability(
           "the-token",
           {"j", 1, 2, now + 60, inc == "0123456789abcdef" ? "1" : "0123456789abcdef"}),
       "scope"},
      {"no incarnation", transport::MintCapability("the-token", {"j", 1, 2, now + 60}), "scope"},
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
    return client_->Fetch(
        peer_, {{std::string(transport::kProbeRegion), {{0, 64, probe.data()}}, capability}});
  };
  EXPECT_EQ(read_probe("").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(read_probe(good).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(read_probe(transport::MintProbeCapability("a-guess")).code(),
            StatusCode::kPermissionDenied);
  ASSERT_TRUE(read_probe(transport::MintProbeCapability("the-token")).ok());
  EXPECT_EQ(probe[5], transport::ProbeByte(5));
  // The agent's scratch region (agent_probe.h) is checked the same way, before it is
  // looked for, and its refusals are counted by reason (they were not).
  auto read_scratch = [&](const std::string& capability) {
    return client_->Fetch(
        peer_, {{std::string(AgentProber::kScratchRegion), {{0, 64, probe.data()}}, capability}});
  };
  for (const Case& c :
       std::vector<Case>{{"none", "", "missing"},
                         {"a job's", good, "scope"},
                         {"another key's", transport::MintProbeCapability("a-guess"), "wrong"}}) {
    const std::string before = agent->metrics();
    EXPECT_EQ(read_scratch(c.capability).code(), StatusCode::kPermissionDenied) << c.what;
    EXPECT_EQ(Counter(agent->metrics(), c.reason), Counter(before, c.reason) + 1) << c.what;
  }
  // Admitted, it is not there until this daemon was probed itself.
  EXPECT_EQ(read_scratch(transport::MintProbeCapability("the-token")).code(),
            StatusCode::kNotFound);
  // Once this daemon committed the transform's new version, its capability is dead.
  ASSERT_TRUE(st->BeginVersion("j", 2).ok());
  ASSERT_TRUE(st->Commit("j", 2, /*keep_old=*/true).ok());
  const std::string before = agent->metrics();
  EXPECT_EQ(fetch(path, good).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(Counter(agent->metrics(), "expired"), Counter(before, "expired") + 1);
  // A capability of the next transform reads the kept old version again.
  EXPECT_TRUE(fetch(path, transport::MintCapability("the-token", {"j", 1, 3, now + 60, inc})).ok());
}

// Issue 35 finding 6: a capability of a job that was deleted and created again under the
// same name is refused (it names the old incarnation), and so is one whose transform
// was closed here (the host got no ranks of the new version) or aborted here.
TEST_P(AgentCapabilityTest, RecreatedJobsAndClosedTransformsRefuse) {
  store::Store* st = st_.get();
  Agent* agent = agent_.get();
  auto fetch = [&](const std::string& capability) { return Fetch(path_, capability); };
  auto load = [&] { Load(); };
  const std::vector<uint8_t>& bytes = bytes_;
  const std::vector<uint8_t>& got = got_;
  auto cap = [&](uint64_t to, const std::string& inc) {
    return transport::MintCapability("the-token", {"j", 1, to, transport::UnixSeconds() + 60, inc});
  };
  const std::string first = st->Job("j")->incarnation;
  const std::string old = cap(2, first);
  ASSERT_TRUE(fetch(old).ok());
  // Deleted and created again with the same content: a new incarnation.
  ASSERT_TRUE(st->DeleteJob("j").ok());
  load();
  const std::string second = st->Job("j")->incarnation;
  EXPECT_NE(second, first);
  std::string before = agent->metrics();
  Status s = fetch(old);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find("another incarnation"), std::string::npos) << s.ToString();
  EXPECT_EQ(got[0], 0xee);
  EXPECT_EQ(Counter(agent->metrics(), "scope"), Counter(before, "scope") + 1);
  ASSERT_TRUE(fetch(cap(2, second)).ok());
  EXPECT_EQ(got, bytes);
  // The coordinator closed the transform to 2 here (this host got no ranks of it).
  ASSERT_TRUE(st->CloseTransforms("j", 2).ok());
  before = agent->metrics();
  EXPECT_EQ(fetch(cap(2, second)).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(Counter(agent->metrics(), "expired"), Counter(before, "expired") + 1);
  ASSERT_TRUE(fetch(cap(3, second)).ok());
  // A transform to 3 aborted here (its open version dropped): over too.
  ASSERT_TRUE(st->BeginVersion("j", 3).ok());
  ASSERT_TRUE(st->DropVersion("j", 3).ok());
  EXPECT_EQ(fetch(cap(3, second)).code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(fetch(cap(4, second)).ok());
}

INSTANTIATE_TEST_SUITE_P(Kinds, AgentCapabilityTest, ::testing::Values("inproc", "ucx"));

}  // namespace
}  // namespace tenplex::cluster
