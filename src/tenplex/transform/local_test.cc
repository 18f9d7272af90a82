#include "tenplex/transform/local.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tenplex/model/gpt.h"
#include "tenplex/plan/synthetic.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/store/parse.h"

namespace tenplex::transform {
namespace {

using nlohmann::json;

Model Tiny(bool swiglu, bool bf16) {
  GptArgs a;
  a.num_layers = 4;
  a.hidden_size = 16;
  a.num_attention_heads = 4;
  a.num_query_groups = 2;
  a.ffn_hidden_size = 8;
  a.vocab_size = 37;
  a.make_vocab_size_divisible_by = 4;
  a.max_position_embeddings = 8;
  a.swiglu = swiglu;
  a.params_dtype = bf16 ? "bf16" : "fp32";
  return *MakeGpt(a);
}

std::string PathOf(const std::string& job, uint64_t v, int rank, const std::string& name) {
  return "jobs/" + job + "/" + std::to_string(v) + "/" + store::RankSegment(rank) + "/" + name;
}

// Puts a synthetic state for (model, config) as the job's committed version.
void PutState(store::Store& st, const std::string& job, const Model& m, const ParallelConfig& c,
              uint64_t seed) {
  Layout l = *MakeLayout(m, c);
  json info = {{"model", json::parse(ModelToJson(m))}, {"config", c.ToString()}, {"step", 7}};
  uint64_t v = *st.BeginVersion(job, std::nullopt, info.dump());
  for (const RankLayout& r : l.ranks) {
    for (const LocalTensor& t : *r.tensors) {
      auto w = st.Allocate(PathOf(job, v, r.rank, t.name), t.dtype, t.shape);
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      ASSERT_TRUE(plan::FillSynthetic(l, t, seed, w->data()).ok());
    }
  }
  ASSERT_TRUE(st.Commit(job, v).ok());
}

TEST(TransformLocalTest, EveryElementMatchesTheSyntheticOracle) {
  auto st = store::Store::Open();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  const char* chain[] = {"tp=2,pp=2", "dp=3,zero=1", "tp=2,pp=2,dp=2,layers=3+1",
                         "pp=4,zero=1,dp=1", "tp=1"};
  for (bool swiglu : {false, true}) {
    for (bool bf16 : {false, true}) {
      Model m = Tiny(swiglu, bf16);
      const std::string job = std::string("j") + (swiglu ? "s" : "") + (bf16 ? "b" : "");
      PutState(**st, job, m, *ParseConfig(chain[0]), 42);
      for (std::size_t k = 1; k < std::size(chain); ++k) {
        ParallelConfig to = *ParseConfig(chain[k]);
        auto stats = TransformLocal(**st, job, to);
        ASSERT_TRUE(stats.ok()) << stats.status().ToString();
        auto cur = ReadVersionState(**st, job);
        ASSERT_TRUE(cur.ok());
        EXPECT_EQ(cur->info.config(), to);
        EXPECT_EQ(cur->info.step(), 7);  // carried over
        Layout l = *MakeLayout(m, to);
        for (const RankLayout& r : l.ranks) {
          for (const LocalTensor& t : *r.tensors) {
            auto ref = (*st)->Get(PathOf(job, cur->version, r.rank, t.name));
            ASSERT_TRUE(ref.ok()) << t.name;
            Status s = plan::CheckSynthetic(l, t, 42, ref->data());
            ASSERT_TRUE(s.ok()) << chain[k] << " rank " << r.rank << ": " << s.ToString();
          }
        }
        // The old version was released.
        EXPECT_EQ((*st)->Job(job)->versions.size(), 1u);
      }
    }
  }
}

TEST(TransformLocalTest, BadStateLeavesCurrentVersion) {
  auto st = store::Store::Open();
  ASSERT_TRUE(st.ok());
  Model m = Tiny(false, false);
  PutState(**st, "j", m, *ParseConfig("tp=2"), 1);
  uint64_t before = *(*st)->Job("j")->current;
  // An impossible target config.
  auto bad = TransformLocal(**st, "j", *ParseConfig("tp=4"));  // 2 query groups
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("g % tp"), std::string::npos);
  EXPECT_EQ(*(*st)->Job("j")->current, before);
  EXPECT_FALSE(TransformLocal(**st, "nojob", *ParseConfig("tp=1")).ok());
}

}  // namespace
}  // namespace tenplex::transform
