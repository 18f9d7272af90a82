// Coordinator leases on the daemon's side (lease.h; issue 34 finding 7): one holder per
// job until its deadline, checked against a fake clock, and the fence every change of a
// job's versions runs through.
#include "tenplex/store/lease.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace tenplex::store {
namespace {

using std::chrono::milliseconds;

bool Says(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

// A clock that moves only when told.
struct FakeClock {
  JobLeases::Clock::time_point t = JobLeases::Clock::time_point() + std::chrono::hours(1);
  std::function<JobLeases::Clock::time_point()> Fn() {
    return [this] { return t; };
  }
  void Advance(int64_t ms) { t += milliseconds(ms); }
};

class LeaseTest : public ::testing::Test {
 protected:
  // Fenced with a change that counts its runs.
  Status Change(const std::string& job, const std::string& holder) {
    return leases_.Fenced(job, holder, [&] {
      ++runs_;
      return Status::Ok();
    });
  }

  FakeClock clock_;
  JobLeases leases_{clock_.Fn()};
  int runs_ = 0;
};

TEST_F(LeaseTest, OneHolderUntilItsDeadline) {
  Result<LeaseView> a = leases_.Acquire("j", "A", 1000);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->holder, "A");
  EXPECT_EQ(a->remaining_ms, 1000);
  clock_.Advance(400);
  EXPECT_EQ(leases_.Get("j")->remaining_ms, 600);
  // Another holder is refused, told who holds it and for how long.
  Result<LeaseView> b = leases_.Acquire("j", "B", 1000);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kAborted);
  EXPECT_TRUE(Says(b.status(), "A holds its lease here for another 600 ms"))
      << b.status().ToString();
  EXPECT_TRUE(Says(b.status(), "this request comes from B")) << b.status().ToString();
  // The holder renews: a new deadline from now.
  a = leases_.Acquire("j", "A", 1000);
  ASSERT_TRUE(a.ok());
  clock_.Advance(999);
  EXPECT_EQ(leases_.Get("j")->holder, "A");
  EXPECT_EQ(leases_.Get("j")->remaining_ms, 1);
  EXPECT_FALSE(leases_.Acquire("j", "B", 1000).ok());
  // Leases are per job.
  EXPECT_TRUE(leases_.Acquire("k", "B", 1000).ok());
  // Expired (the deadline itself is past): B gets it.
  clock_.Advance(1);
  EXPECT_FALSE(leases_.Get("j").has_value());
  b = leases_.Acquire("j", "B", 50);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(leases_.Get("j")->holder, "B");
  EXPECT_EQ(leases_.Get("j")->remaining_ms, 50);
}

TEST_F(LeaseTest, OnlyTheHolderReleases) {
  ASSERT_TRUE(leases_.Acquire("j", "A", 1000).ok());
  leases_.Release("j", "B");  // not B's: nothing
  leases_.Release("k", "A");  // no lease: nothing
  ASSERT_TRUE(leases_.Get("j").has_value());
  EXPECT_EQ(leases_.Get("j")->holder, "A");
  EXPECT_FALSE(leases_.Acquire("j", "B", 1000).ok());
  leases_.Release("j", "A");
  EXPECT_FALSE(leases_.Get("j").has_value());
  EXPECT_TRUE(leases_.Acquire("j", "B", 1000).ok());
  leases_.Release("j", "A");  // A's is gone: B's stays
  EXPECT_EQ(leases_.Get("j")->holder, "B");
}

TEST_F(LeaseTest, HoldersAndTtlsAreChecked) {
  EXPECT_TRUE(JobLeases::CheckHolder("tenplex-transform@h0.example:123:ab/c+d=e_f").ok());
  EXPECT_TRUE(JobLeases::CheckHolder(std::string(200, 'x')).ok());
  for (const std::string& bad : {std::string(), std::string(201, 'x'), std::string("a b"),
                                 std::string("a\nb"), std::string("a\"b"), std::string("é")}) {
    Status s = JobLeases::CheckHolder(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(Says(s, "1-200 characters")) << s.ToString();
    EXPECT_EQ(leases_.Acquire("j", bad, 1000).status().code(), StatusCode::kInvalidArgument);
  }
  // An empty holder is "no coordinator" for Fenced, but a bad one is refused.
  EXPECT_EQ(Change("j", "a b").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(runs_, 0);
  for (int64_t ttl : {int64_t{0}, int64_t{-5}, kMaxLeaseMs + 1}) {
    Result<LeaseView> r = leases_.Acquire("j", "A", ttl);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << ttl;
    EXPECT_TRUE(Says(r.status(), "a lease lasts 1 to " + std::to_string(kMaxLeaseMs) + " ms"))
        << r.status().ToString();
  }
  EXPECT_FALSE(leases_.Get("j").has_value());
  EXPECT_TRUE(leases_.Acquire("j", "A", 1).ok());
  EXPECT_TRUE(leases_.Acquire("j", "A", kMaxLeaseMs).ok());
  EXPECT_EQ(leases_.Get("j")->remaining_ms, kMaxLeaseMs);
}

TEST_F(LeaseTest, FencedRunsOnlyWhenAllowed) {
  // No lease: a holderless change passes and takes nothing.
  EXPECT_TRUE(Change("j", "").ok());
  EXPECT_EQ(runs_, 1);
  EXPECT_FALSE(leases_.Get("j").has_value());
  // A holder's change takes the default lease.
  EXPECT_TRUE(Change("j", "A").ok());
  EXPECT_EQ(runs_, 2);
  ASSERT_TRUE(leases_.Get("j").has_value());
  EXPECT_EQ(leases_.Get("j")->holder, "A");
  EXPECT_EQ(leases_.Get("j")->remaining_ms, kDefaultLeaseMs);
  // Now neither another holder nor a holderless request runs.
  clock_.Advance(1000);
  Status b = Change("j", "B");
  EXPECT_EQ(b.code(), StatusCode::kAborted);
  EXPECT_TRUE(Says(
      b, "A holds its lease here for another " + std::to_string(kDefaultLeaseMs - 1000) + " ms"))
      << b.ToString();
  Status none = Change("j", "");
  EXPECT_EQ(none.code(), StatusCode::kAborted);
  EXPECT_TRUE(Says(none, "this request names no coordinator")) << none.ToString();
  EXPECT_EQ(runs_, 2);
  // A's next change neither extends nor shortens its lease.
  EXPECT_TRUE(Change("j", "A").ok());
  EXPECT_EQ(runs_, 3);
  EXPECT_EQ(leases_.Get("j")->remaining_ms, kDefaultLeaseMs - 1000);
  // After it expires, B's change runs and B holds the lease.
  clock_.Advance(kDefaultLeaseMs);
  EXPECT_TRUE(Change("j", "B").ok());
  EXPECT_EQ(leases_.Get("j")->holder, "B");
  EXPECT_EQ(runs_, 4);
}

TEST_F(LeaseTest, FencedKeepsAnExplicitLeaseAsItIs) {
  ASSERT_TRUE(leases_.Acquire("j", "A", 300).ok());  // shorter than kDefaultLeaseMs
  EXPECT_TRUE(Change("j", "A").ok());
  EXPECT_EQ(leases_.Get("j")->remaining_ms, 300);
  ASSERT_TRUE(leases_.Acquire("j", "A", kMaxLeaseMs).ok());  // longer
  clock_.Advance(10);
  EXPECT_TRUE(Change("j", "A").ok());
  EXPECT_EQ(leases_.Get("j")->remaining_ms, kMaxLeaseMs - 10);
  EXPECT_EQ(runs_, 2);
}

TEST_F(LeaseTest, FencedReturnsTheChangesError) {
  Status s = leases_.Fenced("j", "", [] { return FailedPrecondition("is committed"); });
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "is committed");
  s = leases_.Fenced("j", "A", [] { return NotFound("no version 7 of job 'j'"); });
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "no version 7 of job 'j'");
  s = leases_.Fenced("j", "B", [] { return Status::Ok(); });
  EXPECT_EQ(s.code(), StatusCode::kAborted);  // A took the lease even though its change failed
}

// Many coordinators and holderless clients at once on a real clock: a change never runs
// while another holder's lease is live, and two different holders are never inside
// their changes at the same time.
TEST(LeaseConcurrencyTest, NeverTwoHoldersInsideAChange) {
  JobLeases leases;
  constexpr int kThreads = 8;
  constexpr int kRounds = 2000;
  std::atomic<int> inside{0}, who{-1}, owner{-1}, violations{0}, runs{0}, grants{0};
  auto change = [&](int id) {
    return [&, id] {
      if (inside.fetch_add(1) != 0) ++violations;
      who.store(id);
      std::this_thread::sleep_for(std::chrono::microseconds(20));  // widen the window
      const int o = owner.load();
      if (o != -1 && o != id) ++violations;  // another holder's explicit lease is live
      if (who.load() != id) ++violations;
      inside.fetch_sub(1);
      ++runs;
      return Status::Ok();
    };
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Threads 0-5 are coordinators; 6 and 7 send holderless requests (id -2, -3).
      const bool holderless = t >= 6;
      const std::string holder = holderless ? "" : "coord-" + std::to_string(t);
      const int id = holderless ? -t : t;
      for (int i = 0; i < kRounds; ++i) {
        if (holderless || i % 3 == 2) {
          // A change without taking a lease first (a holder's takes one when none).
          if (leases.Fenced("j", holder, change(id)).ok() && !holderless)
            leases.Release("j", holder);
          continue;
        }
        if (!leases.Acquire("j", holder, 60000).ok()) continue;
        ++grants;
        owner.store(id);
        for (int k = 0; k < 3; ++k) EXPECT_TRUE(leases.Fenced("j", holder, change(id)).ok());
        EXPECT_FALSE(leases.Fenced("j", "", change(-1)).ok());
        owner.store(-1);
        leases.Release("j", holder);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_GT(grants.load(), 0);
  EXPECT_GE(runs.load(), 3 * grants.load());
  EXPECT_FALSE(leases.Get("j").has_value());
}

}  // namespace
}  // namespace tenplex::store
