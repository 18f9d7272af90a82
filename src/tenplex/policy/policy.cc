// Candidate enumeration, ranking and output of policy.h.
#include "tenplex/policy/policy.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tenplex/store/parse.h"
#include "tenplex/util/format.h"

namespace tenplex::policy {
namespace {

using nlohmann::json;

// L layers over pp stages: L / pp each, the L % pp extra ones on the middle stages
// first (the first stage holds the embedding, the last the logits), then the first.
std::vector<int> SpreadLayers(int layers, int pp) {
  std::vector<int> out(pp, layers / pp);
  int extra = layers % pp;
  for (int s = 1; s + 1 < pp && extra > 0; ++s, --extra) ++out[s];
  for (int s = 0; extra > 0; s = (s + 1) % pp, --extra) ++out[s];
  return out;
}

// Largest-remainder apportionment of `units` over weights, each part at least 1.
std::vector<int> Apportion(int units, const std::vector<double>& w) {
  const int n = static_cast<int>(w.size());
  std::vector<int> out(n, 1);
  double total = 0;
  for (double x : w) total += x;
  const int rest = units - n;
  std::vector<std::pair<double, int>> rem;
  int given = 0;
  for (int i = 0; i < n; ++i) {
    const double q = rest * w[i] / total;
    const int f = static_cast<int>(q);
    out[i] += f;
    given += f;
    rem.push_back({-(q - f), i});
  }
  std::sort(rem.begin(), rem.end());
  for (int k = 0; k < rest - given; ++k) ++out[rem[k % n].second];
  return out;
}

bool Better(const Candidate& a, const Candidate& b) {
  if (a.fits != b.fits) return a.fits;
  const double ta = a.estimate.time.total(), tb = b.estimate.time.total();
  if (std::abs(ta - tb) > 1e-9 * std::max(ta, tb)) return ta < tb;
  if (a.estimate.memory.total() != b.estimate.memory.total()) {
    return a.estimate.memory.total() < b.estimate.memory.total();
  }
  if (a.config.tp != b.config.tp) return a.config.tp < b.config.tp;
  if (a.config.pp != b.config.pp) return a.config.pp < b.config.pp;
  return !a.config.zero && b.config.zero;
}

json TimeJson(const StepTime& t) {
  return {{"compute", t.compute}, {"tp", t.tp}, {"p2p", t.p2p},
          {"bubble", t.bubble},   {"dp", t.dp}, {"dp_total", t.dp_total}};
}

json MemoryJson(const MemoryEstimate& m) {
  return {{"total", m.total()},
          {"params", m.params},
          {"optimizer", m.optimizer},
          {"gradients", m.gradients},
          {"activations", m.activations},
          {"reserve", m.reserve},
          {"stage", m.stage},
          {"tp_rank", m.tp}};
}

}  // namespace

std::vector<ParallelConfig> EnumerateConfigs(const Model& model, const GptShape& gpt, int world,
                                             const TrainingShape& shape) {
  std::vector<ParallelConfig> out;
  const int L = static_cast<int>(gpt.layers);
  for (int tp = 1; tp <= world; ++tp) {
    if (world % tp) continue;
    for (int pp = 1; pp <= std::min(L, world / tp); ++pp) {
      if ((world / tp) % pp) continue;
      const int dp = world / (tp * pp);
      if (shape.global_batch % (static_cast<int64_t>(dp) * shape.micro_batch)) continue;
      ParallelConfig c;
      c.tp = tp;
      c.pp = pp;
      c.dp = dp;
      if (L % pp) c.layers = SpreadLayers(L, pp);
      if (!ValidateConfig(model, c).ok()) continue;
      out.push_back(c);
      if (dp > 1 && model.optimizer.type != "none") {
        c.zero = true;
        out.push_back(c);
      }
    }
  }
  return out;
}

Result<Suggestion> Suggest(const Model& model, const SuggestOptions& o) {
  if (o.gpus < 1)
    return InvalidArgument("--gpus must be >= 1 (got " + std::to_string(o.gpus) + ")");
  const TrainingShape& sh = o.shape;
  if (sh.global_batch < 1 || sh.micro_batch < 1 || sh.seq_length < 1) {
    return InvalidArgument("--global-batch, --micro-batch and --seq-length must be >= 1");
  }
  if (sh.global_batch % sh.micro_batch) {
    return InvalidArgument("--global-batch " + std::to_string(sh.global_batch) +
                           " is not a multiple of --micro-batch " + std::to_string(sh.micro_batch));
  }
  if (!o.speeds.empty()) {
    if (static_cast<int>(o.speeds.size()) != o.gpus) {
      return InvalidArgument("--device-speeds has " + std::to_string(o.speeds.size()) +
                             " entries for --gpus " + std::to_string(o.gpus));
    }
    for (double v : o.speeds) {
      if (!(v > 0)) return InvalidArgument("--device-speeds must all be > 0");
    }
  }
  TP_ASSIGN_OR_RETURN(GptShape gpt, GptShapeOf(model));
  Suggestion out;
  std::vector<ParallelConfig> configs;
  for (int w = o.gpus; w >= 1 && configs.empty(); --w) {
    configs = EnumerateConfigs(model, gpt, w, sh);
    out.world_size = w;
  }
  if (configs.empty()) {
    return NotFound("no parallel config of model '" + model.name + "' runs global batch " +
                    std::to_string(sh.global_batch) + " in micro-batches of " +
                    std::to_string(sh.micro_batch) + " on up to " + std::to_string(o.gpus) +
                    " GPUs");
  }
  out.idle_gpus = o.gpus - out.world_size;
  // Uneven devices: also try stage sizes proportional to each stage's slowest device.
  if (!o.speeds.empty()) {
    const std::size_t n = configs.size();
    for (std::size_t i = 0; i < n; ++i) {
      ParallelConfig c = configs[i];
      if (c.pp < 2) continue;
      std::vector<double> w(c.pp, 1e300);
      for (int r = 0; r < c.world_size(); ++r)
        w[c.PpRank(r)] = std::min(w[c.PpRank(r)], o.speeds[r]);
      std::vector<int> layers = Apportion(static_cast<int>(gpt.layers), w);
      TP_ASSIGN_OR_RETURN(std::vector<int> bounds, StageBounds(model, c));
      std::vector<int> current;
      for (int s = 0; s < c.pp; ++s) current.push_back(bounds[s + 1] - bounds[s]);
      if (layers == current) continue;
      c.layers = layers;
      if (ValidateConfig(model, c).ok()) configs.push_back(c);
    }
  }
  out.considered = static_cast<int>(configs.size());
  const Candidate* smallest = nullptr;
  std::vector<Candidate> all;
  for (const ParallelConfig& c : configs) {
    auto e = EstimateConfig(model, gpt, c, sh, o.profile, o.speeds);
    if (!e.ok()) continue;
    Candidate cand{c, *e, e->memory.total() <= o.profile.memory_bytes};
    all.push_back(cand);
  }
  for (const Candidate& c : all) {
    if (!smallest || c.estimate.memory.total() < smallest->estimate.memory.total()) smallest = &c;
  }
  const bool any_fit =
      std::any_of(all.begin(), all.end(), [](const Candidate& c) { return c.fits; });
  if (!any_fit && !o.include_unfit) {
    if (!smallest)
      return NotFound("no parallel config of model '" + model.name + "' could be evaluated");
    return ResourceExhausted(
        "no parallel config of model '" + model.name + "' on " + std::to_string(out.world_size) +
        " GPUs fits in " + HumanBytes(o.profile.memory_bytes) + " per GPU: the smallest, " +
        smallest->config.ToString() + ", needs " + HumanBytes(smallest->estimate.memory.total()));
  }
  for (Candidate& c : all) {
    if (c.fits || o.include_unfit) out.ranked.push_back(std::move(c));
  }
  std::sort(out.ranked.begin(), out.ranked.end(), Better);
  return out;
}

std::string SuggestionToJson(const Model& model, const SuggestOptions& o, const Suggestion& s,
                             int top) {
  const DeviceProfile& p = o.profile;
  json j;
  j["model"] = model.name;
  j["gpus"] = o.gpus;
  j["world_size"] = s.world_size;
  j["idle_gpus"] = s.idle_gpus;
  j["considered"] = s.considered;
  j["profile"] = {{"name", p.name},
                  {"peak_tflops", p.peak_flops / 1e12},
                  {"efficiency", p.efficiency},
                  {"memory", p.memory_bytes},
                  {"gpus_per_host", p.gpus_per_host},
                  {"intra_host_gbps", p.intra_bw / 1e9},
                  {"inter_host_gbps", p.inter_bw / 1e9},
                  {"dp_overlap", p.dp_overlap}};
  j["shape"] = {{"global_batch", o.shape.global_batch},
                {"micro_batch", o.shape.micro_batch},
                {"seq_length", o.shape.seq_length},
                {"recompute", RecomputeName(o.shape.recompute)},
                {"sequence_parallel", o.shape.sequence_parallel}};
  json list = json::array();
  for (int i = 0; i < static_cast<int>(s.ranked.size()) && (top <= 0 || i < top); ++i) {
    const Candidate& c = s.ranked[i];
    json e;
    e["config"] = c.config.ToString();
    e["tp"] = c.config.tp;
    e["pp"] = c.config.pp;
    e["dp"] = c.config.dp;
    e["zero"] = c.config.zero ? 1 : 0;
    e["layers"] = c.config.layers;
    e["micro_batches"] = c.estimate.micro_batches;
    e["step_seconds"] = c.estimate.time.total();
    e["time"] = TimeJson(c.estimate.time);
    e["memory"] = MemoryJson(c.estimate.memory);
    e["fits"] = c.fits;
    list.push_back(std::move(e));
  }
  j["configs"] = std::move(list);
  return j.dump() + "\n";
}

std::string SuggestionToText(const Model& model, const SuggestOptions& o, const Suggestion& s,
                             int top) {
  std::string out;
  char line[512];
  std::snprintf(
      line, sizeof line,
      "%s on %d GPUs (%d per host, %s: %.0f TFLOP/s x %.2f, %s each); batch %lld x seq %lld, "
      "micro-batch "
      "%lld, recompute %s%s\n",
      model.name.c_str(), o.gpus, o.profile.gpus_per_host, o.profile.name.c_str(),
      o.profile.peak_flops / 1e12, o.profile.efficiency, HumanBytes(o.profile.memory_bytes).c_str(),
      static_cast<long long>(o.shape.global_batch), static_cast<long long>(o.shape.seq_length),
      static_cast<long long>(o.shape.micro_batch), RecomputeName(o.shape.recompute),
      o.shape.sequence_parallel ? ", sequence parallel" : "");
  out += line;
  if (s.idle_gpus) out += "  no config uses all GPUs: " + std::to_string(s.idle_gpus) + " idle\n";
  std::snprintf(line, sizeof line, "  %-4s %-28s %9s %9s %8s %8s %8s %8s %11s %11s %4s\n", "#",
                "config", "step s", "compute", "tp", "p2p", "bubble", "dp", "memory", "activations",
                "fits");
  out += line;
  for (int i = 0; i < static_cast<int>(s.ranked.size()) && (top <= 0 || i < top); ++i) {
    const Candidate& c = s.ranked[i];
    const StepTime& t = c.estimate.time;
    std::snprintf(line, sizeof line,
                  "  %-4d %-28s %9.3f %9.3f %8.3f %8.3f %8.3f %8.3f %11s %11s %4s\n", i + 1,
                  c.config.ToString().c_str(), t.total(), t.compute, t.tp, t.p2p, t.bubble, t.dp,
                  HumanBytes(c.estimate.memory.total()).c_str(),
                  HumanBytes(c.estimate.memory.activations).c_str(), c.fits ? "yes" : "no");
    out += line;
  }
  out += "  (" + std::to_string(s.considered) + " valid configs considered, " +
         std::to_string(s.ranked.size()) + " listed)\n";
  return out;
}

Result<ParallelConfig> ChooseForWorkers(const Model& model, const std::vector<std::string>& command,
                                        int gpus, const std::string& profile,
                                        const std::string& gpu_memory) {
  SuggestOptions o;
  o.gpus = gpus;
  o.shape.global_batch = 8;
  o.shape.micro_batch = 2;
  o.shape.seq_length = 64;
  for (std::size_t i = 0; i + 1 < command.size(); ++i) {
    int64_t* field = command[i] == "--global-batch-size"  ? &o.shape.global_batch
                     : command[i] == "--micro-batch-size" ? &o.shape.micro_batch
                     : command[i] == "--seq-length"       ? &o.shape.seq_length
                                                          : nullptr;
    if (!field) continue;
    try {
      std::size_t used = 0;
      *field = std::stoll(command[i + 1], &used);
      if (used != command[i + 1].size()) throw std::invalid_argument("");
    } catch (const std::exception&) {
      return InvalidArgument("worker argument " + command[i] + " " + command[i + 1] +
                             " is not an integer");
    }
  }
  TP_ASSIGN_OR_RETURN(o.profile, LoadDeviceProfile(profile.empty() ? "cpu" : profile));
  if (!gpu_memory.empty()) {
    auto b = store::ParseByteSize(gpu_memory);
    if (!b.ok()) return b.status().WithContext("gpu_memory");
    o.profile.memory_bytes = static_cast<int64_t>(*b);
  }
  TP_ASSIGN_OR_RETURN(Suggestion s, Suggest(model, o));
  return s.ranked.front().config;
}

}  // namespace tenplex::policy
