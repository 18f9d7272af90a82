// The commit order and the decision record of the two-phase commit (two_phase.h):
// participants are committed in ascending host id whatever the caller's host order, the
// first alone first; a version whose first participant answers with it only prepared
// is rolled back by an owner's recovery even when another participant is lost for good
// (issue 34: such a version used to stay "undecided" and refuse every newer version
// until it was removed by hand on every daemon).
#include <gtest/gtest.h>

#include <algorithm>

#include "tenplex/cluster/test_hosts.h"
#include "tenplex/cluster/two_phase.h"

namespace tenplex::cluster {
namespace {

class CommitOrderTest : public test_hosts::HostsFixture {
 protected:
  void SetUp() override {
    HostsFixture::SetUp();
    cluster_ = ClusterOf({0, 1, 2}, 2);
    Load(cluster_, kConfig);
    // Version 2's placement records the hosts' ids, as every coordinator's does.
    Write(cluster_, kConfig, 2, WithHostIds(cluster_, Connect()));
    for (const std::string& u : cluster_.hosts) ASSERT_TRUE(StoreOf(u)->Prepare("j", 2).ok());
    // Host indexes of the cluster in commit order (ascending host id).
    for (int h = 0; h < 3; ++h) order_.push_back(h);
    std::sort(order_.begin(), order_.end(), [&](int a, int b) {
      return StoreOf(cluster_.hosts[a])->host_id() < StoreOf(cluster_.hosts[b])->host_id();
    });
  }

  // Clients of the hosts that are alive (null for a killed one).
  std::vector<store::Client*> Connect() {
    owned_.clear();
    std::vector<store::Client*> raw;
    for (int h = 0; h < 3; ++h) {
      Result<std::unique_ptr<store::Client>> c = store::Client::Connect(cluster_.hosts[h]);
      owned_.push_back(c.ok() ? std::move(*c) : nullptr);
      raw.push_back(owned_.back().get());
    }
    return raw;
  }

  // What host h's store holds of version v: "none", "prepared" or "committed".
  std::string StateOn(int h, uint64_t v) {
    Result<store::VersionInfo> vi = StoreOf(cluster_.hosts[h])->Version("j", v);
    if (!vi.ok()) return "none";
    return vi->committed ? "committed" : (vi->prepared ? "prepared" : "open");
  }

  static constexpr const char* kConfig = "tp=2,pp=1,dp=3";
  Cluster cluster_;
  std::vector<int> order_;
  std::vector<std::unique_ptr<store::Client>> owned_;
};

// The coordinator died after every host prepared version 2, and the last host in commit
// order is lost for good: the first answers with 2 only prepared, so nobody committed it
// and the owner's recovery rolls it back; a new version can begin.
TEST_F(CommitOrderTest, ALostParticipantDoesNotLeaveTheVersionUndecided) {
  hosts_[order_[2]]->Kill();
  std::vector<store::Client*> clients = Connect();
  Result<Resolution> r = ResolvePending(cluster_.hosts, clients, "j", /*owner=*/true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->aborted, (std::vector<uint64_t>{2}));
  EXPECT_TRUE(r->pending.empty());
  for (int h : {order_[0], order_[1]}) {
    EXPECT_EQ(StateOn(h, 2), "none") << h;
    EXPECT_EQ(StoreOf(cluster_.hosts[h])->Job("j")->current, std::optional<uint64_t>(1));
    EXPECT_TRUE(clients[h]->BeginVersion("j", 3, "{}").ok());
  }
}

// A reader (save) never rolls back: the same picture leaves the version undecided.
TEST_F(CommitOrderTest, AReaderLeavesItUndecided) {
  hosts_[order_[2]]->Kill();
  std::vector<store::Client*> clients = Connect();
  Result<Resolution> r = ResolvePending(cluster_.hosts, clients, "j", /*owner=*/false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->pending, (std::vector<uint64_t>{2}));
  EXPECT_EQ(StateOn(order_[0], 2), "prepared");
}

// The first host in commit order is the lost one: it may have committed 2 (the
// decision record is gone), so the version stays undecided and prepared elsewhere.
TEST_F(CommitOrderTest, TheFirstParticipantLostStaysUndecided) {
  hosts_[order_[0]]->Kill();
  std::vector<store::Client*> clients = Connect();
  Result<Resolution> r = ResolvePending(cluster_.hosts, clients, "j", /*owner=*/true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->pending, (std::vector<uint64_t>{2}));
  EXPECT_TRUE(r->aborted.empty());
  EXPECT_EQ(StateOn(order_[1], 2), "prepared");
  EXPECT_EQ(StateOn(order_[2], 2), "prepared");
}

// The first host in commit order is committed first, whatever order the caller lists
// the participants in, and a refusal there (the version is gone: decided abort) stops
// the commit before any other host commits it.
TEST_F(CommitOrderTest, TheFirstHostByIdIsTheDecisionRecord) {
  std::vector<store::Client*> clients = Connect();
  ASSERT_TRUE(clients[order_[0]]->Abort("j", 2).ok());  // a resolver decided abort there
  std::vector<int> listed = {order_[2], order_[1], order_[0]};
  Result<CommitOutcome> c = CommitEverywhere(clients, listed, "j", 2);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDataLoss) << c.status().ToString();
  EXPECT_EQ(StateOn(order_[1], 2), "prepared");
  EXPECT_EQ(StateOn(order_[2], 2), "prepared");
  // And the recovery that follows agrees: rolled back everywhere.
  Result<Resolution> r = ResolvePending(cluster_.hosts, clients, "j", /*owner=*/true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->aborted, (std::vector<uint64_t>{2}));
  for (int h = 0; h < 3; ++h) EXPECT_EQ(StateOn(h, 2), "none") << h;
}

}  // namespace
}  // namespace tenplex::cluster
