// A host's commit fails after the others committed (TENPLEX_FAULT_COMMIT=last,
// cluster/two_phase.h), under each C++ caller of the one commit protocol: the
// distributed transform's coordinator, PrepareAndCommit (what the Python binding's
// cluster_prepare_commit runs) and the runtime's cluster backend (`tenplex run
// --cluster`). The outcome is the same for all: the call fails with DataLoss, nothing is
// aborted, and the next recovery rolls the version forward on every host, whose state
// then is that version with its info. tests/commit_fault_test.py does the same through
// the Python binding with real daemons.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tenplex/cluster/distributed.h"
#include "tenplex/cluster/test_hosts.h"
#include "tenplex/cluster/two_phase.h"
#include "tenplex/runtime/backend.h"
#include "tenplex/util/file.h"

namespace tenplex::runtime {
namespace {

using io::Cluster;
using nlohmann::json;

// Sets TENPLEX_FAULT_COMMIT=last for its lifetime.
class CommitFault {
 public:
  CommitFault() { ::setenv(cluster::kCommitFaultEnv, "last", 1); }
  ~CommitFault() { ::unsetenv(cluster::kCommitFaultEnv); }
};

class CommitFaultTest : public cluster::test_hosts::HostsFixture {
 protected:
  std::vector<std::unique_ptr<store::Client>> Connect(const Cluster& c) {
    auto clients = cluster::ConnectCluster(c, {});
    EXPECT_TRUE(clients.ok()) << clients.status().ToString();
    if (!clients.ok()) return {};
    return std::move(*clients);
  }

  static std::vector<store::Client*> Raw(const std::vector<std::unique_ptr<store::Client>>& cs) {
    std::vector<store::Client*> raw;
    for (const auto& c : cs) raw.push_back(c.get());
    return raw;
  }

  // Which hosts have v committed, prepared (not committed) or neither.
  struct States {
    int committed = 0, prepared = 0;
  };
  States StatesOf(const Cluster& c, uint64_t v) {
    States s;
    for (const std::string& u : c.hosts) {
      Result<store::VersionInfo> vi = StoreOf(u)->Version("j", v);
      if (vi.ok() && vi->committed) ++s.committed;
      if (vi.ok() && !vi->committed && vi->prepared) ++s.prepared;
    }
    return s;
  }

  // The same outcome for every caller: v committed on all but the last host (prepared
  // there); the owner recovery rolls it forward; every host's current version is v then,
  // with the same info, and the old version is released.
  void ExpectRolledForward(const Cluster& c, uint64_t v) {
    States before = StatesOf(c, v);
    EXPECT_EQ(before.committed, static_cast<int>(c.hosts.size()) - 1);
    EXPECT_EQ(before.prepared, 1);
    auto clients = Connect(c);
    Result<cluster::Resolution> r =
        cluster::ResolvePending(c.hosts, Raw(clients), "j", /*owner=*/true);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->committed, std::vector<uint64_t>{v});
    EXPECT_TRUE(r->aborted.empty());
    std::string info;
    for (const std::string& u : c.hosts) {
      Result<store::VersionInfo> cur = StoreOf(u)->Version("j", std::nullopt);
      ASSERT_TRUE(cur.ok()) << u << ": " << cur.status().ToString();
      EXPECT_EQ(cur->version, v) << u;
      if (info.empty()) info = cur->info;
      EXPECT_EQ(cur->info, info) << u;
      EXPECT_FALSE(StoreOf(u)->Version("j", v - 1).ok()) << u << ": the old version is kept";
    }
  }
};

TEST_F(CommitFaultTest, TheCoordinatorsFailedCommitIsRolledForward) {
  Cluster c = ClusterOf({0, 1, 2}, 2);
  Load(c, "tp=2,dp=3");
  cluster::ClusterTransformOptions o;
  o.max_attempts = 1;
  auto fault = std::make_unique<CommitFault>();
  Result<cluster::ClusterTransformStats> s =
      cluster::TransformCluster(c, "j", *ParseConfig("pp=2,dp=3"), {}, o);
  fault.reset();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << s.status().ToString();
  ExpectRolledForward(c, 2);
  Result<store::VersionInfo> cur = StoreOf(c.hosts[0])->Version("j", std::nullopt);
  ASSERT_TRUE(cur.ok());
  EXPECT_EQ(io::StateInfo::Parse(cur->info)->config().ToString(), "tp=1,pp=2,dp=3");
}

TEST_F(CommitFaultTest, PrepareAndCommitsFailedCommitIsRolledForward) {
  Cluster c = ClusterOf({0, 1, 2}, 2);
  Load(c, "tp=2,dp=3");
  Write(c, "tp=2,dp=3", 2);
  auto clients = Connect(c);
  auto fault = std::make_unique<CommitFault>();
  Result<cluster::CommitOutcome> out = cluster::PrepareAndCommit(Raw(clients), {0, 1, 2}, "j", 2);
  fault.reset();
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kDataLoss) << out.status().ToString();
  // A caller that aborts after the failure aborts nothing: the first host committed.
  Status a = cluster::AbortEverywhere(Raw(clients), {0, 1, 2}, "j", 2);
  EXPECT_EQ(a.code(), StatusCode::kFailedPrecondition) << a.ToString();
  ExpectRolledForward(c, 2);
}

TEST_F(CommitFaultTest, TheRuntimesFailedCommitIsRolledForward) {
  Cluster c = ClusterOf({0, 1, 2}, 2);
  Load(c, "tp=2,dp=3");
  const std::string dir = ::testing::TempDir() + "/commit_fault_runtime";
  std::filesystem::create_directories(dir);
  RunOptions o;
  o.cluster_path = dir + "/cluster.json";
  o.work_dir = dir + "/work";
  ASSERT_TRUE(WriteFileAtomic(o.cluster_path, io::ClusterJson(c).dump()).ok());
  uint64_t v = 0;
  {
    Result<std::unique_ptr<StateBackend>> b = OpenClusterBackend(o);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    Result<std::optional<StateBackend::Committed>> cur = (*b)->Current("j");
    ASSERT_TRUE(cur.ok() && cur->has_value()) << cur.status().ToString();
    EXPECT_EQ((*cur)->version, 1u);
    io::StateInfo info = (*cur)->info;
    info.set_step(7);
    info.set_samples_consumed(56);
    Layout layout = *MakeLayout(model_, info.config());
    Result<uint64_t> begun = (*b)->BeginLayout("j", layout, info);
    ASSERT_TRUE(begun.ok()) << begun.status().ToString();
    v = *begun;
    Status s;
    {
      CommitFault fault;
      s = (*b)->Commit("j", v, info);
    }
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    (*b)->Drop("j", v);  // what a failed segment does: aborts nothing committed
  }
  ExpectRolledForward(c, v);
  // The next run continues from it.
  Result<std::unique_ptr<StateBackend>> b = OpenClusterBackend(o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  Result<std::optional<StateBackend::Committed>> cur = (*b)->Current("j");
  ASSERT_TRUE(cur.ok() && cur->has_value()) << cur.status().ToString();
  EXPECT_EQ((*cur)->version, v);
  EXPECT_EQ((*cur)->info.step(), 7);
  EXPECT_EQ((*cur)->info.samples_consumed(), 56);
}

}  // namespace
}  // namespace tenplex::runtime
