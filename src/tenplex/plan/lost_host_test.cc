// Planning with lost hosts (kLostHost in the old host map): the plan reads only from
// surviving old ranks, and its result checked against the synthetic oracle is exact;
// a box with no surviving replica fails with DataLoss naming the tensor.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tenplex/model/gpt.h"
#include "tenplex/plan/planner.h"
#include "tenplex/plan/synthetic.h"
#include "tenplex/transform/executor.h"

namespace tenplex::plan {
namespace {

using transform::ExecuteOptions;
using transform::ExecutePlan;

Model Tiny() {
  GptArgs a;
  a.num_layers = 2;
  a.hidden_size = 8;
  a.num_attention_heads = 4;
  a.ffn_hidden_size = 12;
  a.vocab_size = 37;
  a.make_vocab_size_divisible_by = 4;
  a.max_position_embeddings = 6;
  a.params_dtype = "fp32";
  return *MakeGpt(a);
}

// Fills the old layout from the oracle, runs the plan and checks every new tensor.
void ExecuteAndCheck(const Plan& plan, const Layout& from, const Layout& to,
                     const std::vector<int>& from_hosts) {
  constexpr uint64_t kSeed = 11;
  std::vector<std::vector<std::vector<char>>> src_mem(from.world_size()), dst_mem(to.world_size());
  std::vector<std::vector<const void*>> src(from.world_size());
  std::vector<std::vector<void*>> dst(to.world_size());
  for (int r = 0; r < from.world_size(); ++r) {
    for (const LocalTensor& t : *from.ranks[r].tensors) {
      src_mem[r].emplace_back(Volume(t.shape) * DTypeSize(t.dtype));
      if (from_hosts[r] == kLostHost) {
        src[r].push_back(nullptr);  // unreadable: an op from here fails the executor
      } else {
        ASSERT_TRUE(FillSynthetic(from, t, kSeed, src_mem[r].back().data()).ok());
        src[r].push_back(src_mem[r].back().data());
      }
    }
  }
  for (int r = 0; r < to.world_size(); ++r) {
    for (const LocalTensor& t : *to.ranks[r].tensors) {
      dst_mem[r].emplace_back(Volume(t.shape) * DTypeSize(t.dtype), 0x5a);
      dst[r].push_back(dst_mem[r].back().data());
    }
  }
  for (const CopyOp& op : plan.ops) {
    if (!op.src_new) {
      EXPECT_NE(from_hosts[op.src_rank], kLostHost) << "op reads lost rank " << op.src_rank;
    }
  }
  Status s = ExecutePlan(plan, from, to, src, dst);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int r = 0; r < to.world_size(); ++r) {
    for (std::size_t i = 0; i < to.ranks[r].tensors->size(); ++i) {
      Status c = CheckSynthetic(to, (*to.ranks[r].tensors)[i], kSeed, dst_mem[r][i].data());
      EXPECT_TRUE(c.ok()) << c.ToString();
    }
  }
}

TEST(LostHostTest, PlansFromSurvivingReplicas) {
  const Model m = Tiny();
  for (const auto& [from_cfg, to_cfg] : {std::pair{"tp=2,pp=1,dp=2", "tp=1,pp=2,dp=1"},
                                         std::pair{"tp=2,pp=2,dp=2", "tp=2,pp=1,dp=3"},
                                         std::pair{"tp=1,pp=1,dp=4", "tp=2,pp=2,dp=1"}}) {
    Layout from = *MakeLayout(m, *ParseConfig(from_cfg));
    Layout to = *MakeLayout(m, *ParseConfig(to_cfg));
    // 2 GPUs per host; the last old host is lost, the new layout uses hosts 0.. .
    std::vector<int> from_hosts = DefaultHosts(from.world_size(), 2);
    const int lost = from_hosts.back();
    for (int& h : from_hosts) {
      if (h == lost) h = kLostHost;
    }
    std::vector<int> to_hosts = DefaultHosts(to.world_size(), 2);
    Result<Plan> plan = MakePlan(m, from, to, from_hosts, to_hosts);
    ASSERT_TRUE(plan.ok()) << from_cfg << " -> " << to_cfg << ": " << plan.status().ToString();
    ExecuteAndCheck(*plan, from, to, from_hosts);
  }
}

TEST(LostHostTest, NoReplicaIsDataLossNamingTheTensor) {
  const Model m = Tiny();
  Layout from = *MakeLayout(m, *ParseConfig("tp=2,pp=1,dp=1"));
  Layout to = *MakeLayout(m, *ParseConfig("tp=1,pp=1,dp=1"));
  Result<Plan> plan = MakePlan(m, from, to, {0, kLostHost}, {0});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(plan.status().ToString().find("no surviving replica of "), std::string::npos)
      << plan.status().ToString();
  // zero=1 shards optimizer state over dp: losing one dp replica loses its shards.
  // (Params are still replicated on rank 0.)
  Layout zfrom = *MakeLayout(m, *ParseConfig("tp=1,pp=1,dp=2,zero=1"));
  ASSERT_TRUE(MakePlan(m, zfrom, zfrom, {0, 0}, {0, 0}).ok());
  Result<Plan> zplan = MakePlan(m, zfrom, to, {0, kLostHost}, {0});
  EXPECT_EQ(zplan.status().code(), StatusCode::kDataLoss) << zplan.status().ToString();
  // A lost host in the new map is still refused.
  EXPECT_EQ(MakePlan(m, from, to, {0, 0}, {kLostHost}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tenplex::plan
