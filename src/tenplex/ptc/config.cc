#include "tenplex/ptc/config.h"

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

}  // namespace

std::string ParallelConfig::ToString() const {
  std::string s =
      "tp=" + std::to_string(tp) + ",pp=" + std::to_string(pp) + ",dp=" + std::to_string(dp);
  if (zero) s += ",zero=1";
  if (!layers.empty()) {
    s += ",layers=";
    for (std::size_t i = 0; i < layers.size(); ++i) s += (i ? "+" : "") + std::to_string(layers[i]);
  }
  return s;
}

Result<ParallelConfig> ParseConfig(std::string_view text) {
  ParallelConfig c;
  if (text.empty()) return InvalidArgument("config: empty (expected e.g. tp=2,pp=2,dp=2)");
  std::set<std::string> seen;
  for (std::string_view part : SplitString(text, ',')) {
    std::size_t eq = part.find('=');
    if (eq == std::string_view::npos) {
      return InvalidArgument("config: '" + std::string(part) +
                             "' is not key=value (keys: tp, pp, dp, zero, layers)");
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
    } else {
      return InvalidArgument("config: unknown key '" + key + "' (keys: tp, pp, dp, zero, layers)");
    }
  }
  if (static_cast<int64_t>(c.tp) * c.pp * c.dp > (1 << 24)) {
    return InvalidArgument("config: world size tp*pp*dp is too large");
  }
  if (!c.layers.empty() && static_cast<int>(c.layers.size()) != c.pp) {
    return InvalidArgument("config: layers= lists " + std::to_string(c.layers.size()) +
                           " stages but pp=" + std::to_string(c.pp));
  }
  return c;
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

Status ValidateConfig(const Model& model, const ParallelConfig& c) {
  TP_RETURN_IF_ERROR(StageBounds(model, c).status());
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

}  // namespace tenplex
