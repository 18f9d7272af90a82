// The knobs of the policy (micro-batch, recompute, sequence parallelism, virtual
// pipeline stages): their terms against hand-computed values, and the search against
// an independent brute-force enumeration of the same cost model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "tenplex/model/gpt.h"
#include "tenplex/policy/policy.h"
#include "tenplex/policy/test_models.h"
#include "tenplex/store/parse.h"

namespace tenplex::policy {
namespace {

ParallelConfig Cfg(const std::string& s) { return *ParseConfig(s); }

Estimate Est(const Model& m, const std::string& cfg, const TrainingShape& sh,
             const DeviceProfile& p = DeviceProfile{}) {
  auto e = EstimateConfig(m, *GptShapeOf(m), Cfg(cfg), sh, p, {});
  EXPECT_TRUE(e.ok()) << cfg << ": " << e.status().ToString();
  return e.ok() ? *e : Estimate{};
}

// Korthikanti et al. §4.2.3: with v model chunks the first stage of the interleaved
// schedule holds L·(1 + (p - 1)/(p·v)) layers' activations instead of L.
TEST(PolicyKnobs, InterleavedFirstStageHoldsKorthikantisFactor) {
  Model m = Gpt("gpt3-175b");
  GptShape g = *GptShapeOf(m);
  TrainingShape sh;
  sh.global_batch = 64;  // m = 64 micro-batches, more than any warm-up
  const ParallelConfig c = Cfg("tp=8,pp=8");
  std::vector<int> bounds = *StageBounds(m, c);
  const double s = sh.seq_length, h = g.hidden, t = 8, sbh = s * h;
  const double layer = sbh * (18 + 4.0 * g.ffn / h) / t;  // selective + SP, per layer
  const double ends = (8 * s + sbh) / t;                  // token ids + embedding output
  for (int v : {1, 2, 3, 4, 6, 12}) {
    sh.virtual_stages = v;
    // layer-activations of the first stage (v = 1: plain 1F1B, p micro-batches of L / p)
    const double held = v == 1 ? 96 : 96 * (1 + 7.0 / (8 * v));
    // the embedding's activations live as long as the first chunk's micro-batches
    const double mb = v == 1 ? 8 : std::ceil((2.0 * 7 + (v - 1) * 8 + 1) / v);
    EXPECT_EQ(StageActivationBytes(g, c, bounds, 0, sh), std::llround(layer * held + ends * mb))
        << "v=" << v;
  }
}

TEST(PolicyKnobs, InterleavingDividesTheBubbleAndMultipliesP2p) {
  Model m = Gpt("gpt3-13b");  // 40 layers
  TrainingShape sh;
  sh.global_batch = 64;
  DeviceProfile p;
  p.gpus_per_host = 1;  // every stage on its own host: p2p on the inter-host link
  const Estimate one = Est(m, "tp=1,pp=4", sh, p);
  for (int v : {2, 5, 10}) {
    sh.virtual_stages = v;
    const Estimate e = Est(m, "tp=1,pp=4", sh, p);
    const double busy = e.time.compute + e.time.tp + e.time.p2p;
    EXPECT_NEAR(e.time.bubble / busy, 3.0 / (v * e.micro_batches), 1e-9) << v;
    EXPECT_EQ(e.time.compute, one.time.compute);
    // the slowest stage is the last (the logits): it touches 2v - 1 chunk boundaries
    // instead of 1 (middle ranks 2v instead of 2, the first 2v - 1)
    EXPECT_NEAR(e.time.p2p / one.time.p2p, 2 * v - 1, 1e-9) << v;
  }
  sh.virtual_stages = 3;  // 10 layers per stage are not 3 chunks
  EXPECT_FALSE(EstimateConfig(m, *GptShapeOf(m), Cfg("pp=4"), sh, p, {}).ok());
  sh.virtual_stages = 2;
  sh.global_batch = 6;  // 6 micro-batches are not a multiple of pp = 4
  EXPECT_FALSE(EstimateConfig(m, *GptShapeOf(m), Cfg("pp=4"), sh, p, {}).ok());
  EXPECT_FALSE(EstimateConfig(m, *GptShapeOf(m), Cfg("tp=4"), sh, p, {}).ok());  // pp = 1
}

// Block recomputation of n layers per stage: memory falls and time rises with n, and
// n = all layers is exactly uniform full recomputation; n = 0 layers would be none.
TEST(PolicyKnobs, BlockRecomputeIsBetweenNoneAndFull) {
  Model m = Gpt("gpt3-6.7b");  // 32 layers
  TrainingShape sh;
  sh.global_batch = 32;
  sh.recompute = Recompute::kFull;
  const Estimate full = Est(m, "tp=2,pp=2", sh);
  sh.recompute = Recompute::kNone;
  const Estimate none = Est(m, "tp=2,pp=2", sh);
  sh.recompute = Recompute::kFull;
  Estimate prev = none;
  for (int n = 1; n <= 16; ++n) {
    sh.recompute_layers = n;
    const Estimate e = Est(m, "tp=2,pp=2", sh);
    EXPECT_LT(e.memory.activations, prev.memory.activations) << n;
    EXPECT_GT(e.time.total(), prev.time.total()) << n;
    prev = e;
  }
  EXPECT_EQ(prev.memory.activations, full.memory.activations);
  EXPECT_DOUBLE_EQ(prev.time.total(), full.time.total());
  sh.recompute_layers = 40;  // more than a stage has: all of them
  EXPECT_EQ(Est(m, "tp=2,pp=2", sh).memory.activations, full.memory.activations);
  sh.recompute = Recompute::kSelective;  // a layer count needs full
  EXPECT_FALSE(EstimateConfig(m, *GptShapeOf(m), Cfg("tp=2"), sh, DeviceProfile{}, {}).ok());
}

TEST(PolicyKnobs, TpOverlapHidesThatFractionAndOverheadCountsPerLayer) {
  Model m = Gpt("gpt3-6.7b");
  TrainingShape sh;
  sh.global_batch = 16;
  DeviceProfile p;
  const Estimate base = Est(m, "tp=8", sh, p);
  p.tp_overlap = 0.75;
  EXPECT_NEAR(Est(m, "tp=8", sh, p).time.tp, 0.25 * base.time.tp, 1e-12);
  p.tp_overlap = 0;
  p.layer_overhead = 1e-4;
  // 32 layers x 16 micro-batches x 100 µs
  EXPECT_NEAR(Est(m, "tp=8", sh, p).time.compute - base.time.compute, 32 * 16 * 1e-4, 1e-9);
}

TEST(PolicyKnobs, MegatronArguments) {
  Model m = Gpt("gpt3-175b");
  Candidate c;
  c.config = Cfg("tp=8,pp=8,dp=2,zero=1");
  c.shape.global_batch = 64;
  c.shape.micro_batch = 2;
  c.shape.recompute = Recompute::kFull;
  c.shape.recompute_layers = 3;
  c.shape.virtual_stages = 4;
  std::vector<std::string> want = {"--tensor-model-parallel-size",
                                   "8",
                                   "--pipeline-model-parallel-size",
                                   "8",
                                   "--global-batch-size",
                                   "64",
                                   "--micro-batch-size",
                                   "2",
                                   "--seq-length",
                                   "2048",
                                   "--recompute-granularity",
                                   "full",
                                   "--recompute-method",
                                   "block",
                                   "--recompute-num-layers",
                                   "3",
                                   "--sequence-parallel",
                                   "--num-layers-per-virtual-pipeline-stage",
                                   "3",
                                   "--use-distributed-optimizer"};
  EXPECT_EQ(MegatronArgs(c, m.num_layers), want);
  c.config = Cfg("tp=1,pp=1");
  c.shape.recompute = Recompute::kSelective;
  c.shape.recompute_layers = 0;
  c.shape.virtual_stages = 1;
  std::vector<std::string> a = MegatronArgs(c, m.num_layers);
  EXPECT_EQ(std::count(a.begin(), a.end(), "--sequence-parallel"), 0);  // none at tp = 1
  EXPECT_EQ(a.back(), "selective");
}

// The oracle: every (tp, pp, dp) with tp·pp·dp = N by three loops, zero in {0, 1}, every
// micro-batch b dividing B/dp, every recompute mode with every layer count, both SP
// settings and every chunk count that splits the layers evenly, each evaluated
// (EstimatePrepared refuses the rest of what Megatron would); per config the fastest
// setting that fits. Nothing of the search is used: no
// divisor lists, no pruning, no block-recompute bisection.
std::map<std::string, Candidate> BruteForce(const Model& m, const SuggestOptions& o) {
  const GptShape g = *GptShapeOf(m);
  const int n = o.gpus, L = static_cast<int>(g.layers);
  std::map<std::string, Candidate> best;
  for (int tp = 1; tp <= n; ++tp) {
    for (int pp = 1; pp <= n; ++pp) {
      for (int dp = 1; dp <= n; ++dp) {
        if (tp * pp * dp != n || pp > L) continue;
        for (bool zero : {false, true}) {
          ParallelConfig c;
          c.tp = tp, c.pp = pp, c.dp = dp, c.zero = zero;
          if (zero && dp == 1) continue;
          if (L % pp) {  // docs/policy.md: L / pp each, the extra layers on middle stages first
            c.layers.assign(pp, L / pp);
            int extra = L % pp;
            for (int s = 1; s + 1 < pp && extra > 0; ++s, --extra) ++c.layers[s];
            for (int s = 0; extra > 0; s = (s + 1) % pp, --extra) ++c.layers[s];
          }
          if (!ValidateConfig(m, c).ok()) continue;
          auto p = PrepareConfig(m, c);
          if (!p.ok()) continue;
          for (int64_t b = 1; b * dp <= o.shape.global_batch; ++b) {
            if (o.shape.global_batch % (b * dp)) continue;  // whole micro-batches
            for (int mode = 0; mode < 3; ++mode) {
              const Recompute r = mode == 0   ? Recompute::kNone
                                  : mode == 1 ? Recompute::kSelective
                                              : Recompute::kFull;
              // a count beyond a stage's layers recomputes all of them, as 0 does
              const int most = r == Recompute::kFull ? (L + pp - 1) / pp : 0;
              for (int layers = 0; layers <= most; ++layers) {
                for (bool sp : {false, true}) {
                  for (int v = 1; v <= L; ++v) {
                    if (v > 1 && (pp < 2 || L % (pp * v))) continue;  // unequal chunks
                    TrainingShape sh = o.shape;
                    sh.micro_batch = b;
                    sh.recompute = r;
                    sh.recompute_layers = layers;
                    sh.sequence_parallel = sp;
                    sh.virtual_stages = v;
                    auto e = EstimatePrepared(g, *p, sh, o.profile, {});
                    if (!e.ok() || e->memory.total() > o.profile.memory_bytes) continue;
                    auto it = best.find(c.ToString());
                    if (it == best.end() || e->time.total() < it->second.estimate.time.total())
                      best[c.ToString()] = Candidate{c, sh, *e, true, false};
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return best;
}

struct OracleCase {
  const char* preset;
  int gpus;
  int64_t batch;
  const char* memory;
};

// Per config, the search's setting is as fast as the brute force's best (so the ranking,
// which sorts configs by it, puts the oracle's fastest config first), and the search
// finds exactly the configs that can fit.
class PolicySearch : public testing::TestWithParam<OracleCase> {};

// The new user's case (issue 33): GPT-3 175B on 48 x 80 GiB, 8 per host, B = 1536,
// b = 1. With recomputation fixed at selective and FP32 parameters the policy answered
// tp=12,pp=4 (TP across hosts, 1664 s); with the knobs searched TP stays in a host, in
// bf16 and in fp32 (where it fits only by recomputing).
TEST(PolicySearchCase, Gpt175bOn48GpusKeepsTpInsideAHost) {
  for (const char* dtype : {"bf16", "fp32"}) {
    SuggestOptions o;
    o.gpus = 48;
    o.shape.global_batch = 1536;
    o.shape.micro_batch = 1;
    o.search.micro_batch = false;
    auto s = Suggest(Gpt("gpt3-175b", dtype), o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const Candidate& first = s->ranked.front();
    EXPECT_FALSE(first.tp_crosses_hosts) << dtype << ": " << first.config.ToString();
    EXPECT_LE(first.config.tp, 8) << dtype;
    // the same search with recomputation fixed at selective (fp32: the old answer)
    o.search.recompute = false;
    auto fixed = Suggest(Gpt("gpt3-175b", dtype), o);
    ASSERT_TRUE(fixed.ok());
    EXPECT_LE(first.estimate.time.total(), fixed->ranked.front().estimate.time.total());
    if (std::string(dtype) == "fp32") {
      EXPECT_TRUE(fixed->ranked.front().tp_crosses_hosts);
      EXPECT_NE(first.shape.recompute, Recompute::kSelective);
      EXPECT_LT(first.estimate.time.total(), 0.5 * fixed->ranked.front().estimate.time.total());
    }
  }
}

TEST_P(PolicySearch, EqualsBruteForceEnumeration) {
  const OracleCase& k = GetParam();
  SuggestOptions o;
  o.gpus = k.gpus;
  o.shape.global_batch = k.batch;
  o.profile.memory_bytes = static_cast<int64_t>(*store::ParseByteSize(k.memory));
  const Model m = Gpt(k.preset);
  auto s = Suggest(m, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const std::map<std::string, Candidate> oracle = BruteForce(m, o);
  int fitting = 0;
  for (const Candidate& c : s->ranked) {
    if (!c.fits) continue;
    ++fitting;
    auto it = oracle.find(c.config.ToString());
    ASSERT_NE(it, oracle.end()) << c.config.ToString();
    EXPECT_NEAR(c.estimate.time.total() / it->second.estimate.time.total(), 1, 1e-12)
        << c.config.ToString() << " search " << RecomputeText(c.shape)
        << " b=" << c.shape.micro_batch << " v=" << c.shape.virtual_stages << ", oracle "
        << RecomputeText(it->second.shape) << " b=" << it->second.shape.micro_batch
        << " v=" << it->second.shape.virtual_stages;
  }
  EXPECT_EQ(fitting, static_cast<int>(oracle.size()));
  double fastest = 1e300;
  for (const auto& [name, c] : oracle) fastest = std::min(fastest, c.estimate.time.total());
  EXPECT_NEAR(s->ranked.front().estimate.time.total() / fastest, 1, 1e-12);
  // and the first suggestion keeps TP inside a host
  EXPECT_FALSE(s->ranked.front().tp_crosses_hosts) << s->ranked.front().config.ToString();
}

INSTANTIATE_TEST_SUITE_P(Cases, PolicySearch,
                         testing::Values(OracleCase{"gpt3-6.7b", 8, 64, "80GiB"},
                                         OracleCase{"gpt3-6.7b", 16, 32, "24GiB"},
                                         OracleCase{"gpt3-13b", 64, 128, "40GiB"},
                                         OracleCase{"gpt3-175b", 48, 96, "80GiB"},
                                         OracleCase{"gpt3-13b", 1024, 512, "80GiB"}));

}  // namespace
}  // namespace tenplex::policy
