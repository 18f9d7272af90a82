// The coordinator's side of the job leases (job_lease.h; issue 34 finding 7) against
// real store daemons with their agents in one process: a second coordinator waits for
// the lease or fails naming the first, the renewal keeps a short lease alive, a lease
// nobody renews expires, a renewal refused by another holder shows in Held(), the
// agents' begin is fenced, and a transform refuses one daemon listed under two URLs.
#include "tenplex/cluster/job_lease.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <thread>

#include "tenplex/cluster/test_hosts.h"

namespace tenplex::cluster {
namespace {

using Clock = std::chrono::steady_clock;

bool Says(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The clients of one coordinator on some hosts.
struct Coordinator {
  store::ClientOptions options;
  std::vector<std::unique_ptr<store::Client>> owned;
  std::vector<store::Client*> raw;

  Result<std::unique_ptr<JobLease>> Acquire(int64_t ttl_ms, double wait_s) {
    return JobLease::Acquire(raw, "j", options, {ttl_ms, wait_s});
  }
};

class JobLeaseTest : public test_hosts::HostsFixture {
 protected:
  Coordinator Connect(const std::string& name, const std::vector<int>& which = {0, 1, 2}) {
    Coordinator c;
    c.options.coordinator = name;
    for (int h : which) {
      Result<std::unique_ptr<store::Client>> cl = store::Client::Connect(hosts_[h]->url, c.options);
      EXPECT_TRUE(cl.ok()) << cl.status().ToString();
      if (!cl.ok()) continue;
      c.owned.push_back(std::move(*cl));
      c.raw.push_back(c.owned.back().get());
    }
    return c;
  }

  // The holder of job j's lease on each of the hosts ("" where none is live).
  std::vector<std::string> Holders(const std::vector<int>& which = {0, 1, 2}) {
    std::vector<std::string> out;
    for (int h : which) {
      std::optional<store::LeaseView> l = hosts_[h]->store->leases().Get("j");
      out.push_back(l ? l->holder : "");
    }
    return out;
  }
  static std::vector<std::string> All(const std::string& holder) {
    return {holder, holder, holder};
  }
};

TEST_F(JobLeaseTest, ASecondCoordinatorFailsOrWaitsForTheFirst) {
  Coordinator a = Connect(NewCoordinator("test a")), b = Connect(NewCoordinator("test b"));
  EXPECT_EQ(a.options.coordinator.find("test-a@"), 0u) << a.options.coordinator;
  EXPECT_TRUE(store::JobLeases::CheckHolder(a.options.coordinator).ok());
  EXPECT_NE(a.options.coordinator, b.options.coordinator);
  Result<std::unique_ptr<JobLease>> la = a.Acquire(15000, 0);
  ASSERT_TRUE(la.ok()) << la.status().ToString();
  EXPECT_EQ((*la)->holder(), a.options.coordinator);
  EXPECT_EQ((*la)->hosts().size(), 3u);
  EXPECT_EQ(Holders(), All(a.options.coordinator));
  EXPECT_TRUE((*la)->Held().ok());

  Result<std::unique_ptr<JobLease>> lb = b.Acquire(15000, 0);
  ASSERT_FALSE(lb.ok());
  EXPECT_EQ(lb.status().code(), StatusCode::kAborted);
  EXPECT_TRUE(Says(lb.status(), a.options.coordinator + " holds its lease"))
      << lb.status().ToString();
  EXPECT_EQ(Holders(), All(a.options.coordinator));  // b released what it took, if anything

  // b waits; a finishes after 0.6 s and its destructor releases the lease everywhere.
  const auto t0 = Clock::now();
  std::future<Result<std::unique_ptr<JobLease>>> waiting =
      std::async(std::launch::async, [&] { return b.Acquire(15000, 5); });
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  const auto released = Clock::now();
  la->reset();
  lb = waiting.get();
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  EXPECT_LT(SecondsSince(released), 2.0);
  EXPECT_GE(SecondsSince(t0), 0.6);
  EXPECT_EQ(Holders(), All(b.options.coordinator));
  lb->reset();
  EXPECT_EQ(Holders(), All(""));
}

TEST_F(JobLeaseTest, TheRenewalKeepsAShortLeaseAlive) {
  Coordinator a = Connect("coord-a"), b = Connect("coord-b");
  Result<std::unique_ptr<JobLease>> la = a.Acquire(400, 0);
  ASSERT_TRUE(la.ok()) << la.status().ToString();
  std::this_thread::sleep_for(std::chrono::seconds(2));  // 5 ttls
  EXPECT_EQ(Holders(), All("coord-a"));
  Result<std::unique_ptr<JobLease>> lb = b.Acquire(400, 0);
  EXPECT_EQ(lb.status().code(), StatusCode::kAborted) << lb.status().ToString();
  EXPECT_TRUE((*la)->Held().ok()) << (*la)->Held().ToString();
  // a's clients still change the job (their requests pass the fence); b's do not.
  EXPECT_TRUE(a.raw[0]->BeginVersion("j", 1, "{}").ok());
  EXPECT_EQ(b.raw[0]->Abort("j", 1).code(), StatusCode::kAborted);
  EXPECT_TRUE(a.raw[0]->Abort("j", 1).ok());
}

// A coordinator that stopped (died, or was paused) without releasing: its lease
// expires after its ttl and the next coordinator gets it.
TEST_F(JobLeaseTest, ALeaseNobodyRenewsExpires) {
  Coordinator dead = Connect("coord-dead"), b = Connect("coord-b");
  for (store::Client* c : dead.raw) ASSERT_TRUE(c->AcquireLease("j", 300).ok());
  Result<std::unique_ptr<JobLease>> lb = b.Acquire(15000, 0);
  ASSERT_FALSE(lb.ok());
  EXPECT_TRUE(Says(lb.status(), "coord-dead holds its lease")) << lb.status().ToString();
  const auto t0 = Clock::now();
  lb = b.Acquire(15000, 5);
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  EXPECT_LT(SecondsSince(t0), 1.5);
  EXPECT_EQ(Holders(), All("coord-b"));
  // The dead coordinator, resumed, is fenced out on every daemon.
  for (store::Client* c : dead.raw) {
    Status s = c->BeginVersion("j", 1, "{}").status();
    EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
    EXPECT_TRUE(Says(s, "coord-b holds its lease")) << s.ToString();
  }
}

// Another coordinator took the lease on one daemon (a's lease had expired there: here
// released in the daemon directly, deterministically): a's next renewal is refused and
// Held() says so, naming the other.
TEST_F(JobLeaseTest, HeldReportsALeaseTakenByAnother) {
  Coordinator a = Connect("coord-a");
  Result<std::unique_ptr<JobLease>> la = a.Acquire(200, 0);
  ASSERT_TRUE(la.ok()) << la.status().ToString();
  store::JobLeases& leases = hosts_[1]->store->leases();
  leases.Release("j", "coord-a");
  ASSERT_TRUE(leases.Acquire("j", "coord-thief", 60000).ok());
  Status held;
  for (int i = 0; i < 100 && held.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    held = (*la)->Held();
  }
  EXPECT_EQ(held.code(), StatusCode::kAborted) << held.ToString();
  EXPECT_TRUE(Says(held, "coord-thief holds its lease")) << held.ToString();
  EXPECT_TRUE(Says(held, "renewing the lease of job j")) << held.ToString();
  // The other daemons stay a's (renewals go on there), and the refusal stays.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(Holders(), (std::vector<std::string>{"coord-a", "coord-thief", "coord-a"}));
  EXPECT_FALSE((*la)->Held().ok());
}

TEST_F(JobLeaseTest, BadArgumentsAndEnvironment) {
  Coordinator a = Connect("coord-a");
  store::ClientOptions none;
  EXPECT_EQ(JobLease::Acquire(a.raw, "j", none).status().code(), StatusCode::kInvalidArgument);
  store::ClientOptions other;
  other.coordinator = "coord-other";
  Result<std::unique_ptr<JobLease>> l = JobLease::Acquire(a.raw, "j", other);
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Says(l.status(), "names another coordinator")) << l.status().ToString();
  EXPECT_TRUE(store::JobLeases::CheckHolder(NewCoordinator("a b\n\"c\"")).ok());
  EXPECT_LE(NewCoordinator(std::string(300, 'x')).size(), 200u);

  const char* saved = std::getenv("TENPLEX_LEASE_WAIT");
  const std::string keep = saved ? saved : "";
  ::unsetenv("TENPLEX_LEASE_WAIT");
  EXPECT_EQ(*LeaseWaitFromEnv(60), 60);
  ::setenv("TENPLEX_LEASE_WAIT", "2.5", 1);
  EXPECT_EQ(*LeaseWaitFromEnv(60), 2.5);
  for (const char* bad : {"-1", "abc", "5s", "nan"}) {
    ::setenv("TENPLEX_LEASE_WAIT", bad, 1);
    Result<double> w = LeaseWaitFromEnv(60);
    EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(Says(w.status(), "TENPLEX_LEASE_WAIT")) << bad;
  }
  if (saved) {
    ::setenv("TENPLEX_LEASE_WAIT", keep.c_str(), 1);
  } else {
    ::unsetenv("TENPLEX_LEASE_WAIT");
  }
}

// The agents' begin and seal of a transform are fenced too (agent.cc Prepare): a
// transform that claims to hold the lease (lease_held) under another name changes
// nothing while coordinator a holds it.
TEST_F(JobLeaseTest, AnAgentsBeginIsFenced) {
  const Cluster c = ClusterOf({0, 1}, 2);
  Load(c, "tp=2,pp=2,dp=1");
  Coordinator a = Connect("coord-a", {0, 1});
  Result<std::unique_ptr<JobLease>> la = a.Acquire(15000, 0);
  ASSERT_TRUE(la.ok()) << la.status().ToString();
  store::ClientOptions b;
  b.coordinator = "coord-b";
  ClusterTransformOptions o;
  o.lease_held = true;
  o.max_attempts = 1;
  Result<ClusterTransformStats> t = TransformCluster(c, "j", *ParseConfig("tp=1,pp=2,dp=2"), b, o);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(Says(t.status(), "coord-a holds its lease")) << t.status().ToString();
  for (int h : {0, 1}) {
    Result<store::JobInfo> j = hosts_[h]->store->Job("j");
    ASSERT_TRUE(j.ok());
    EXPECT_EQ(j->current, std::optional<uint64_t>(1));
    EXPECT_EQ(j->versions.size(), 1u) << hosts_[h]->url;
  }
  // Under a's name it goes through.
  t = TransformCluster(c, "j", *ParseConfig("tp=1,pp=2,dp=2"), a.options, o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Verify(*t, "tp=1,pp=2,dp=2", 2);
}

// docs/reliability.md "Open: one daemon listed twice" (fault campaign trial 80): a
// cluster naming one daemon under two URLs was transformed when the duplicate held no
// new rank (the transform connected by URL). It is refused before anything changes.
TEST_F(JobLeaseTest, ATransformRefusesOneDaemonUnderTwoUrls) {
  const Cluster c = ClusterOf({0, 1}, 2);
  Load(c, "tp=2,pp=2,dp=1");
  Cluster twice = ClusterOf({0, 1, 2}, 2);
  const std::string& u2 = hosts_[2]->url;
  twice.hosts.push_back("http://localhost:" + u2.substr(u2.rfind(':') + 1));
  // The target config needs hosts 0-1 only: the duplicate holds no new rank.
  Result<ClusterTransformStats> t =
      TransformCluster(twice, "j", *ParseConfig("tp=1,pp=2,dp=2"), {});
  ASSERT_FALSE(t.ok()) << "transformed to version " << t->to_version;
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().ToString();
  EXPECT_TRUE(Says(t.status(), "same store daemon")) << t.status().ToString();
  // As the target of a move too.
  ClusterTransformOptions o;
  o.to = twice;
  t = TransformCluster(c, "j", *ParseConfig("tp=1,pp=2,dp=2"), {}, o);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(Says(t.status(), "same store daemon")) << t.status().ToString();
  for (int h : {0, 1}) {
    EXPECT_EQ(hosts_[h]->store->Job("j")->current, std::optional<uint64_t>(1));
    EXPECT_EQ(hosts_[h]->store->Job("j")->versions.size(), 1u);
  }
  EXPECT_EQ(Holders(), All(""));  // refused before any lease was taken
}

}  // namespace
}  // namespace tenplex::cluster
