// Issue 35 finding 6: once a transform is over (committed or aborted), every host of it
// refuses its capabilities, also a host that got no ranks of the new version and only
// gave its tensors away (it never commits the new version); and the transforms go on.
#include "tenplex/cluster/revocation.h"

#include <gtest/gtest.h>

#include "tenplex/cluster/test_hosts.h"
#include "tenplex/cluster/two_phase.h"
#include "tenplex/transport/capability.h"

namespace tenplex::cluster {
namespace {

class RevocationTest : public test_hosts::HostsFixture {
 protected:
  // Reads the first bytes of a version-1 tensor of host h with `capability`, over the
  // data plane as a participant of a transform does.
  Status ReadFrom(int h, const std::string& capability) {
    store::Store& st = *hosts_[h]->store;
    Result<std::vector<store::TensorInfo>> list = st.List("jobs/j/1/");
    if (!list.ok() || list->empty()) return NotFound("host has no version 1");
    Result<std::unique_ptr<transport::Transport>> client =
        transport::NewTransport("inproc", nullptr);
    if (!client.ok()) return client.status();
    TP_ASSIGN_OR_RETURN(transport::PeerId peer, (*client)->Connect(hosts_[h]->agent->address()));
    std::vector<uint8_t> got(std::min<uint64_t>(64, (*list)[0].bytes));
    return (*client)->Fetch(peer, {{(*list)[0].path, {{0, got.size(), got.data()}}, capability}});
  }
  // The capability the participant of the transform 1 -> to minted for host h.
  std::string CapabilityFor(int h, uint64_t to) {
    const std::string inc = hosts_[h]->store->Job("j")->incarnation;
    return transport::MintCapability("", {"j", 1, to, transport::UnixSeconds() + 900, inc});
  }
};

TEST_F(RevocationTest, HostsWithoutNewRanksRefuseAfterAbortAndCommit) {
  // Rank 0 on host 0, rank 1 on host 1; then all of it onto host 1: host 0 gets no rank
  // of the new version and only gives its half away.
  Load(ClusterOf({0, 1}, 1), "tp=2");
  ClusterTransformOptions o;
  o.to = ClusterOf({1}, 1);
  ASSERT_TRUE(ReadFrom(0, CapabilityFor(0, 2)).ok());
  // Abort: host 1 cannot allocate the new version (its memory is all reserved).
  store::Store& one = *hosts_[1]->store;
  Result<std::shared_ptr<void>> full =
      one.Reserve(one.memory_limit() - one.used_bytes(), "the test's full host");
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  Result<ClusterTransformStats> failed =
      TransformCluster(ClusterOf({0, 1}, 1), "j", *ParseConfig("tp=1"), {}, o);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kResourceExhausted) << failed.status().ToString();
  EXPECT_EQ(hosts_[0]->store->Job("j")->closed, 2u);
  Status s = ReadFrom(0, CapabilityFor(0, 2));
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find("is over"), std::string::npos) << s.ToString();
  // Commit (the next number, 3): exact, and host 0 refuses its capabilities after it.
  full->reset();
  ASSERT_TRUE(ReadFrom(0, CapabilityFor(0, 3)).ok());
  Result<ClusterTransformStats> done =
      TransformCluster(ClusterOf({0, 1}, 1), "j", *ParseConfig("tp=1"), {}, o);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->to_version, 3u);
  Verify(*done, "tp=1", 1);
  EXPECT_EQ(hosts_[0]->store->Job("j")->current, 1u);  // it never commits 3
  EXPECT_EQ(hosts_[0]->store->Job("j")->closed, 3u);
  s = ReadFrom(0, CapabilityFor(0, 3));
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
}

// A coordinator died after every participant prepared version 2 (only host 1 gets
// ranks); the next owner's recovery rolls it forward and closes it on host 0 too.
TEST_F(RevocationTest, RecoveryClosesOnHostsWithoutRanks) {
  Load(ClusterOf({0, 1}, 1), "tp=2");
  Write(ClusterOf({1}, 1), "tp=1", 2);
  ASSERT_TRUE(hosts_[1]->store->Prepare("j", 2).ok());
  ASSERT_TRUE(ReadFrom(0, CapabilityFor(0, 2)).ok());
  std::vector<std::unique_ptr<store::Client>> owned;
  std::vector<store::Client*> clients;
  std::vector<std::string> urls;
  for (int h : {0, 1}) {
    owned.push_back(std::move(*store::Client::Connect(hosts_[h]->url)));
    clients.push_back(owned.back().get());
    urls.push_back(hosts_[h]->url);
  }
  Result<Resolution> r = ResolvePending(urls, clients, "j", /*owner=*/true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->committed, (std::vector<uint64_t>{2}));
  EXPECT_EQ(hosts_[0]->store->Job("j")->closed, 2u);
  EXPECT_EQ(ReadFrom(0, CapabilityFor(0, 2)).code(), StatusCode::kPermissionDenied);
}

TEST(RevocationHostsTest, HostsExceptAndSkippedClients) {
  EXPECT_EQ(HostsExcept(5, {1, 3, 7, -1}), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(HostsExcept(2, {}), (std::vector<int>{0, 1}));
  // No live client: nothing to tell, nothing confirmed.
  EXPECT_EQ(CloseTransform({nullptr, nullptr}, {0, 1, 1, 5, -2}, "j", 2), 0);
}

}  // namespace
}  // namespace tenplex::cluster
