#include "tenplex/ptc/config.h"

#include <algorithm>
#include <charconv>
#include <set>

#include "tenplex/util/format.h"

namespace tenplex {
namespace {

Result<int> ParseInt(std::string_view s, std::string_view key) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) {
    return InvalidArgument("config: " + std::string(key) + "=" + std::string(s) +
                           " is not an integer");
  }
  return v;
}

bool AllEqual(const std::vector<int>& w) {
  return std::all_of(w.begin(), w.end(), [&](int x) { return x == w.front(); });
}

}  // namespace

std::vector<int> ParallelConfig::TpWeights() const {
  return tp_weights.empty() ? std::vector<int>(tp, 1) : tp_weights;
}

std::vector<int> ParallelConfig::DpWeights() const {
  return dp_weights.empty() ? std::vector<int>(dp, 1) : dp_weights;
}

std::string ParallelConfig::ToString() const {
  std::string s =
      "tp=" + std::to_string(tp) + ",pp=" + std::to_string(pp) + ",dp=" + std::to_string(dp);
  if (zero) s += ",zero=1";
  if (!layers.empty()) {
    s += ",layers=";
    for (std::size_t i = 0; i < layers.size(); ++i) s += (i ? "+" : "") + std::to_string(layers[i]);
  }
  if (!tp_weights.empty()) s += ",tp_weights=" + JoinWeights(tp_weights);
  if (!dp_weights.empty()) s += ",dp_weights=" + JoinWeights(dp_weights);
  return s;
}

Result<ParallelConfig> ParseConfig(std::string_view text) {
  ParallelConfig c;
  if (text.empty()) return InvalidArgument("config: empty (expected e.g. tp=2,pp=2,dp=2)");
  std::set<std::string> seen;
  for (std::string_view part : SplitString(text, ',')) {
    std::size_t eq = part.find('=');
    if (eq == std::string_view::npos) {
      return InvalidArgument(
          "config: '" + std::string(part) +
          "' is not key=value (keys: tp, pp, dp, zero, layers, tp_weights, dp_weights)");
    }
    std::string key(part.substr(0, eq));
    std::string_view val = part.substr(eq + 1);
    if (!seen.insert(key).second) return InvalidArgument("config: " + key + " is given twice");
    if (key == "tp" || key == "pp" || key == "dp") {
      TP_ASSIGN_OR_RETURN(int v, ParseInt(val, key));
      if (v < 1)
        return InvalidArgument("config: " + key + " must be >= 1 (got " + std::to_string(v) + ")");
      if (v > (1 << 20))
        return InvalidArgument("config: " + key + "=" + std::to_string(v) + " is too large");
      (key == "tp" ? c.tp : key == "pp" ? c.pp : c.dp) = v;
    } else if (key == "zero") {
      TP_ASSIGN_OR_RETURN(int v, ParseInt(val, key));
      if (v != 0 && v != 1)
        return InvalidArgument("config: zero must be 0 or 1 (got " + std::to_string(v) + ")");
      c.zero = v == 1;
    } else if (key == "layers") {
      for (std::string_view l : SplitString(val, '+')) {
        TP_ASSIGN_OR_RETURN(int v, ParseInt(l, "layers"));
        if (v < 0) return InvalidArgument("config: layers per stage must be >= 0");
        c.layers.push_back(v);
      }
    } else if (key == "tp_weights" || key == "dp_weights") {
      TP_ASSIGN_OR_RETURN(std::vector<int> w, ParseWeights(val, "config: " + key));
      (key == "tp_weights" ? c.tp_weights : c.dp_weights) = std::move(w);
    } else {
      return InvalidArgument("config: unknown key '" + key +
                             "' (keys: tp, pp, dp, zero, layers, tp_weights, dp_weights)");
    }
  }
  if (static_cast<int64_t>(c.tp) * c.pp * c.dp > (1 << 24)) {
    return InvalidArgument("config: world size tp*pp*dp is too large");
  }
  if (!c.layers.empty() && static_cast<int>(c.layers.size()) != c.pp) {
    return InvalidArgument("config: layers= lists " + std::to_string(c.layers.size()) +
                           " stages but pp=" + std::to_string(c.pp));
  }
  if (!c.tp_weights.empty() && static_cast<int>(c.tp_weights.size()) != c.tp) {
    return InvalidArgument("config: tp_weights= lists " + std::to_string(c.tp_weights.size()) +
                           " weights but tp=" + std::to_string(c.tp));
  }
  if (!c.dp_weights.empty() && static_cast<int>(c.dp_weights.size()) != c.dp) {
    return InvalidArgument("config: dp_weights= lists " + std::to_string(c.dp_weights.size()) +
                           " weights but dp=" + std::to_string(c.dp));
  }
  return c;
}

TpUnits TpUnitsOf(const TensorDesc& t, int tp) {
  const TpRule& r = t.tp;
  TpUnits u;
  switch (r.kind) {
    case TpRule::kReplicate:
      return u;
    case TpRule::kSplit:
      u.unit = r.granule;
      u.units = t.shape[r.dim] / r.granule;
      u.what = !r.granule_name.empty() ? r.granule_name.c_str() : r.dim == 0 ? "rows" : "columns";
      return u;
    case TpRule::kBlocks:
      u.units = t.shape[0] / r.blocks;
      u.what = "rows of each block";
      return u;
    case TpRule::kVocab: {
      const int64_t m = r.divisible_by, mt = m * tp;
      u.unit = m;
      u.units = (t.shape[0] + mt - 1) / mt * tp;  // Vp / m
      u.what = "vocabulary units (of m rows)";
      return u;
    }
  }
  return u;
}

UnitRange TpUnitRange(const TensorDesc& t, const ParallelConfig& c, int tp_rank) {
  const int64_t units = TpUnitsOf(t, c.tp).units;
  if (c.tp_weights.empty()) {
    const int64_t per = units / c.tp;
    return {tp_rank * per, (tp_rank + 1) * per};
  }
  return ApportionRange(units, c.tp_weights, tp_rank);
}

Result<std::vector<int>> StageBounds(const Model& model, const ParallelConfig& c) {
  const int L = model.num_layers;
  std::vector<int> b(1, 0);
  if (c.layers.empty()) {
    if (L % c.pp != 0) {
      return InvalidArgument("pp=" + std::to_string(c.pp) + " does not divide the " +
                             std::to_string(L) +
                             " layers (L % pp != 0); give layers=a+b+... to split them unevenly");
    }
    for (int s = 0; s < c.pp; ++s) b.push_back(b.back() + L / c.pp);
    return b;
  }
  if (static_cast<int>(c.layers.size()) != c.pp) {
    return InvalidArgument("layers= lists " + std::to_string(c.layers.size()) +
                           " stages but pp=" + std::to_string(c.pp));
  }
  int64_t sum = 0;
  for (int l : c.layers) sum += l;
  if (sum != L) {
    return InvalidArgument("layers= sums to " + std::to_string(sum) + " but the model has " +
                           std::to_string(L) + " layers");
  }
  for (int l : c.layers) b.push_back(b.back() + l);
  return b;
}

namespace {

// Spec §9: every tp rank gets at least one unit of every split tensor.
Status ValidateWeighted(const Model& model, const ParallelConfig& c) {
  for (const TensorDesc& t : model.tensors) {
    const TpRule& r = t.tp;
    if (r.kind == TpRule::kReplicate) continue;
    if (r.kind == TpRule::kSplit && t.shape[r.dim] % r.granule != 0) {
      return InvalidArgument("dim " + std::to_string(r.dim) + " (" +
                             std::to_string(t.shape[r.dim]) + ") of " + t.path +
                             " is not a whole number of units of " + std::to_string(r.granule));
    }
    const TpUnits u = TpUnitsOf(t, c.tp);
    const std::vector<int64_t> n = Apportion(u.units, c.tp_weights);
    for (int k = 0; k < c.tp; ++k) {
      if (n[k] > 0) continue;
      return InvalidArgument("tp_weights=" + JoinWeights(c.tp_weights) + " gives tp rank " +
                             std::to_string(k) + " no " + u.what + " of " + t.path + " (" +
                             std::to_string(u.units) + " " + u.what + " over " +
                             std::to_string(c.tp) + " ranks); every rank needs at least one");
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateConfig(const Model& model, const ParallelConfig& c) {
  TP_RETURN_IF_ERROR(StageBounds(model, c).status());
  if (!c.tp_weights.empty()) return ValidateWeighted(model, c);
  const int64_t T = c.tp;
  for (const TensorDesc& t : model.tensors) {
    const TpRule& r = t.tp;
    if (r.kind == TpRule::kSplit) {
      int64_t n = t.shape[r.dim];
      if (r.granule > 1) {
        if (n % r.granule != 0 || (n / r.granule) % T != 0) {
          std::string what = r.granule_name.empty() ? "units" : r.granule_name;
          return InvalidArgument("tp=" + std::to_string(T) + " does not divide the " +
                                 std::to_string(n / r.granule) + " " + what + " of " + t.path +
                                 (r.granule_name == "query groups" ? " (g % tp != 0)" : ""));
        }
      } else if (n % T != 0) {
        return InvalidArgument("tp=" + std::to_string(T) + " does not divide dim " +
                               std::to_string(r.dim) + " (" + std::to_string(n) + ") of " + t.path);
      }
    } else if (r.kind == TpRule::kBlocks) {
      int64_t block = t.shape[0] / r.blocks;
      if (block % T != 0) {
        return InvalidArgument("tp=" + std::to_string(T) + " does not divide the blocks of " +
                               std::to_string(block) + " rows of " + t.path + " (f % tp != 0)");
      }
    }
  }
  return Status::Ok();
}

ParallelConfig CanonicalConfig(const Model& model, const ParallelConfig& config) {
  ParallelConfig c = config;
  if (!c.dp_weights.empty() && AllEqual(c.dp_weights)) c.dp_weights.clear();
  if (!c.tp_weights.empty() && AllEqual(c.tp_weights)) {
    ParallelConfig even = c;
    even.tp_weights.clear();
    if (ValidateConfig(model, even).ok()) return even;
  }
  return c;
}

}  // namespace tenplex
