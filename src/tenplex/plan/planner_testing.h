// Tiny GPT models, random parallel configs and host maps shared by the planner's tests
// (planner_test.cc, planner_host_test.cc, synthetic_test.cc).
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

}  // namespace tenplex::plan::testing
