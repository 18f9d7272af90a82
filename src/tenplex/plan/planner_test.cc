// Property tests of the planner and the executor against references that never use
// the planner's box maths:
//  - every element of every new local tensor, after executing the plan on buffers
//    sliced from fully materialised global tensors, equals the element the new
//    layout's pieces name (padding zero), also when in-place regions are not copied;
//  - the statistics equal per-element counts: the cross-host lower bound per host,
//    the bytes kept in place, the bytes per host sent and received;
//  - bytes_cross_host == cross_host_lower_bound in every case.
#include "tenplex/plan/planner.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>

#include "tenplex/geometry/testing.h"
#include "tenplex/model/gpt.h"
#include "tenplex/plan/planner_testing.h"
#include "tenplex/plan/synthetic.h"
#include "tenplex/transform/executor.h"

namespace tenplex::plan {
namespace {

using ::tenplex::testing::Ravel;
using ::tenplex::testing::Unravel;
using testing::kRandomCases;
using testing::kSeed;
using testing::ModelSpec;
using testing::RandomConfig;
using testing::RandomHosts;
using testing::Specs;
using testing::Tiny;
using transform::ExecuteOptions;
using transform::ExecutePlan;

#if defined(__SANITIZE_ADDRESS__)
constexpr int kFixedGpus[] = {1, 4};
#else
constexpr int kFixedGpus[] = {1, 2, 4};
#endif
constexpr uint8_t kOldGarbage = 0x5a;
constexpr uint8_t kNewGarbage = 0xa5;

// Element identity: (global tensor id, global flat index); id -1 is padding.
struct Elem {
  int32_t id = -1;
  int64_t index = 0;
  friend bool operator==(const Elem&, const Elem&) = default;
};

// Per local element, the global element it holds, straight from the pieces.
std::vector<Elem> ElementsOf(const LocalTensor& t, const Layout& l,
                             const std::map<std::string, int32_t>& ids) {
  std::vector<Elem> out(Volume(t.shape));
  for (const Piece& p : t.pieces) {
    const Shape& gs = l.globals.at(p.tensor).shape;
    const Shape ge = p.global.extents();
    const bool flat = p.local.rank() != p.global.rank() || p.local.extents() != ge;
    for (int64_t i = 0; i < Volume(p.global); ++i) {
      auto gi = Unravel(i, ge);
      for (std::size_t k = 0; k < gi.size(); ++k) gi[k] += p.global[k].begin;
      int64_t lf;
      if (flat) {
        lf = p.local[0].begin + i;
      } else {
        auto li = Unravel(i, p.local.extents());
        for (std::size_t k = 0; k < li.size(); ++k) li[k] += p.local[k].begin;
        lf = Ravel(li, t.shape);
      }
      out[lf] = {ids.at(p.tensor), Ravel(gi, gs)};
    }
  }
  return out;
}

struct Case {
  Model model;
  ParallelConfig from, to;
  std::vector<int> from_hosts, to_hosts;
};

class Checker {
 public:
  explicit Checker(const Case& c) : c_(c) {}

  void Run() {
    auto from = MakeLayout(c_.model, c_.from);
    auto to = MakeLayout(c_.model, c_.to);
    ASSERT_TRUE(from.ok() && to.ok());
    from_ = std::move(from).value();
    to_ = std::move(to).value();
    auto plan = MakePlan(c_.model, from_, to_, c_.from_hosts, c_.to_hosts);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    plan_ = std::move(plan).value();
    Materialise();
    CheckData(/*reuse=*/false);
    CheckData(/*reuse=*/true);
    CheckStats();
    auto again = MakePlan(c_.model, from_, to_, c_.from_hosts, c_.to_hosts);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(PlanToJson(*again, from_, to_), PlanToJson(plan_, from_, to_))
        << "plan is not deterministic";
  }
  const Plan& plan() const { return plan_; }

 private:
  // Global tensors with synthetic content, then every local tensor of both layouts
  // sliced from them per element.
  void Materialise() {
    for (const GlobalTensor& g : GlobalTensors(c_.model)) {
      ids_[g.name] = static_cast<int32_t>(globals_.size());
      const std::size_t es = DTypeSize(g.dtype);
      std::vector<uint8_t> bytes(Volume(g.shape) * es);
      const uint64_t key = SyntheticKey(g.name, kSeed);
      for (int64_t i = 0; i < Volume(g.shape); ++i)
        SyntheticElement(g.dtype, key, i, bytes.data() + i * es);
      globals_.push_back(std::move(bytes));
      elem_size_.push_back(static_cast<int64_t>(es));
    }
    old_elems_ = Elements(from_);
    new_elems_ = Elements(to_);
  }

  std::vector<std::vector<std::vector<Elem>>> Elements(const Layout& l) {
    std::vector<std::vector<std::vector<Elem>>> out(l.world_size());
    for (const RankLayout& r : l.ranks) {
      for (const LocalTensor& t : *r.tensors) out[r.rank].push_back(ElementsOf(t, l, ids_));
    }
    return out;
  }

  std::vector<uint8_t> Bytes(const LocalTensor& t, const std::vector<Elem>& elems, uint8_t pad) {
    const std::size_t es = DTypeSize(t.dtype);
    std::vector<uint8_t> b(elems.size() * es, pad);
    for (std::size_t i = 0; i < elems.size(); ++i) {
      if (elems[i].id >= 0)
        std::memcpy(&b[i * es], &globals_[elems[i].id][elems[i].index * es], es);
    }
    return b;
  }

  static bool SameTrailing(const LocalTensor& a, const LocalTensor& b) {
    return a.dtype == b.dtype && a.shape.size() == b.shape.size() &&
           (a.shape.empty() ||
            Shape(a.shape.begin() + 1, a.shape.end()) == Shape(b.shape.begin() + 1, b.shape.end()));
  }

  // The old tensor that new rank r's tensor i would reuse in place, or nullptr.
  const LocalTensor* Reusable(int r, std::size_t i, int* old_index) const {
    if (r >= from_.world_size() || c_.from_hosts[r] != c_.to_hosts[r]) return nullptr;
    const LocalTensor& nt = (*to_.ranks[r].tensors)[i];
    const auto& list = *from_.ranks[r].tensors;
    for (std::size_t j = 0; j < list.size(); ++j) {
      if (list[j].name == nt.name && SameTrailing(list[j], nt)) {
        *old_index = static_cast<int>(j);
        return &list[j];
      }
    }
    return nullptr;
  }

  // Executes the plan on old buffers (padding garbage) into new buffers that start as
  // garbage, or (reuse) as the old buffer of the same device and name, without
  // copying kept regions; compares with the expected bytes.
  void CheckData(bool reuse) {
    SCOPED_TRACE(reuse ? "new buffers reuse old ones, kept regions not copied"
                       : "fresh new buffers");
    std::vector<std::vector<std::vector<uint8_t>>> olds(from_.world_size()), news(to_.world_size());
    std::vector<std::vector<const void*>> src(from_.world_size());
    std::vector<std::vector<void*>> dst(to_.world_size());
    for (const RankLayout& r : from_.ranks) {
      for (std::size_t i = 0; i < r.tensors->size(); ++i) {
        olds[r.rank].push_back(Bytes((*r.tensors)[i], old_elems_[r.rank][i], kOldGarbage));
      }
      for (auto& b : olds[r.rank]) src[r.rank].push_back(b.data());
    }
    for (const RankLayout& r : to_.ranks) {
      for (std::size_t i = 0; i < r.tensors->size(); ++i) {
        std::vector<uint8_t> b((*r.tensors)[i].bytes(), kNewGarbage);
        int oi = -1;
        if (reuse && Reusable(r.rank, i, &oi)) {
          const auto& ob = olds[r.rank][oi];
          std::memcpy(b.data(), ob.data(), std::min(b.size(), ob.size()));
        }
        news[r.rank].push_back(std::move(b));
      }
      for (auto& b : news[r.rank]) dst[r.rank].push_back(b.data());
    }
    ExecuteOptions opts;
    opts.copy_kept = !reuse;
    ThreadPool pool(2);
    opts.pool = &pool;
    opts.parallel_threshold = 64;  // exercise the split paths on tiny tensors
    Status s = ExecutePlan(plan_, from_, to_, src, dst, opts);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (const RankLayout& r : to_.ranks) {
      for (std::size_t i = 0; i < r.tensors->size(); ++i) {
        const LocalTensor& t = (*r.tensors)[i];
        std::vector<uint8_t> want = Bytes(t, new_elems_[r.rank][i], 0);
        if (want != news[r.rank][i]) {
          const std::size_t es = DTypeSize(t.dtype);
          std::size_t e = 0;
          while (std::memcmp(&want[e * es], &news[r.rank][i][e * es], es) == 0) ++e;
          ADD_FAILURE() << "new rank " << r.rank << " tensor " << t.name << " element " << e << " ("
                        << (new_elems_[r.rank][i][e].id < 0 ? "padding" : "data") << ") is wrong";
          return;
        }
      }
    }
  }

  void CheckStats() {
    const PlanStats& s = plan_.stats;
    const int hosts = s.num_hosts;
    // Per element: which hosts need / hold it.
    std::vector<std::vector<std::vector<char>>> need(hosts), held(hosts);
    for (int h = 0; h < hosts; ++h) {
      for (const auto& g : globals_) {
        need[h].emplace_back(g.size(), 0);
        held[h].emplace_back(g.size(), 0);
      }
    }
    int64_t total = 0, in_place = 0;
    for (const RankLayout& r : to_.ranks) {
      for (std::size_t i = 0; i < r.tensors->size(); ++i) {
        int oi = -1;
        const LocalTensor* ot = Reusable(r.rank, i, &oi);
        const auto& ne = new_elems_[r.rank][i];
        for (std::size_t e = 0; e < ne.size(); ++e) {
          if (ne[e].id < 0) continue;
          total += elem_size_[ne[e].id];
          need[c_.to_hosts[r.rank]][ne[e].id][ne[e].index] = 1;
          if (ot && e < old_elems_[r.rank][oi].size() && old_elems_[r.rank][oi][e] == ne[e]) {
            in_place += elem_size_[ne[e].id];
          }
        }
      }
    }
    for (const RankLayout& r : from_.ranks) {
      for (const auto& oe : old_elems_[r.rank]) {
        for (const Elem& e : oe) {
          if (e.id >= 0) held[c_.from_hosts[r.rank]][e.id][e.index] = 1;
        }
      }
    }
    std::vector<int64_t> lb(hosts, 0);
    int64_t lb_total = 0;
    for (int h = 0; h < hosts; ++h) {
      for (std::size_t id = 0; id < globals_.size(); ++id) {
        for (std::size_t x = 0; x < need[h][id].size(); ++x) {
          if (need[h][id][x] && !held[h][id][x]) lb[h] += elem_size_[id];
        }
      }
      lb_total += lb[h];
    }
    EXPECT_EQ(s.bytes_total, total);
    EXPECT_EQ(s.bytes_in_place, in_place);
    EXPECT_EQ(s.cross_host_lower_bound, lb_total);
    EXPECT_EQ(s.bytes_cross_host, lb_total);
    // Ops: coverage exactly once, host classes, send/receive per host, dependencies.
    std::vector<int64_t> sent(hosts, 0), recv(hosts, 0);
    int64_t local = 0, cross = 0, covered = 0;
    std::map<std::pair<int, int>, std::vector<int>> count;
    auto cover = [&](const CopyOp& op) {
      auto& c = count[{op.dst_rank, op.dst_tensor}];
      const LocalTensor& t = (*to_.ranks[op.dst_rank].tensors)[op.dst_tensor];
      if (c.empty()) c.assign(Volume(t.shape), 0);
      const bool flat =
          op.dst.rank() != op.global.rank() || op.dst.extents() != op.global.extents();
      for (int64_t i = 0; i < Volume(op.dst); ++i) {
        int64_t lf = op.dst[0].begin + i;
        if (!flat) {
          auto li = Unravel(i, op.dst.extents());
          for (std::size_t k = 0; k < li.size(); ++k) li[k] += op.dst[k].begin;
          lf = Ravel(li, t.shape);
        }
        ++c[lf];
      }
      covered += Volume(op.dst) * elem_size_[Tid(op)];
    };
    for (const CopyOp& k : plan_.kept) {
      EXPECT_EQ(k.src_rank, k.dst_rank);
      EXPECT_EQ(k.src, k.dst);
      cover(k);
    }
    std::map<int, std::set<std::pair<int32_t, int64_t>>> held_by_rank;
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      const CopyOp& op = plan_.ops[i];
      const int dh = c_.to_hosts[op.dst_rank];
      const int sh = op.src_new ? c_.to_hosts[op.src_rank] : c_.from_hosts[op.src_rank];
      const int64_t bytes = Volume(op.global) * elem_size_[Tid(op)];
      EXPECT_EQ(Volume(op.src), Volume(op.global));
      if (op.src_new) {
        EXPECT_EQ(sh, dh) << "a new-layout source must be on the destination's host";
        ASSERT_GE(op.after, 0);
        ASSERT_LT(op.after, static_cast<int64_t>(i));
        EXPECT_EQ(plan_.ops[op.after].dst_rank, op.src_rank);
        EXPECT_EQ(plan_.ops[op.after].dst_tensor, op.src_tensor);
      }
      if (!op.src_new && sh == dh && op.src_rank != op.dst_rank &&
          op.dst_rank < from_.world_size() && c_.from_hosts[op.dst_rank] == dh) {
        // Same device first: the destination's own old rank must not hold all of it.
        auto& own = held_by_rank[op.dst_rank];
        if (own.empty()) {
          for (const auto& oe : old_elems_[op.dst_rank]) {
            for (const Elem& e : oe) own.insert({e.id, e.index});
          }
        }
        const Shape& gs = to_.globals.at(plan_.tensors[op.tensor]).shape;
        bool all = true;
        for (int64_t x = 0; x < Volume(op.global) && all; ++x) {
          auto gi = Unravel(x, op.global.extents());
          for (std::size_t k = 0; k < gi.size(); ++k) gi[k] += op.global[k].begin;
          all = own.count({Tid(op), Ravel(gi, gs)}) > 0;
        }
        EXPECT_FALSE(all) << "op " << i << " copies from rank " << op.src_rank
                          << " what the same device holds";
      }
      if (sh == dh) {
        local += bytes;
      } else {
        cross += bytes;
        sent[sh] += bytes;
        recv[dh] += bytes;
      }
      cover(op);
    }
    EXPECT_EQ(covered, total) << "ops and kept regions must cover each new element once";
    for (auto& [key, c] : count) {
      for (int x : c)
        ASSERT_LE(x, 1) << "rank " << key.first << " tensor " << key.second << " written twice";
    }
    EXPECT_EQ(local, s.bytes_host_local);
    EXPECT_EQ(cross, s.bytes_cross_host);
    EXPECT_EQ(s.bytes_in_place + s.bytes_host_local + s.bytes_cross_host, s.bytes_total);
    EXPECT_EQ(sent, s.host_send_bytes);
    EXPECT_EQ(recv, s.host_recv_bytes);
    EXPECT_EQ(recv, lb) << "each host receives exactly what it needs and does not hold";
    EXPECT_EQ(s.ops, static_cast<int64_t>(plan_.ops.size()));
  }

  int32_t Tid(const CopyOp& op) const { return ids_.at(plan_.tensors[op.tensor]); }

  const Case& c_;
  Layout from_, to_;
  Plan plan_;
  std::map<std::string, int32_t> ids_;
  std::vector<std::vector<uint8_t>> globals_;
  std::vector<int64_t> elem_size_;
  std::vector<std::vector<std::vector<Elem>>> old_elems_, new_elems_;
};

TEST(PlannerTest, RandomCasesMatchFullTensorReference) {
  std::mt19937 rng(20241122);
  std::vector<Model> models;
  for (const ModelSpec& s : Specs()) models.push_back(Tiny(s));
  std::map<std::string, int> seen;
  for (int n = 0; n < kRandomCases; ++n) {
    const std::size_t mi = rng() % models.size();
    const int64_t groups = Specs()[mi].groups;
    Case c{models[mi], RandomConfig(rng, groups), RandomConfig(rng, groups), {}, {}};
    const int gpus = 1 + static_cast<int>(rng() % 4);
    const bool shuffled = rng() % 4 == 0;
    c.from_hosts = RandomHosts(rng, c.from.world_size(), gpus, shuffled);
    c.to_hosts = RandomHosts(rng, c.to.world_size(), gpus, shuffled);
    SCOPED_TRACE("case " + std::to_string(n) + ": model " + std::to_string(mi) + " " +
                 c.from.ToString() + " -> " + c.to.ToString() + ", " + std::to_string(gpus) +
                 " GPUs per host" + (shuffled ? ", shuffled" : ""));
    Checker checker(c);
    checker.Run();
    if (HasFatalFailure() || HasFailure()) return;
    const Plan& p = checker.plan();
    seen["zero=1 before"] += c.from.zero;
    seen["zero=1 after"] += c.to.zero;
    seen["uneven layers"] += !c.from.layers.empty() || !c.to.layers.empty();
    seen["shuffled hosts"] += shuffled;
    seen["bytes in place"] += p.stats.bytes_in_place > 0;
    seen["cross-host bytes"] += p.stats.bytes_cross_host > 0;
    int from_new = 0;
    for (const CopyOp& op : p.ops) from_new += op.src_new;
    seen["ops from the new layout"] += from_new > 0;
  }
  // The random cases must reach every situation the planner distinguishes.
  for (const auto& [what, n] : seen) EXPECT_GE(n, 3) << what;
}

// Every pair of configs on every model with 4 query groups, for each host size.
void CheckConfigPairs(const std::vector<std::pair<const char*, const char*>>& pairs) {
  for (const ModelSpec& s : Specs()) {
    if (s.groups % 4 != 0) continue;
    Model m = Tiny(s);
    for (const auto& [from, to] : pairs) {
      for (int gpus : kFixedGpus) {
        Case c{m, *ParseConfig(from), *ParseConfig(to), {}, {}};
        c.from_hosts = DefaultHosts(c.from.world_size(), gpus);
        c.to_hosts = DefaultHosts(c.to.world_size(), gpus);
        SCOPED_TRACE(std::string(from) + " -> " + to + " gpus " + std::to_string(gpus));
        Checker(c).Run();
      }
    }
  }
}

TEST(PlannerTest, FixedCases) {
  // The corner cases named in the issue, each on its own: zero=1 on either side, vocab
  // padding with a tp change, GLU, tied embeddings across a pp change, bf16.
  CheckConfigPairs({
      {"tp=2,pp=2,dp=2", "tp=4,pp=1,dp=1"},
      {"tp=1,pp=1,dp=3,zero=1", "tp=2,pp=2,dp=2"},
      {"tp=2,pp=2,dp=2", "tp=2,pp=2,dp=3,zero=1"},
      {"tp=2,pp=3,layers=2+1+1,dp=2,zero=1", "tp=4,pp=2,dp=1,zero=1"},
      {"tp=1,pp=1,dp=1", "tp=1,pp=1,dp=1"},
      {"tp=4,pp=4,dp=1", "tp=1,pp=1,dp=2"},
  });
}

TEST(PlannerTest, UnevenWeightsMatchReferenceAtTheLowerBound) {
  // Spec §9: between uneven (tp_weights, dp_weights) and even configs, every element
  // lands where the new layout says and the cross-host bytes equal the lower bound.
  CheckConfigPairs({
      {"tp=2,tp_weights=3+1", "tp=2"},
      {"tp=2,dp=2", "tp=2,tp_weights=1+3,dp=2,dp_weights=2+1"},
      {"tp=2,tp_weights=3+1,pp=2,dp=2,zero=1", "tp=2,tp_weights=1+1,pp=2,dp=2,zero=1"},
      {"tp=3,tp_weights=2+1+1,dp=2,zero=1", "tp=4,tp_weights=1+1+1+2"},
      {"tp=4,tp_weights=1+1+1+2,pp=2", "tp=3,tp_weights=1+1+1,pp=3,layers=2+1+1,dp=2"},
      {"tp=2,tp_weights=5+3,pp=2,layers=3+1", "tp=2,tp_weights=3+5,pp=2,layers=1+3"},
      {"tp=4,pp=2,dp=1", "tp=3,tp_weights=2+1+1,pp=1,dp=2,zero=1"},
  });
}

TEST(PlannerTest, IdentityKeepsEverythingInPlace) {
  Model m = Tiny(Specs()[0]);
  auto l = MakeLayout(m, *ParseConfig("tp=2,pp=2,dp=2,zero=1"));
  ASSERT_TRUE(l.ok());
  auto h = DefaultHosts(8, 4);
  auto p = MakePlan(m, *l, *l, h, h);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->ops.empty());
  EXPECT_EQ(p->stats.bytes_in_place, p->stats.bytes_total);
  EXPECT_EQ(p->stats.cross_host_lower_bound, 0);
}

TEST(PlannerTest, HostDedupSendsEachBoxOnceAndBalances) {
  // dp=1 on host 0 -> dp=4 on hosts 1..: every replicated tensor a host needs crosses
  // once, the other ranks of that host copy it from the new layout.
  Model m = Tiny(Specs()[0]);
  auto from = MakeLayout(m, *ParseConfig("tp=2,dp=2"));
  auto to = MakeLayout(m, *ParseConfig("tp=2,dp=4"));
  ASSERT_TRUE(from.ok() && to.ok());
  std::vector<int> fh = {0, 0, 1, 1}, th = {2, 2, 2, 2, 3, 3, 3, 3};
  auto p = MakePlan(m, *from, *to, fh, th);
  ASSERT_TRUE(p.ok());
  const int64_t replica = from->ranks[0].bytes() + from->ranks[1].bytes();
  const int64_t param_bytes = GlobalBytes(m);
  EXPECT_EQ(p->stats.bytes_cross_host, 2 * param_bytes);  // hosts 2 and 3 each get the model once
  EXPECT_GT(replica, 0);
  int64_t from_new = 0;
  for (const CopyOp& op : p->ops) from_new += op.src_new;
  EXPECT_GT(from_new, 0);
  // Two source hosts with a full replica each: taking the holders in turn splits the load.
  EXPECT_EQ(p->stats.host_send_bytes[0] + p->stats.host_send_bytes[1], 2 * param_bytes);
  EXPECT_LE(p->stats.max_host_send_bytes, param_bytes + param_bytes / 4);
}

TEST(PlannerTest, RejectsMismatchedInputs) {
  Model a = Tiny(Specs()[0]), b = Tiny(Specs()[1]);
  auto la = MakeLayout(a, *ParseConfig("tp=2"));
  auto lb = MakeLayout(b, *ParseConfig("tp=2"));
  ASSERT_TRUE(la.ok() && lb.ok());
  auto h = DefaultHosts(2, 8);
  auto p = MakePlan(a, *la, *lb, h, h);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("new layout"), std::string::npos) << p.status().message();
  auto q = MakePlan(a, *la, *la, {0}, h);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("one entry per rank"), std::string::npos);
  auto r = MakePlan(a, *la, *la, {0, -1}, h);
  ASSERT_FALSE(r.ok());
}

TEST(ExecutorTest, RejectsMissingBuffers) {
  Model m = Tiny(Specs()[0]);
  auto from = MakeLayout(m, *ParseConfig("tp=2"));
  auto to = MakeLayout(m, *ParseConfig("tp=1"));
  ASSERT_TRUE(from.ok() && to.ok());
  auto p = MakePlan(m, *from, *to, {0, 0}, {0});
  ASSERT_TRUE(p.ok());
  std::vector<std::vector<const void*>> src(2);
  std::vector<std::vector<void*>> dst(1);
  Status s = ExecutePlan(*p, *from, *to, src, dst);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ExecutePlan(*p, *from, *to, {}, dst).ok());
}

}  // namespace
}  // namespace tenplex::plan
