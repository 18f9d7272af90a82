// Per-host planning (MakeHostPlan) against the full plan (MakePlan) on random cases
// and a larger GPT: the same ops and kept regions, filtered by destination host.
#include <gtest/gtest.h>

#include <algorithm>
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

// Per-host planning against the full plan: for every host, MakeHostPlan's ops and kept
// regions are MakePlan's whose destination is on that host (same order, "after"
// renumbered within the host), and its stats are those ops' sums.
void ExpectHostPlansFilterFullPlan(const Model& m, const Layout& from, const Layout& to,
                                   const std::vector<int>& fh, const std::vector<int>& th) {
  auto full = MakePlan(m, from, to, fh, th);
  int hosts = 0;
  for (int h : th) hosts = std::max(hosts, h + 1);
  int64_t lower_bound = 0;
  for (int h = 0; h < hosts; ++h) {
    SCOPED_TRACE("host " + std::to_string(h));
    auto part = MakeHostPlan(m, from, to, fh, th, h);
    ASSERT_EQ(full.ok(), part.ok()) << (full.ok() ? part.status() : full.status()).ToString();
    if (!full.ok()) {
      EXPECT_EQ(part.status().code(), full.status().code());
      return;
    }
    auto same = [](const CopyOp& a, const CopyOp& b, int64_t after) {
      return a.tensor == b.tensor && a.global == b.global && a.src_rank == b.src_rank &&
             a.src_tensor == b.src_tensor && a.src == b.src && a.dst_rank == b.dst_rank &&
             a.dst_tensor == b.dst_tensor && a.dst == b.dst && a.src_new == b.src_new &&
             b.after == after;
    };
    std::vector<int64_t> index(full->ops.size(), -1), send(full->stats.num_hosts, 0);
    std::size_t n = 0;
    int64_t local = 0, cross = 0, cross_ops = 0;
    for (std::size_t k = 0; k < full->ops.size(); ++k) {
      const CopyOp& op = full->ops[k];
      if (th[op.dst_rank] != h) continue;
      ASSERT_LT(n, part->ops.size());
      const int64_t after = op.src_new ? index[op.after] : -1;
      ASSERT_TRUE(!op.src_new || after >= 0) << "op " << k << " reads another host's op";
      ASSERT_TRUE(same(op, part->ops[n], after)) << "op " << k << " vs host op " << n;
      index[k] = static_cast<int64_t>(n++);
      const int src_host = op.src_new ? th[op.src_rank] : fh[op.src_rank];
      const int64_t bytes =
          Volume(op.global) *
          static_cast<int64_t>(DTypeSize(to.globals.at(full->tensors[op.tensor]).dtype));
      if (src_host == h) {
        local += bytes;
      } else {
        cross += bytes;
        ++cross_ops;
        send[src_host] += bytes;
      }
    }
    EXPECT_EQ(n, part->ops.size());
    std::size_t kept = 0;
    int64_t in_place = 0;
    for (const CopyOp& op : full->kept) {
      if (th[op.dst_rank] != h) continue;
      ASSERT_LT(kept, part->kept.size());
      EXPECT_TRUE(same(op, part->kept[kept++], -1));
      in_place += Volume(op.global) *
                  static_cast<int64_t>(DTypeSize(to.globals.at(full->tensors[op.tensor]).dtype));
    }
    EXPECT_EQ(kept, part->kept.size());
    const PlanStats& s = part->stats;
    EXPECT_EQ(s.bytes_in_place, in_place);
    EXPECT_EQ(s.bytes_host_local, local);
    EXPECT_EQ(s.bytes_cross_host, cross);
    EXPECT_EQ(s.bytes_cross_host, s.cross_host_lower_bound);
    EXPECT_EQ(s.cross_host_ops, cross_ops);
    EXPECT_EQ(s.bytes_in_place + s.bytes_host_local + s.bytes_cross_host, s.bytes_total);
    EXPECT_EQ(s.host_recv_bytes[h], cross);
    EXPECT_EQ(s.host_send_bytes, send);
    EXPECT_EQ(s.max_host_send_bytes, *std::max_element(send.begin(), send.end()));
    EXPECT_EQ(s.max_host_recv_bytes, cross);
    lower_bound += s.cross_host_lower_bound;
  }
  EXPECT_EQ(lower_bound, full->stats.cross_host_lower_bound);
}

TEST(PlannerTest, HostPlansAreTheFullPlanFilteredByHost) {
  std::mt19937 rng(20261123);
  std::vector<Model> models;
  for (const ModelSpec& s : Specs()) models.push_back(Tiny(s));
  for (int n = 0; n < kRandomCases / 3; ++n) {
    const PlanCase c = RandomCase(rng, models, 4);
    SCOPED_TRACE("case " + std::to_string(n) + ": " + c.label);
    ExpectHostPlansFilterFullPlan(models[c.model], c.from, c.to, c.fh, c.th);
    if (HasFatalFailure()) return;
  }
  // A larger case where many hosts are alike (dp replicas): the per-kind shortcut.
  Model m = SmallGpt(4, 64, 8, true);
  auto from = MakeLayout(m, *ParseConfig("tp=2,pp=4,dp=6,zero=1"));
  auto to = MakeLayout(m, *ParseConfig("tp=2,pp=2,dp=8"));
  ASSERT_TRUE(from.ok() && to.ok());
  ExpectHostPlansFilterFullPlan(m, *from, *to, DefaultHosts(from->world_size(), 4),
                                DefaultHosts(to->world_size(), 4));
  auto bad = MakeHostPlan(m, *from, *to, DefaultHosts(from->world_size(), 4),
                          DefaultHosts(to->world_size(), 4), 99);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

// Per-host planning simulates other hosts once per kind and only where they compete for
// the planned host's senders (planner.h, "Cost"): cases with many hosts of each kind
// (ManyHostCases; tied embeddings join the first and last stage's senders), every host's
// plan against the full plan filtered to it.
TEST(PlannerTest, HostPlansOfManyHostsAreTheFullPlanFilteredByHost) {
  std::mt19937 rng(36);
  for (const PlanCase& c : ManyHostCases(rng)) {
    SCOPED_TRACE(c.label);
    ExpectHostPlansFilterFullPlan(c.own, c.from, c.to, c.fh, c.th);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace tenplex::plan
