// MakePlan on several threads (planner.h, "Parallel") against the same plan on one: op
// for op, kept region for kept region, every statistic, and the same error when a need
// has no replica, on random cases and on many-host cases where step 4's send numbers run
// across tensors (DP scale-downs, lost hosts, TP and PP changes, uneven splits, ZeRO-1).
#include <gtest/gtest.h>

#include <random>

#include "tenplex/model/gpt.h"
#include "tenplex/plan/planner.h"
#include "tenplex/plan/planner_testing.h"

namespace tenplex::plan {
namespace {

using testing::kRandomCases;
using testing::ManyHostCases;
using testing::ModelSpec;
using testing::PlanCase;
using testing::RandomCase;
using testing::SmallGpt;
using testing::Specs;
using testing::Tiny;

void ExpectSameOps(const std::vector<CopyOp>& a, const std::vector<CopyOp>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    const CopyOp &x = a[k], &y = b[k];
    ASSERT_TRUE(x.tensor == y.tensor && x.global == y.global && x.src_rank == y.src_rank &&
                x.src_tensor == y.src_tensor && x.src == y.src && x.dst_rank == y.dst_rank &&
                x.dst_tensor == y.dst_tensor && x.dst == y.dst && x.src_new == y.src_new &&
                x.after == y.after)
        << "op " << k << " differs";
  }
}

// The plan on 1 thread against 2, 3 and 5; returns how many ops the plan has (-1: no
// plan, the same error on every thread count).
int64_t ExpectSamePlanOnThreads(const Model& m, const Layout& from, const Layout& to,
                                const std::vector<int>& fh, const std::vector<int>& th) {
  auto serial = MakePlan(m, from, to, fh, th, 1);
  for (int threads : {2, 3, 5}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    auto parallel = MakePlan(m, from, to, fh, th, threads);
    EXPECT_EQ(serial.ok(), parallel.ok());
    if (!serial.ok() || !parallel.ok()) {
      EXPECT_EQ(serial.status().ToString(), parallel.status().ToString());
      continue;
    }
    EXPECT_EQ(serial->tensors, parallel->tensors);
    ExpectSameOps(serial->ops, parallel->ops);
    ExpectSameOps(serial->kept, parallel->kept);
    EXPECT_TRUE(serial->stats == parallel->stats) << "the statistics differ";
  }
  return serial.ok() ? static_cast<int64_t>(serial->ops.size()) : -1;
}

TEST(PlannerParallelTest, RandomCasesPlanAsOnOneThread) {
  std::mt19937 rng(20261206);
  std::vector<Model> models;
  for (const ModelSpec& s : Specs()) models.push_back(Tiny(s));
  int failed = 0;
  for (int n = 0; n < kRandomCases / 3; ++n) {
    const PlanCase c = RandomCase(rng, models, 3);
    SCOPED_TRACE("case " + std::to_string(n) + ": " + c.label);
    failed += ExpectSamePlanOnThreads(models[c.model], c.from, c.to, c.fh, c.th) < 0;
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(failed, 0) << "no case lost its only replica: the error path went untested";
}

TEST(PlannerParallelTest, ManyHostsPlanAsOnOneThread) {
  std::mt19937 rng(36);
  int planned = 0;
  for (const PlanCase& c : ManyHostCases(rng)) {
    SCOPED_TRACE(c.label);
    planned += ExpectSamePlanOnThreads(c.own, c.from, c.to, c.fh, c.th) > 0;
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(planned, 8);  // the two ZeRO-1 cases with a lost host fail on every path
}

// Large enough that the default (threads 0) plans on every hardware thread.
TEST(PlannerParallelTest, DefaultThreadsPlanAsOnOneThread) {
  Model m = SmallGpt(16, 32, 4, true);
  auto from = MakeLayout(m, *ParseConfig("tp=2,pp=4,dp=160"));
  auto to = MakeLayout(m, *ParseConfig("tp=2,pp=4,dp=144"));
  ASSERT_TRUE(from.ok() && to.ok());
  const std::vector<int> fh = DefaultHosts(from->world_size(), 8);
  const std::vector<int> th = DefaultHosts(to->world_size(), 8);
  auto serial = MakePlan(m, *from, *to, fh, th, 1);
  auto dflt = MakePlan(m, *from, *to, fh, th);
  ASSERT_TRUE(serial.ok() && dflt.ok());
  ExpectSameOps(serial->ops, dflt->ops);
  ExpectSameOps(serial->kept, dflt->kept);
  EXPECT_EQ(serial->stats.host_send_bytes, dflt->stats.host_send_bytes);
  EXPECT_EQ(MakePlan(m, *from, *to, fh, th, -1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tenplex::plan
