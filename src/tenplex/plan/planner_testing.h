// Tiny GPT models, random parallel configs and host maps shared by the planner's tests
// (planner_test.cc, planner_host_test.cc, planner_parallel_test.cc,
// synthetic_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tenplex/model/gpt.h"
#include "tenplex/plan/planner.h"

namespace tenplex::plan::testing {

inline constexpr uint64_t kSeed = 7;
// Fewer random cases under the sanitizers (Debug, several times slower).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr int kRandomCases = 50;
#else
inline constexpr int kRandomCases = 150;
#endif

struct ModelSpec {
  bool swiglu, tied, bias, rms, bf16, adam;
  int64_t groups;
};

inline Model Tiny(const ModelSpec& s) {
  GptArgs a;
  a.name = "tiny";
  a.num_layers = 4;
  a.hidden_size = 8;
  a.num_attention_heads = 4;
  a.num_query_groups = s.groups;
  a.ffn_hidden_size = 12;
  a.vocab_size = 37;
  a.make_vocab_size_divisible_by = 4;
  a.max_position_embeddings = 6;
  a.swiglu = s.swiglu;
  a.untie_embeddings_and_output_weights = !s.tied;
  a.disable_bias_linear = !s.bias;
  a.normalization = s.rms ? "RMSNorm" : "LayerNorm";
  a.position_embedding_type = s.rms ? "rope" : "learned_absolute";
  a.params_dtype = s.bf16 ? "bf16" : "fp32";
  a.optimizer = s.adam ? "adam" : "none";
  auto m = MakeGpt(a);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

// gpt3-175b's shape with `layers` layers of width `hidden` and `heads` heads.
inline Model SmallGpt(int layers, int64_t hidden, int64_t heads, bool tied) {
  auto args = *GptPreset("gpt3-175b");
  args.num_layers = layers;
  args.hidden_size = hidden;
  args.num_attention_heads = heads;
  args.num_query_groups = heads;
  args.ffn_hidden_size = 2 * hidden;
  args.vocab_size = 4 * hidden;
  args.untie_embeddings_and_output_weights = !tied;
  return *MakeGpt(args);
}

inline const std::vector<ModelSpec>& Specs() {
  static const std::vector<ModelSpec> specs = {
      {false, true, true, false, false, true, 4},   {true, false, false, true, false, true, 2},
      {true, true, true, false, true, true, 4},     {false, false, true, true, true, true, 2},
      {false, true, false, false, false, false, 4}, {true, true, false, true, true, false, 2},
  };
  return specs;
}

inline ParallelConfig RandomConfig(std::mt19937& rng, int64_t groups) {
  static const char* pps[] = {
      "pp=1", "pp=2", "pp=4", "pp=2,layers=3+1", "pp=3,layers=2+1+1", "pp=2,layers=1+3"};
  std::vector<int> tps;
  for (int tp : {1, 2, 4}) {
    if (groups % tp == 0) tps.push_back(tp);
  }
  std::string s = "tp=" + std::to_string(tps[rng() % tps.size()]) + "," + pps[rng() % 6] +
                  ",dp=" + std::to_string(1 + rng() % 3) + ",zero=" + std::to_string(rng() % 2);
  return *ParseConfig(s);
}

inline std::vector<int> RandomHosts(std::mt19937& rng, int world, int gpus, bool shuffled) {
  if (!shuffled) return DefaultHosts(world, gpus);
  std::vector<int> h(world);
  const int hosts = std::max(1, (world + gpus - 1) / gpus);
  for (int& x : h) x = static_cast<int>(rng() % hosts);
  return h;
}

// One planning case: a model (an index into the caller's models, or its own), two
// layouts and their host maps.
struct PlanCase {
  std::size_t model = 0;
  Model own;  // ManyHostCases' model
  Layout from, to;
  std::vector<int> fh, th;
  std::string label;
};

// A random case over `models` (Tiny(Specs()[i])): random configs, 1-4 GPUs per host,
// shuffled hosts one time in three, an old rank's host lost one time in lost_one_in.
inline PlanCase RandomCase(std::mt19937& rng, const std::vector<Model>& models,
                           unsigned lost_one_in) {
  PlanCase c;
  c.model = rng() % models.size();
  const int64_t groups = Specs()[c.model].groups;
  auto from = MakeLayout(models[c.model], RandomConfig(rng, groups));
  auto to = MakeLayout(models[c.model], RandomConfig(rng, groups));
  EXPECT_TRUE(from.ok() && to.ok());
  c.from = *from;
  c.to = *to;
  const int gpus = 1 + static_cast<int>(rng() % 4);
  const bool shuffled = rng() % 3 == 0;
  c.fh = RandomHosts(rng, c.from.world_size(), gpus, shuffled);
  c.th = RandomHosts(rng, c.to.world_size(), gpus, shuffled);
  if (rng() % lost_one_in == 0) c.fh[rng() % c.fh.size()] = kLostHost;
  c.label = c.from.config.ToString() + " -> " + c.to.config.ToString() + ", " +
            std::to_string(gpus) + " GPUs per host";
  return c;
}

// Cases with many hosts of each kind (SmallGpt(8, 32, 4)): DP scale-downs, a lost host
// re-planned from replicas (new ranks placed as the coordinator does: rank r on the
// (r / gpus)-th live host), TP and PP changes, uneven stages, uneven TP and DP splits
// (spec §9), ZeRO-1, tied embeddings, hosts holding part of a stage, shuffled hosts.
// Two (ZeRO-1 with a lost host) have no replica of the lost flat shards.
inline std::vector<PlanCase> ManyHostCases(std::mt19937& rng) {
  struct Spec {
    bool tied;
    const char* from;
    const char* to;
    int gpus;
    int lost;  // a host of the old layout, or -1
    bool shuffled;
  };
  const Spec specs[] = {
      {false, "tp=2,pp=4,dp=8", "tp=2,pp=4,dp=7", 2, -1, false},
      {true, "tp=2,pp=4,dp=8", "tp=2,pp=4,dp=6", 4, -1, false},
      {true, "tp=2,pp=4,dp=8", "tp=2,pp=4,dp=7", 2, 3, false},
      {false, "tp=2,pp=4,dp=6", "tp=1,pp=8,dp=6", 2, -1, false},
      {true, "tp=2,pp=3,layers=3+3+2,dp=6", "tp=2,pp=4,layers=1+3+3+1,dp=5", 2, -1, false},
      {false, "tp=2,pp=2,dp=6,zero=1", "tp=2,pp=4,dp=3", 4, 1, false},
      {true, "tp=2,pp=4,dp=4", "tp=4,pp=2,dp=5,zero=1", 3, -1, false},
      {true, "tp=2,pp=4,dp=6", "tp=2,pp=4,dp=5", 2, -1, true},
      {true, "tp=2,pp=4,dp=6", "tp=2,tp_weights=2+1,pp=4,dp=5", 2, -1, false},
      {false, "tp=2,tp_weights=1+3,pp=2,dp=6,dp_weights=2+1+1+1+1+1,zero=1",
       "tp=4,tp_weights=1+1+1+2,pp=2,dp=3", 4, 2, false},
  };
  std::vector<PlanCase> cases;
  for (const Spec& s : specs) {
    PlanCase c;
    c.own = SmallGpt(8, 32, 4, s.tied);
    auto from = MakeLayout(c.own, *ParseConfig(s.from));
    auto to = MakeLayout(c.own, *ParseConfig(s.to));
    EXPECT_TRUE(from.ok() && to.ok()) << s.from << " -> " << s.to;
    if (!from.ok() || !to.ok()) continue;
    c.from = *from;
    c.to = *to;
    c.fh = RandomHosts(rng, c.from.world_size(), s.gpus, s.shuffled);
    c.th = RandomHosts(rng, c.to.world_size(), s.gpus, s.shuffled);
    if (s.lost >= 0) {
      for (int& h : c.fh) h = h == s.lost ? kLostHost : h;
      for (int r = 0; r < c.to.world_size(); ++r) {
        const int slot = r / s.gpus;
        c.th[r] = slot < s.lost ? slot : slot + 1;
      }
    }
    c.label = std::string(s.from) + " -> " + s.to + ", " + std::to_string(s.gpus) +
              " GPUs per host, lost host " + std::to_string(s.lost);
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace tenplex::plan::testing
