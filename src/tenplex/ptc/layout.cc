#include "tenplex/ptc/layout.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tenplex/util/format.h"

namespace tenplex {
namespace {

int StageOf(const Stage& st, const std::vector<int>& bounds) {
  const int pp = static_cast<int>(bounds.size()) - 1;
  if (st.kind == Stage::kFirst) return 0;
  if (st.kind == Stage::kLast) return pp - 1;
  auto it = std::upper_bound(bounds.begin(), bounds.end(), st.layer);
  return static_cast<int>(it - bounds.begin()) - 1;
}

// The local shape of tensor t on tp rank r, and its pieces (global -> local): rank r
// holds units [u.begin, u.end) of the split dim (of every block for blocks(k)), each
// `unit` rows or columns long (spec §4, §9).
void Slice(const TensorDesc& t, const std::string& global_name, int tp, UnitRange u, Shape* shape,
           std::vector<Piece>* pieces) {
  const TpRule& rule = t.tp;
  *shape = t.shape;
  Box g = BoxOf(t.shape);
  if (rule.kind == TpRule::kReplicate) {
    pieces->push_back({global_name, g, g});
    return;
  }
  const int64_t unit = TpUnitsOf(t, tp).unit;
  const int64_t b = u.begin * unit, e = u.end * unit, part = e - b;
  switch (rule.kind) {
    case TpRule::kReplicate:
      return;
    case TpRule::kSplit: {
      (*shape)[rule.dim] = part;
      g[rule.dim] = {b, e};
      pieces->push_back({global_name, g, BoxOf(*shape)});
      return;
    }
    case TpRule::kBlocks: {
      const int64_t block = t.shape[0] / rule.blocks;
      (*shape)[0] = part * rule.blocks;
      for (int k = 0; k < rule.blocks; ++k) {
        Box gb = g, lb = BoxOf(*shape);
        gb[0] = {k * block + b, k * block + e};
        lb[0] = {k * part, (k + 1) * part};
        if (part > 0) pieces->push_back({global_name, gb, lb});
      }
      return;
    }
    case TpRule::kVocab: {
      const int64_t V = t.shape[0];
      (*shape)[0] = part;
      const int64_t vb = std::min(V, b), ve = std::min(V, e);
      if (ve > vb) {
        Box gb = g, lb = BoxOf(*shape);
        gb[0] = {vb, ve};
        lb[0] = {0, ve - vb};
        pieces->push_back({global_name, gb, lb});
      }
      return;
    }
  }
}

// Each tensor's unit range per tp rank: TpUnitRange, with the apportionment of a
// weighted config computed once per tensor instead of once per (tensor, rank).
class UnitRanges {
 public:
  explicit UnitRanges(const ParallelConfig& c) : c_(c) {}
  UnitRange Get(const TensorDesc& t, int r) {
    if (c_.tp_weights.empty() || t.tp.kind == TpRule::kReplicate) return TpUnitRange(t, c_, r);
    std::vector<int64_t>& b = begins_[&t];
    if (b.empty()) {
      b.push_back(0);
      for (int64_t n : Apportion(TpUnitsOf(t, c_.tp).units, c_.tp_weights))
        b.push_back(b.back() + n);
    }
    return {b[r], b[r + 1]};
  }

 private:
  const ParallelConfig& c_;
  std::map<const TensorDesc*, std::vector<int64_t>> begins_;
};

struct ParamEntry {
  const TensorDesc* desc;
  std::string local_name;
  std::string global_name;
};

// Parameters per stage, in spec order, aliases last.
std::vector<std::vector<ParamEntry>> StageParams(const Model& model, const std::vector<int>& bounds,
                                                 int pp) {
  std::vector<std::vector<ParamEntry>> stage_params(pp);
  for (const TensorDesc& t : model.tensors) {
    int s = StageOf(t.stage, bounds);
    stage_params[s].push_back({&t, LocalName(model, t.path, bounds[s]), t.path});
  }
  for (const AliasDesc& a : model.aliases) {
    const TensorDesc& target = model.tensors[model.Find(a.target)];
    int s = StageOf(a.stage, bounds);
    if (StageOf(target.stage, bounds) == s) continue;
    stage_params[s].push_back({&target, a.name, a.target});
  }
  return stage_params;
}

// Tensor-parallel rank t's slices of a stage's parameters (entries).
std::vector<LocalTensor> LocalParams(const std::vector<ParamEntry>& entries, int tp, int t,
                                     UnitRanges& ranges) {
  std::vector<LocalTensor> params;
  for (const ParamEntry& e : entries) {
    LocalTensor lt;
    lt.name = e.local_name;
    lt.param = e.global_name;
    lt.dtype = e.desc->dtype;
    Slice(*e.desc, e.global_name, tp, ranges.Get(*e.desc, t), &lt.shape, &lt.pieces);
    params.push_back(std::move(lt));
  }
  return params;
}

// Without ZeRO: the parameters, then each one's companions (optimizer states and the
// fp32 master copy), kind by kind; every dp rank holds the same list.
std::shared_ptr<const std::vector<LocalTensor>> ReplicatedTensors(
    const Model& model, const std::vector<LocalTensor>& params,
    const std::vector<ParamEntry>& entries) {
  auto list = std::make_shared<std::vector<LocalTensor>>(params);
  std::vector<std::string> kinds = model.optimizer.states;
  if (model.optimizer.type != "none") kinds.push_back("fp32_param");
  if (model.optimizer.type == "none") kinds.clear();
  for (const std::string& kind : kinds) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto ck = CompanionKinds(model, params[i].dtype);
      if (std::find(ck.begin(), ck.end(), kind) == ck.end()) continue;
      LocalTensor c = params[i];
      c.name = CompanionName(kind, params[i].name);
      c.dtype = DType::kF32;
      for (Piece& pc : c.pieces) pc.tensor = CompanionName(kind, entries[i].global_name);
      list->push_back(std::move(c));
    }
  }
  return list;
}

// ZeRO-1: the flat shard [lo, hi) of companion `kind` over the stage's flattened local
// parameters (params[i] starts at base[i]).
LocalTensor FlatShard(const std::string& kind, const std::vector<LocalTensor>& params,
                      const std::vector<ParamEntry>& entries, const std::vector<int64_t>& base,
                      int64_t lo, int64_t hi) {
  LocalTensor flat;
  flat.name = "optimizer.flat." + kind;
  flat.dtype = DType::kF32;
  flat.shape = {hi - lo};
  for (std::size_t i = 0; i < params.size(); ++i) {
    const LocalTensor& p = params[i];
    const int64_t vol = Volume(p.shape);
    const int64_t a = std::max(lo, base[i]) - base[i], b = std::min(hi, base[i] + vol) - base[i];
    if (a >= b) continue;
    if (kind == "fp32_param" && p.dtype == DType::kF32) continue;  // maps to nothing
    const std::string gname = CompanionName(kind, entries[i].global_name);
    for (const Box& c : FlatRangeToBoxes(p.shape, a, b)) {
      for (const Piece& pc : p.pieces) {
        Box inter = Intersect(c, pc.local);
        if (IsEmpty(inter)) continue;
        for (const Box& q : ContiguousParts(p.shape, inter)) {
          int64_t off = base[i] + FlatOffset(p.shape, q) - lo;
          flat.pieces.push_back(
              {gname, MapBox(q, pc.local, pc.global), Box({{off, off + Volume(q)}})});
        }
      }
    }
  }
  return flat;
}

}  // namespace

std::string LocalName(const Model& model, const std::string& path, int first_layer) {
  const std::string& pre = model.layer_prefix;
  if (path.rfind(pre, 0) != 0) return path;
  std::size_t dot = path.find('.', pre.size());
  if (dot == std::string::npos) return path;
  int layer = std::stoi(path.substr(pre.size(), dot - pre.size()));
  return pre + std::to_string(layer - first_layer) + path.substr(dot);
}

FlatRange ZeroFlatRange(int64_t total, int dp, int dp_rank) {
  const int64_t padded = (total + dp - 1) / dp * dp, per = padded / dp;
  return {dp_rank * per, (dp_rank + 1) * per, padded};
}

int64_t RankLayout::bytes() const {
  int64_t b = 0;
  for (const LocalTensor& t : *tensors) b += t.bytes();
  return b;
}

const LocalTensor* RankLayout::Find(const std::string& name) const {
  for (const LocalTensor& t : *tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Result<Layout> MakeLayout(const Model& model, const ParallelConfig& config) {
  TP_RETURN_IF_ERROR(ValidateConfig(model, config));
  Layout layout;
  layout.config = CanonicalConfig(model, config);
  TP_ASSIGN_OR_RETURN(layout.stage_bounds, StageBounds(model, config));
  for (GlobalTensor& g : GlobalTensors(model)) layout.globals.emplace(g.name, std::move(g));
  const int T = config.tp, P = config.pp, D = config.dp;
  const std::vector<std::vector<ParamEntry>> stage_params =
      StageParams(model, layout.stage_bounds, P);
  UnitRanges ranges(config);
  bool any_low_precision = false;
  for (const TensorDesc& t : model.tensors) any_low_precision |= t.dtype != DType::kF32;

  layout.ranks.resize(config.world_size());
  for (int s = 0; s < P; ++s) {
    for (int t = 0; t < T; ++t) {
      const std::vector<LocalTensor> params = LocalParams(stage_params[s], T, t, ranges);
      if (!config.zero || model.optimizer.type == "none") {
        std::shared_ptr<const std::vector<LocalTensor>> shared =
            ReplicatedTensors(model, params, stage_params[s]);
        for (int d = 0; d < D; ++d) {
          int r = config.RankOf(t, d, s);
          layout.ranks[r] = {r, t, s, d, shared};
        }
        continue;
      }
      // ZeRO-1: flat shards of the stage's flattened local parameters.
      int64_t n = 0;
      std::vector<int64_t> base;
      for (const LocalTensor& p : params) {
        base.push_back(n);
        n += Volume(p.shape);
      }
      std::vector<std::string> kinds = model.optimizer.states;
      if (any_low_precision) kinds.push_back("fp32_param");
      for (int d = 0; d < D; ++d) {
        auto list = std::make_shared<std::vector<LocalTensor>>(params);
        const FlatRange range = ZeroFlatRange(n, D, d);
        for (const std::string& kind : kinds)
          list->push_back(FlatShard(kind, params, stage_params[s], base, range.begin, range.end));
        int r = config.RankOf(t, d, s);
        layout.ranks[r] = {r, t, s, d, std::move(list)};
      }
    }
  }
  return layout;
}

std::string LayoutToJson(const Layout& layout, bool extra) {
  using nlohmann::json;
  auto box_json = [](const Box& b) {
    json a = json::array();
    for (const Interval& iv : b.dims) a.push_back({iv.begin, iv.end});
    return a;
  };
  json j;
  j["world_size"] = layout.world_size();
  if (extra) j["config"] = layout.config.ToString();
  json ranks = json::array();
  for (const RankLayout& r : layout.ranks) {
    json jr = {{"rank", r.rank}, {"tp", r.tp}, {"pp", r.pp}, {"dp", r.dp}};
    if (extra) jr["bytes"] = r.bytes();
    json ts = json::array();
    for (const LocalTensor& t : *r.tensors) {
      json jp = json::array();
      for (const Piece& p : t.pieces) {
        jp.push_back(
            {{"tensor", p.tensor}, {"global", box_json(p.global)}, {"local", box_json(p.local)}});
      }
      ts.push_back({{"name", t.name},
                    {"dtype", std::string(DTypeName(t.dtype))},
                    {"shape", t.shape},
                    {"pieces", std::move(jp)}});
    }
    jr["tensors"] = std::move(ts);
    ranks.push_back(std::move(jr));
  }
  j["ranks"] = std::move(ranks);
  return j.dump() + "\n";
}

std::string LayoutToText(const Model& model, const Layout& layout) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "model %s: %d layers, %zu global tensors, %s\n",
                model.name.c_str(), model.num_layers, layout.globals.size(),
                HumanBytes(GlobalBytes(model)).c_str());
  out += line;
  std::snprintf(line, sizeof(line), "config %s: world size %d\n", layout.config.ToString().c_str(),
                layout.world_size());
  out += line;
  for (int s = 0; s < layout.config.pp; ++s) {
    std::snprintf(line, sizeof(line), "  stage %d: layers [%d, %d)\n", s, layout.stage_bounds[s],
                  layout.stage_bounds[s + 1]);
    out += line;
  }
  std::snprintf(line, sizeof(line), "%6s %4s %4s %4s %8s %14s %12s\n", "rank", "tp", "pp", "dp",
                "tensors", "bytes", "");
  out += line;
  int64_t total = 0;
  for (const RankLayout& r : layout.ranks) {
    int64_t b = r.bytes();
    total += b;
    std::snprintf(line, sizeof(line), "%6d %4d %4d %4d %8zu %14lld %12s\n", r.rank, r.tp, r.pp,
                  r.dp, r.tensors->size(), static_cast<long long>(b), HumanBytes(b).c_str());
    out += line;
  }
  std::snprintf(line, sizeof(line), "total %s over %d ranks\n", HumanBytes(total).c_str(),
                layout.world_size());
  out += line;
  return out;
}

}  // namespace tenplex
