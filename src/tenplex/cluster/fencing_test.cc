// Issue 34 finding 7: two coordinators of one job are fenced by their version numbers
// (two_phase.h). Real store servers and clients in one process, the job's state from
// the synthetic oracle. It used to wedge: version 2 prepared everywhere below the
// committed version 3, its commit refused, and recovery, transforms and saves failing
// on it from then on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "tenplex/cluster/checkpoint_transfer.h"
#include "tenplex/cluster/test_hosts.h"
#include "tenplex/cluster/two_phase.h"

namespace tenplex::cluster {
namespace {

bool Says(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

class FencingTest : public test_hosts::HostsFixture {
 protected:
  void SetUp() override {
    HostsFixture::SetUp();
    cluster_ = ClusterOf({0, 1}, 2);
    for (const std::string& u : cluster_.hosts) {
      owned_.push_back(*store::Client::Connect(u));
      clients_.push_back(owned_.back().get());
    }
    Load(cluster_, kConfig);
  }

  // Every daemon is at `version` and holds no other version of the job.
  void ExpectAllAt(uint64_t version) {
    for (const std::string& u : cluster_.hosts) {
      Result<store::JobInfo> j = StoreOf(u)->Job("j");
      ASSERT_TRUE(j.ok()) << j.status().ToString();
      EXPECT_EQ(j->current, std::optional<uint64_t>(version)) << u;
      EXPECT_EQ(j->versions.size(), 1u) << u;
    }
  }

  // After the race: recovery, a transform (checked element by element) and a save of
  // the cluster all succeed.
  void ExpectTheJobGoesOn() {
    Result<Resolution> r = ResolvePending(cluster_.hosts, clients_, "j", /*owner=*/true);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const std::string out = "/tmp/tenplex-fence-" + std::to_string(::getpid());
    Result<TransferStats> saved = SaveCheckpointFromCluster(cluster_, owned_, "j", out);
    std::filesystem::remove_all(out);
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    Result<ClusterTransformStats> t =
        TransformCluster(cluster_, "j", *ParseConfig("tp=1,pp=2,dp=2"), {});
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    Verify(*t, "tp=1,pp=2,dp=2", 2);
    ExpectAllAt(t->to_version);
  }

  static constexpr const char* kConfig = "tp=2,pp=2,dp=1";
  Cluster cluster_;
  std::vector<std::unique_ptr<store::Client>> owned_;
  std::vector<store::Client*> clients_;
};

// Coordinator A (a load) begins version 2 everywhere; coordinator B (a transform)
// begins 3 everywhere, prepares and commits it. A loses before its decision: its
// prepare and commit fail on every host saying why; nothing is wedged.
TEST_F(FencingTest, ANewerBeginSupersedesAnOlderCoordinator) {
  Write(cluster_, kConfig, 2);  // A
  Write(cluster_, kConfig, 3);  // B
  for (store::Client* c : clients_) ASSERT_TRUE(c->Prepare("j", 3).ok());
  Result<CommitOutcome> b = CommitEverywhere(clients_, {0, 1}, "j", 3);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  for (store::Client* c : clients_) {
    Status s = c->Prepare("j", 2);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_TRUE(Says(s,
                     "version 2 of job 'j' was superseded by version 3 begun by another "
                     "coordinator"))
        << s.ToString();
  }
  Result<CommitOutcome> a = CommitEverywhere(clients_, {0, 1}, "j", 2);
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(Says(a.status(), "superseded by version 3")) << a.status().ToString();
  // A reader's recovery already removes A's leftovers (older than the current version).
  Result<Resolution> r = ResolvePending(cluster_.hosts, clients_, "j", /*owner=*/false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->aborted, (std::vector<uint64_t>{2}));
  ExpectAllAt(3);
  ExpectTheJobGoesOn();
}

// A prepared everywhere first: B cannot begin (a prepared version is never superseded:
// A may have decided), so A commits and wins; the job goes on from A's version.
TEST_F(FencingTest, APreparedVersionWinsOverANewerBegin) {
  Write(cluster_, kConfig, 2);
  for (store::Client* c : clients_) ASSERT_TRUE(c->Prepare("j", 2).ok());
  for (store::Client* c : clients_) {
    Result<uint64_t> b = c->BeginVersion("j", 3, "{}");
    EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Says(b.status(), "version 2 is prepared here")) << b.status().ToString();
  }
  // A transform started now (B) cannot go over it either: its recovery rolls A forward.
  Result<CommitOutcome> a = CommitEverywhere(clients_, {0, 1}, "j", 2);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ExpectAllAt(2);
  ExpectTheJobGoesOn();
}

// B's transform was computed from version 1 but A committed 2 on a host before B
// began there: B's begin is refused (its result would replace A's commit unseen).
TEST_F(FencingTest, ABeginMadeFromAnOlderVersionIsRefused) {
  Write(cluster_, kConfig, 2);
  for (store::Client* c : clients_) ASSERT_TRUE(c->Prepare("j", 2).ok());
  ASSERT_TRUE(CommitEverywhere(clients_, {0, 1}, "j", 2).ok());
  Result<uint64_t> b = StoreOf(cluster_.hosts[0])->BeginVersion("j", 3, "{}", /*made_from=*/1);
  EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Says(b.status(), "version 2 was committed here meanwhile")) << b.status().ToString();
}

}  // namespace
}  // namespace tenplex::cluster
