// Checks every layout against a brute-force reference computed per element from the
// spec's formulas (ptc-layout.md §3-§6), independently of MakeLayout's box maths.
#include "tenplex/ptc/layout.h"

#include <gtest/gtest.h>

#include <map>
#include <regex>

#include "tenplex/geometry/testing.h"
#include "tenplex/model/gpt.h"

namespace tenplex {
namespace {

using testing::Ravel;
using testing::Unravel;

constexpr int64_t kPad = -1;

// (global tensor id, global flat index) per local element; id kPad for padding.
struct Elem {
  int64_t id = kPad;
  int64_t index = 0;
  friend bool operator==(const Elem&, const Elem&) = default;
};

struct RefTensor {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<Elem> elems;
};

class Reference {
 public:
  Reference(const Model& m, const ParallelConfig& c) : m_(m), c_(c) {
    for (const GlobalTensor& g : GlobalTensors(m)) ids_[g.name] = static_cast<int64_t>(ids_.size());
    // Stage bounds straight from the spec.
    int L = m.num_layers;
    first_.push_back(0);
    for (int s = 0; s < c.pp; ++s)
      first_.push_back(first_.back() + (c.layers.empty() ? L / c.pp : c.layers[s]));
  }

  int StageOfLayer(int layer) const {
    for (int s = 0; s < c_.pp; ++s) {
      if (layer >= first_[s] && layer < first_[s + 1]) return s;
    }
    return -1;
  }
  int StageOf(const Stage& st) const {
    if (st.kind == Stage::kFirst) return 0;
    if (st.kind == Stage::kLast) return c_.pp - 1;
    return StageOfLayer(st.layer);
  }

  // Spec §9 unit of a GPT tensor, from its path and the hyper-parameters (not from the
  // model's TP rule): U units along the split dim, each `unit` rows or columns. Returns
  // U = 0 for replicated tensors.
  std::pair<int64_t, int64_t> Units(const TensorDesc& p) const {
    auto info = [&](const char* k) { return std::stoll(m_.info.at(k)); };
    const int64_t a = info("num_attention_heads"), g = info("num_query_groups"),
                  d = info("kv_channels"), f = info("ffn_hidden_size"),
                  m = info("make_vocab_size_divisible_by");
    auto ends = [&](const char* suffix) {
      const std::string sfx(suffix);
      return p.path.size() >= sfx.size() &&
             p.path.compare(p.path.size() - sfx.size(), sfx.size(), sfx) == 0;
    };
    if (ends("linear_qkv.weight") || ends("linear_qkv.bias")) return {g, (a / g + 2) * d};
    if (ends("linear_proj.weight")) return {g, (a / g) * d};
    if (ends("linear_fc1.weight") || ends("linear_fc1.bias") || ends("linear_fc2.weight"))
      return {f, 1};
    if (p.path == "embedding.word_embeddings.weight" || p.path == "output_layer.weight") {
      const int64_t V = p.shape[0], T = c_.tp;
      return {((V + m * T - 1) / (m * T)) * (m * T) / m, m};
    }
    return {0, 1};
  }

  // Units per tp rank by largest remainders (spec §9), written as a count: rank i gets
  // an extra unit when fewer than R ranks rank before it (larger remainder, or equal
  // remainder and lower rank).
  std::vector<int64_t> Counts(int64_t U) const {
    const std::vector<int>& w = c_.tp_weights;
    int64_t W = 0, given = 0;
    for (int x : w) W += x;
    std::vector<int64_t> n(w.size()), rem(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) {
      n[i] = U * w[i] / W;
      rem[i] = U * w[i] - n[i] * W;
      given += n[i];
    }
    std::vector<int64_t> out = n;
    for (std::size_t i = 0; i < w.size(); ++i) {
      int64_t before = 0;
      for (std::size_t j = 0; j < w.size(); ++j)
        before += rem[j] > rem[i] || (rem[j] == rem[i] && j < i);
      if (before < U - given) ++out[i];
    }
    return out;
  }

  // The (tensor path, tp rank) MakeLayout must name as getting no unit: the first split
  // tensor in model order with a rank of 0 units, its lowest such rank; {"", -1} if none.
  std::pair<std::string, int> ExpectedError() const {
    if (c_.tp_weights.empty()) return {"", -1};
    for (const TensorDesc& p : m_.tensors) {
      if (p.tp.kind == TpRule::kReplicate) continue;
      std::vector<int64_t> n = Counts(Units(p).first);
      for (int t = 0; t < c_.tp; ++t) {
        if (n[t] == 0) return {p.path, t};
      }
    }
    return {"", -1};
  }

  // Spec §9: rank t holds units [o, o + n_t) of the split dim (of every block).
  std::pair<Shape, std::vector<int64_t>> WeightedSlice(const TensorDesc& p, int t) const {
    auto [U, unit] = Units(p);
    Shape ls = p.shape;
    std::vector<int64_t> n = Counts(U);
    int64_t o = 0;
    for (int k = 0; k < t; ++k) o += n[k];
    const int64_t V = p.shape[0];
    const bool vocab = p.tp.kind == TpRule::kVocab;
    const bool fc1 = p.tp.kind == TpRule::kBlocks;
    const int dim = p.tp.kind == TpRule::kReplicate ? -1 : p.tp.dim;
    const int64_t k_blocks = fc1 ? p.shape[0] / U : 1;
    if (dim >= 0) ls[dim] = n[t] * unit * k_blocks;
    std::vector<int64_t> g(Volume(ls));
    for (int64_t e = 0; e < Volume(ls); ++e) {
      auto idx = Unravel(e, ls);
      if (fc1) {
        idx[0] = (idx[0] / n[t]) * U + o + idx[0] % n[t];
      } else if (dim >= 0) {
        idx[dim] += o * unit;
      }
      g[e] = (vocab && idx[0] >= V) ? -1 : Ravel(idx, p.shape);
    }
    return {ls, g};
  }

  // Local shape and per-element global index (or -1 for padding) of param on tp rank t.
  std::pair<Shape, std::vector<int64_t>> Slice(const TensorDesc& p, int t) const {
    if (!c_.tp_weights.empty()) return WeightedSlice(p, t);
    const int64_t T = c_.tp;
    Shape ls = p.shape;
    int64_t part = 0, block = 0, V = 0, Vp = 0;
    switch (p.tp.kind) {
      case TpRule::kReplicate:
        break;
      case TpRule::kSplit:
        part = p.shape[p.tp.dim] / T;
        ls[p.tp.dim] = part;
        break;
      case TpRule::kBlocks:
        block = p.shape[0] / p.tp.blocks;
        part = block / T;
        ls[0] = part * p.tp.blocks;
        break;
      case TpRule::kVocab:
        V = p.shape[0];
        Vp = ((V + p.tp.divisible_by * T - 1) / (p.tp.divisible_by * T)) * p.tp.divisible_by * T;
        ls[0] = Vp / T;
        break;
    }
    std::vector<int64_t> g(Volume(ls));
    for (int64_t f = 0; f < Volume(ls); ++f) {
      auto idx = Unravel(f, ls);
      switch (p.tp.kind) {
        case TpRule::kReplicate:
          break;
        case TpRule::kSplit:
          idx[p.tp.dim] += t * part;
          break;
        case TpRule::kBlocks:
          idx[0] = (idx[0] / part) * block + t * part + idx[0] % part;
          break;
        case TpRule::kVocab:
          idx[0] += t * (Vp / T);
          break;
      }
      g[f] = (p.tp.kind == TpRule::kVocab && idx[0] >= V) ? -1 : Ravel(idx, p.shape);
    }
    return {ls, g};
  }

  std::string LocalName(const std::string& path, int s) const {
    static const std::regex re("^decoder\\.layers\\.([0-9]+)\\.(.*)$");
    std::smatch mt;
    if (!std::regex_match(path, mt, re)) return path;
    return "decoder.layers." + std::to_string(std::stoi(mt[1]) - first_[s]) + "." + mt[2].str();
  }

  std::vector<RefTensor> Rank(int r) const {
    const int t = r % c_.tp, d = (r / c_.tp) % c_.dp, s = r / (c_.tp * c_.dp);
    struct P {
      std::string local, global;
      const TensorDesc* desc;
    };
    std::vector<P> params;
    for (const TensorDesc& p : m_.tensors) {
      if (StageOf(p.stage) == s) params.push_back({LocalName(p.path, s), p.path, &p});
    }
    for (const AliasDesc& a : m_.aliases) {
      const TensorDesc& target = m_.tensors[m_.Find(a.target)];
      if (StageOf(a.stage) == s && StageOf(target.stage) != s)
        params.push_back({a.name, a.target, &target});
    }
    std::vector<RefTensor> out;
    std::vector<std::vector<int64_t>> pg;  // per param: global index per local element
    for (const P& p : params) {
      auto [ls, g] = Slice(*p.desc, t);
      RefTensor rt{p.local, p.desc->dtype, ls, {}};
      for (int64_t x : g) rt.elems.push_back(x < 0 ? Elem{} : Elem{ids_.at(p.global), x});
      out.push_back(rt);
      pg.push_back(g);
    }
    if (m_.optimizer.type == "none") return out;
    bool low = false;
    for (const TensorDesc& p : m_.tensors) low |= p.dtype != DType::kF32;
    std::vector<std::string> kinds = m_.optimizer.states;
    kinds.push_back("fp32_param");
    if (!c_.zero) {
      for (const std::string& k : kinds) {
        for (std::size_t i = 0; i < params.size(); ++i) {
          if (k == "fp32_param" && params[i].desc->dtype == DType::kF32) continue;
          RefTensor rt{"optimizer." + k + "." + params[i].local, DType::kF32, out[i].shape, {}};
          for (int64_t x : pg[i]) {
            rt.elems.push_back(x < 0 ? Elem{}
                                     : Elem{ids_.at("optimizer." + k + "." + params[i].global), x});
          }
          out.push_back(rt);
        }
      }
      return out;
    }
    // Flat: concatenate the params' local elements, pad to a multiple of dp.
    std::vector<std::pair<int, int64_t>> flat;  // (param, local flat index)
    for (std::size_t i = 0; i < params.size(); ++i) {
      for (int64_t f = 0; f < static_cast<int64_t>(pg[i].size()); ++f)
        flat.push_back({static_cast<int>(i), f});
    }
    int64_t n = flat.size(), np = (n + c_.dp - 1) / c_.dp * c_.dp, shard = np / c_.dp;
    for (const std::string& k : kinds) {
      if (k == "fp32_param" && !low) continue;
      RefTensor rt{"optimizer.flat." + k, DType::kF32, {shard}, {}};
      for (int64_t e = d * shard; e < (d + 1) * shard; ++e) {
        Elem el;
        if (e < n) {
          auto [i, f] = flat[e];
          int64_t x = pg[i][f];
          bool none = k == "fp32_param" && params[i].desc->dtype == DType::kF32;
          if (x >= 0 && !none) el = {ids_.at("optimizer." + k + "." + params[i].global), x};
        }
        rt.elems.push_back(el);
      }
      out.push_back(rt);
    }
    return out;
  }

  const std::map<std::string, int64_t>& ids() const { return ids_; }

 private:
  const Model& m_;
  const ParallelConfig& c_;
  std::map<std::string, int64_t> ids_;
  std::vector<int> first_;
};

// The per-element map a layout's pieces describe; fails on overlapping pieces.
std::vector<Elem> FromPieces(const LocalTensor& lt, const Layout& layout,
                             const std::map<std::string, int64_t>& ids) {
  std::vector<Elem> out(Volume(lt.shape));
  for (const Piece& p : lt.pieces) {
    const Shape& gs = layout.globals.at(p.tensor).shape;
    Shape ge = p.global.extents();
    int64_t vol = Volume(p.global);
    bool flat = p.local.rank() == 1 && p.local.extents() != ge;
    EXPECT_EQ(vol, Volume(p.local)) << lt.name;
    for (int64_t i = 0; i < vol; ++i) {
      auto gi = Unravel(i, ge);
      for (std::size_t k = 0; k < gi.size(); ++k) gi[k] += p.global[k].begin;
      int64_t lf;
      if (flat) {
        lf = p.local[0].begin + i;
      } else {
        auto li = Unravel(i, p.local.extents());
        for (std::size_t k = 0; k < li.size(); ++k) li[k] += p.local[k].begin;
        lf = Ravel(li, lt.shape);
      }
      EXPECT_EQ(out[lf].id, kPad) << lt.name << " element " << lf << " covered twice";
      out[lf] = {ids.at(p.tensor), Ravel(gi, gs)};
    }
  }
  return out;
}

void CheckLayout(const Model& m, const ParallelConfig& c) {
  SCOPED_TRACE(m.name + " " + c.ToString());
  Reference ref(m, c);
  auto [bad_tensor, bad_rank] = ref.ExpectedError();
  auto layout = MakeLayout(m, c);
  if (!bad_tensor.empty()) {
    ASSERT_FALSE(layout.ok()) << "expected an error for " << bad_tensor;
    const std::string& msg = layout.status().message();
    EXPECT_NE(msg.find("tp rank " + std::to_string(bad_rank) + " no "), std::string::npos) << msg;
    EXPECT_NE(msg.find(" of " + bad_tensor + " "), std::string::npos) << msg;
    return;
  }
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  ASSERT_EQ(layout->world_size(), c.world_size());
  for (int r = 0; r < c.world_size(); ++r) {
    const RankLayout& rl = layout->ranks[r];
    EXPECT_EQ(rl.rank, r);
    EXPECT_EQ(rl.tp, r % c.tp);
    EXPECT_EQ(rl.dp, (r / c.tp) % c.dp);
    EXPECT_EQ(rl.pp, r / (c.tp * c.dp));
    std::vector<RefTensor> want = ref.Rank(r);
    std::map<std::string, const LocalTensor*> got;
    for (const LocalTensor& lt : *rl.tensors) {
      EXPECT_TRUE(got.emplace(lt.name, &lt).second) << "duplicate local tensor " << lt.name;
    }
    ASSERT_EQ(got.size(), want.size()) << "rank " << r;
    for (const RefTensor& w : want) {
      auto it = got.find(w.name);
      ASSERT_NE(it, got.end()) << "rank " << r << " lacks " << w.name;
      const LocalTensor& lt = *it->second;
      EXPECT_EQ(lt.dtype, w.dtype) << w.name;
      ASSERT_EQ(lt.shape, w.shape) << w.name;
      EXPECT_TRUE(FromPieces(lt, *layout, ref.ids()) == w.elems)
          << "rank " << r << " tensor " << w.name;
    }
  }
}

Model Tiny(bool swiglu, int64_t groups, bool tied, bool bias, bool rms, bool bf16, bool adam = true,
           int64_t heads = 4, int64_t hidden = 8) {
  GptArgs a;
  a.name = std::string("tiny") + (swiglu ? "-swiglu" : "") + "-g" + std::to_string(groups) +
           (tied ? "-tied" : "-untied") + (bias ? "-bias" : "-nobias") + (rms ? "-rms" : "-ln") +
           (bf16 ? "-bf16" : "-fp32") + (adam ? "" : "-noopt") + "-a" + std::to_string(heads);
  a.num_layers = 4;
  a.hidden_size = hidden;
  a.num_attention_heads = heads;
  a.num_query_groups = groups;
  a.ffn_hidden_size = 12;
  a.vocab_size = 37;
  a.make_vocab_size_divisible_by = 4;
  a.max_position_embeddings = 6;
  a.swiglu = swiglu;
  a.untie_embeddings_and_output_weights = !tied;
  a.disable_bias_linear = !bias;
  a.normalization = rms ? "RMSNorm" : "LayerNorm";
  a.position_embedding_type = rms ? "rope" : "learned_absolute";
  a.params_dtype = bf16 ? "bf16" : "fp32";
  a.optimizer = adam ? "adam" : "none";
  auto m = MakeGpt(a);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

std::vector<Model> Models() {
  return {Tiny(false, 4, true, true, false, false), Tiny(true, 2, false, false, true, false),
          Tiny(true, 4, true, true, false, true), Tiny(false, 2, false, true, true, true),
          Tiny(false, 4, true, false, false, false, false)};
}

TEST(LayoutTest, MatchesBruteForceReference) {
  const char* pps[] = {"pp=1", "pp=2", "pp=2,layers=3+1", "pp=3,layers=2+1+1"};
  for (const Model& m : Models()) {
    int64_t g = std::stoll(m.info.at("num_query_groups"));
    for (int tp : {1, 2, 4}) {
      for (const char* pp : pps) {
        for (int dp : {1, 2, 3}) {
          for (int zero : {0, 1}) {
            std::string cs = "tp=" + std::to_string(tp) + "," + pp + ",dp=" + std::to_string(dp) +
                             ",zero=" + std::to_string(zero);
            auto c = ParseConfig(cs);
            ASSERT_TRUE(c.ok()) << cs;
            if (g % tp != 0) {
              auto l = MakeLayout(m, *c);
              ASSERT_FALSE(l.ok()) << cs;
              EXPECT_NE(l.status().message().find("g % tp"), std::string::npos)
                  << l.status().message();
              continue;
            }
            CheckLayout(m, *c);
          }
        }
      }
    }
  }
}

TEST(LayoutTest, Gpt3PresetShapes) {
  auto args = GptPreset("gpt3-125m");
  ASSERT_TRUE(args.ok());
  auto m = MakeGpt(*args);
  ASSERT_TRUE(m.ok());
  auto l = MakeLayout(*m, *ParseConfig("tp=2,pp=2"));
  ASSERT_TRUE(l.ok());
  // Vocab 50257 padded to a multiple of 128*2 = 50432, 25216 rows per tp rank.
  const LocalTensor* emb = l->ranks[0].Find("embedding.word_embeddings.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape, (Shape{25216, 768}));
  const LocalTensor* out = l->ranks[3].Find("output_layer.weight");
  ASSERT_NE(out, nullptr);  // tied copy on the last stage
  EXPECT_EQ(out->pieces[0].tensor, "embedding.word_embeddings.weight");
  EXPECT_EQ(out->pieces[0].global, Box({{25216, 50257}, {0, 768}}));
  EXPECT_NE(l->ranks[2].Find("decoder.layers.5.mlp.linear_fc2.weight"), nullptr);
  EXPECT_EQ(l->ranks[2].Find("decoder.layers.6.mlp.linear_fc2.weight"), nullptr);
  EXPECT_EQ(l->ranks[2].Find("decoder.layers.0.mlp.linear_fc2.weight")->pieces[0].tensor,
            "decoder.layers.6.mlp.linear_fc2.weight");
  EXPECT_EQ(l->ranks[0].Find("optimizer.exp_avg.decoder.layers.0.mlp.linear_fc1.weight")->shape,
            (Shape{1536, 768}));
}

TEST(ConfigTest, ParsesAndRejects) {
  auto c = ParseConfig("dp=3,tp=2,zero=1,pp=2,layers=3+1");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->ToString(), "tp=2,pp=2,dp=3,zero=1,layers=3+1");
  EXPECT_EQ(c->world_size(), 12);
  EXPECT_EQ(c->RankOf(1, 2, 1), 1 + 2 * (2 + 3 * 1));
  for (const char* bad : {"", "tp=0", "tp=2,tp=2", "xp=2", "tp=two", "zero=2", "tp",
                          "pp=2,layers=1+x", "pp=3,layers=1+1", "tp=-1", "tp=99999999999"}) {
    EXPECT_FALSE(ParseConfig(bad).ok()) << bad;
  }
  Model m = Tiny(false, 4, true, true, false, false);
  auto check = [&](const char* cs, const char* needle) {
    auto cfg = ParseConfig(cs);
    ASSERT_TRUE(cfg.ok()) << cs;
    Status s = MakeLayout(m, *cfg).status();
    ASSERT_FALSE(s.ok()) << cs;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  check("pp=3", "L % pp");
  check("pp=2,layers=3+2", "sums to 5");
  check("tp=3", "tp=3");  // g=4 % 3
  Model g8 = Tiny(false, 4, true, true, false, false);
  g8.tensors[g8.Find("decoder.layers.0.mlp.linear_fc1.weight")].shape[0] = 10;  // f % tp
  g8.tensors[g8.Find("decoder.layers.0.mlp.linear_fc2.weight")].shape[1] = 10;
  auto s = MakeLayout(g8, *ParseConfig("tp=4"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("f % tp"), std::string::npos) << s.status().message();
}

// Spec §9: uneven TP splits (tp_weights) and dp weights, per element against the
// weighted reference, with GQA (8 heads in 4 or 2 groups, 6 heads in 3 groups), SwiGLU,
// tied and untied embeddings with pp, ZeRO-1, and the configs where a rank would get
// no unit (the error must name the tensor and the rank).
TEST(LayoutTest, WeightedMatchesBruteForceReference) {
  // Base models: MHA with/without SwiGLU, tied/untied, bf16, no optimizer; plus GQA.
  std::vector<Model> models = Models();
  models.erase(models.begin() + 1, models.begin() + 3);
  models.push_back(Tiny(true, 4, false, true, false, false, true, 8, 16));  // GQA 8/4, untied
  models.push_back(Tiny(false, 2, true, false, true, true, true, 8, 16));   // GQA 8/2, tied
  models.push_back(Tiny(true, 3, true, true, false, false, true, 6, 12));   // GQA 6/3
  const char* tps[] = {
      "tp=2,tp_weights=1+1",     "tp=2,tp_weights=3+1",     "tp=2,tp_weights=1+2",
      "tp=2,tp_weights=5+3",     "tp=3,tp_weights=1+1+1",   "tp=3,tp_weights=2+1+1",
      "tp=3,tp_weights=1+2+3",   "tp=4,tp_weights=1+1+1+1", "tp=4,tp_weights=4+3+2+1",
      "tp=4,tp_weights=1+1+1+2", "tp=1,tp_weights=7"};
  // Stages: pp=1, and three stages (the tied output copy on the last one).
  const char* pps[] = {"pp=1", "pp=3,layers=2+1+1"};
  const char* dps[] = {"dp=1,zero=0", "dp=2,dp_weights=3+1,zero=0", "dp=2,dp_weights=3+1,zero=1",
                       "dp=3,dp_weights=1+2+1,zero=1"};
  int checked = 0, errors = 0;
  for (const Model& m : models) {
    for (const char* tp : tps) {
      for (const char* pp : pps) {
        for (const char* dp : dps) {
          const std::string cs = std::string(tp) + "," + pp + "," + dp;
          auto c = ParseConfig(cs);
          ASSERT_TRUE(c.ok()) << cs << ": " << c.status().ToString();
          CheckLayout(m, *c);
          ++checked;
          errors += !Reference(m, *c).ExpectedError().first.empty();
        }
      }
    }
  }
  // Both kinds of case occur.
  EXPECT_GT(errors, 20);
  EXPECT_GT(checked - errors, 300);
}

// Spec §9 example: g = 8 query groups, f = 64, V = 50, m = 8, tp=2,tp_weights=3+1.
TEST(LayoutTest, SpecNineExample) {
  GptArgs a;
  a.name = "spec9";
  a.num_layers = 2;
  a.hidden_size = 16;
  a.num_attention_heads = 8;
  a.num_query_groups = 8;
  a.ffn_hidden_size = 64;
  a.vocab_size = 50;
  a.make_vocab_size_divisible_by = 8;
  a.max_position_embeddings = 4;
  auto m = MakeGpt(a);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto l = MakeLayout(*m, *ParseConfig("tp=2,tp_weights=3+1"));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const int64_t group = (8 / 8 + 2) * 2;  // d = 16 / 8
  auto piece0 = [&](int r, const char* name) {
    return l->ranks[r].Find(name)->pieces.at(0).global;
  };
  EXPECT_EQ(piece0(0, "decoder.layers.0.self_attention.linear_qkv.weight"),
            Box({{0, 6 * group}, {0, 16}}));
  EXPECT_EQ(piece0(1, "decoder.layers.0.self_attention.linear_qkv.weight"),
            Box({{6 * group, 8 * group}, {0, 16}}));
  EXPECT_EQ(piece0(1, "decoder.layers.0.self_attention.linear_proj.weight"),
            Box({{0, 16}, {12, 16}}));
  EXPECT_EQ(piece0(0, "decoder.layers.1.mlp.linear_fc1.weight"), Box({{0, 48}, {0, 16}}));
  EXPECT_EQ(piece0(1, "decoder.layers.1.mlp.linear_fc2.weight"), Box({{0, 16}, {48, 64}}));
  // Vocabulary: Vp = 64, 8 units of 8 rows split 6+2; rank 1 rows 48..63, 50.. padding.
  EXPECT_EQ(l->ranks[0].Find("embedding.word_embeddings.weight")->shape, (Shape{48, 16}));
  EXPECT_EQ(l->ranks[1].Find("embedding.word_embeddings.weight")->shape, (Shape{16, 16}));
  EXPECT_EQ(piece0(1, "embedding.word_embeddings.weight"), Box({{48, 50}, {0, 16}}));
  // Weights are not reduced, but 6+2 gives the same layout as 3+1.
  auto l62 = MakeLayout(*m, *ParseConfig("tp=2,tp_weights=6+2"));
  ASSERT_TRUE(l62.ok());
  EXPECT_EQ(LayoutToJson(*l62, false), LayoutToJson(*l, false));
  // 8 groups over tp=3: plain tp=3 is an error, equal weights give 3+3+2 groups.
  EXPECT_FALSE(MakeLayout(*m, *ParseConfig("tp=3")).ok());
  auto l3 = MakeLayout(*m, *ParseConfig("tp=3,tp_weights=1+1+1"));
  ASSERT_TRUE(l3.ok()) << l3.status().ToString();
  EXPECT_EQ(l3->config.ToString(), "tp=3,pp=1,dp=1,tp_weights=1+1+1");
  EXPECT_EQ(
      l3->ranks[2].Find("decoder.layers.0.self_attention.linear_qkv.weight")->pieces[0].global,
      Box({{6 * group, 8 * group}, {0, 16}}));
}

TEST(ConfigTest, WeightsParseCanonicalAndReject) {
  auto c = ParseConfig("dp_weights=2+1+1,tp=2,dp=3,tp_weights=3+1");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->ToString(), "tp=2,pp=1,dp=3,tp_weights=3+1,dp_weights=2+1+1");
  EXPECT_EQ(ParseConfig(c->ToString())->ToString(), c->ToString());
  EXPECT_EQ(c->TpWeights(), (std::vector<int>{3, 1}));
  EXPECT_EQ(ParseConfig("dp=2")->DpWeights(), (std::vector<int>{1, 1}));
  for (const char* bad :
       {"tp=2,tp_weights=1", "tp=2,tp_weights=1+1+1", "tp=2,tp_weights=0+1", "tp=2,tp_weights=1+-1",
        "tp=2,tp_weights=1+x", "tp=2,tp_weights=", "dp=2,dp_weights=2", "dp=2,dp_weights=1+0",
        "tp=2,tp_weights=1+1,tp_weights=1+1", "tp=2,tp_weights=1+99999999"}) {
    EXPECT_FALSE(ParseConfig(bad).ok()) << bad;
  }
  // Canonical: equal weights dropped when the even split applies (g = 4, f = 12).
  Model m = Tiny(false, 4, true, true, false, false);
  auto canon = [&](const char* cs) { return CanonicalConfig(m, *ParseConfig(cs)).ToString(); };
  EXPECT_EQ(canon("tp=2,tp_weights=2+2,dp=2,dp_weights=5+5"), "tp=2,pp=1,dp=2");
  EXPECT_EQ(canon("tp=3,tp_weights=1+1+1"), "tp=3,pp=1,dp=1,tp_weights=1+1+1");  // g % 3 != 0
  EXPECT_EQ(canon("tp=2,tp_weights=3+1,dp=2,dp_weights=1+2"),
            "tp=2,pp=1,dp=2,tp_weights=3+1,dp_weights=1+2");
  // A layout records the canonical config; dp_weights leave the layout unchanged.
  auto l = MakeLayout(m, *ParseConfig("tp=2,tp_weights=1+1,dp=2,dp_weights=3+1"));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->config.ToString(), "tp=2,pp=1,dp=2,dp_weights=3+1");
  EXPECT_EQ(LayoutToJson(*l, false),
            LayoutToJson(*MakeLayout(m, *ParseConfig("tp=2,dp=2")), false));
  // Error names the tensor and the rank: 4 query groups over 4+3+2+1 give 2+1+1+0.
  auto e = MakeLayout(m, *ParseConfig("tp=4,tp_weights=4+3+2+1"));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("tp rank 3 no query groups of "
                                      "decoder.layers.0.self_attention.linear_qkv.weight"),
            std::string::npos)
      << e.status().message();
  // Vocabulary: V = 37, m = 4, tp = 2: 10 units; weights 1+20 give rank 0 none.
  Model untied = Tiny(false, 4, false, true, false, false);
  auto v = MakeLayout(untied, *ParseConfig("tp=2,tp_weights=1+20"));
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("tp rank 0 no vocabulary units"), std::string::npos)
      << v.status().message();
}

}  // namespace
}  // namespace tenplex
