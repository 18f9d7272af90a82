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

  // Local shape and per-element global index (or -1 for padding) of param on tp rank t.
  std::pair<Shape, std::vector<int64_t>> Slice(const TensorDesc& p, int t) const {
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
  auto layout = MakeLayout(m, c);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  ASSERT_EQ(layout->world_size(), c.world_size());
  Reference ref(m, c);
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

Model Tiny(bool swiglu, int64_t groups, bool tied, bool bias, bool rms, bool bf16,
           bool adam = true) {
  GptArgs a;
  a.name = std::string("tiny") + (swiglu ? "-swiglu" : "") + "-g" + std::to_string(groups) +
           (tied ? "-tied" : "-untied") + (bias ? "-bias" : "-nobias") + (rms ? "-rms" : "-ln") +
           (bf16 ? "-bf16" : "-fp32") + (adam ? "" : "-noopt");
  a.num_layers = 4;
  a.hidden_size = 8;
  a.num_attention_heads = 4;
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

}  // namespace
}  // namespace tenplex
