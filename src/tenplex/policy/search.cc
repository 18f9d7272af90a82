// Candidate enumeration, the search over the training knobs, and the ranking of
// policy.h. Per (tp, pp, dp, zero, layers) config the knob settings are the product of
// the micro-batch sizes, recompute modes, sequence parallelism and model chunks that
// Megatron accepts for it; full recomputation is also tried on the fewest layers per
// chunk that fit (block recompute: memory falls and time rises with every layer
// recomputed, so the fewest that fit are the fastest setting of that kind). Memory
// grows with the micro-batch in every term, so micro-batches are tried from 1 up and
// the search stops at the first size where no setting fits. Each config is reported
// with its best setting.
#include <algorithm>
#include <cmath>
#include <optional>

#include "tenplex/policy/policy.h"
#include "tenplex/util/format.h"

namespace tenplex::policy {
namespace {

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

int RecomputeRank(const TrainingShape& s) {
  switch (s.recompute) {
    case Recompute::kNone:
      return 0;
    case Recompute::kSelective:
      return 1;
    case Recompute::kFull:
      return s.recompute_layers > 0 ? 2 : 3;
  }
  return 4;
}

std::vector<int64_t> Divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

// The smallest block-recompute layer count per chunk that fits, if any (memory falls as
// it grows); `uniform` is the candidate with every layer recomputed.
void AddBlockRecompute(const GptShape& gpt, const PreparedConfig& p, const Candidate& uniform,
                       const SuggestOptions& o, std::vector<Candidate>* out, int64_t* evaluated) {
  int chunk = 0;
  for (int s = 0; s < p.config.pp; ++s) chunk = std::max(chunk, p.bounds[s + 1] - p.bounds[s]);
  chunk /= std::max(1, uniform.shape.virtual_stages);
  int lo = 1, hi = chunk - 1;  // chunk layers would be the uniform setting again
  std::optional<Candidate> found;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    Candidate c = uniform;
    c.shape.recompute_layers = mid;
    auto e = EstimatePrepared(gpt, p, c.shape, o.profile, o.speeds);
    ++*evaluated;
    if (e.ok() && e->memory.total() <= o.profile.memory_bytes) {
      c.estimate = *e;
      found = c;
      hi = mid - 1;
    } else {
      lo = mid + 1;
    }
  }
  if (found) out->push_back(*found);
}

}  // namespace

SearchSpace FixedKnobs() {
  SearchSpace s;
  s.micro_batch = s.recompute = s.sequence_parallel = s.virtual_stages = false;
  return s;
}

bool BetterCandidate(const Candidate& a, const Candidate& b) {
  if (a.fits != b.fits) return a.fits;
  const double ta = a.estimate.time.total(), tb = b.estimate.time.total();
  if (std::abs(ta - tb) > 1e-9 * std::max(ta, tb)) return ta < tb;
  if (a.estimate.memory.total() != b.estimate.memory.total()) {
    return a.estimate.memory.total() < b.estimate.memory.total();
  }
  if (a.config.tp != b.config.tp) return a.config.tp < b.config.tp;
  if (a.config.pp != b.config.pp) return a.config.pp < b.config.pp;
  if (a.config.zero != b.config.zero) return !a.config.zero;
  if (a.shape.micro_batch != b.shape.micro_batch) return a.shape.micro_batch > b.shape.micro_batch;
  if (a.shape.virtual_stages != b.shape.virtual_stages)
    return a.shape.virtual_stages < b.shape.virtual_stages;
  if (a.shape.sequence_parallel != b.shape.sequence_parallel) return a.shape.sequence_parallel;
  return RecomputeRank(a.shape) < RecomputeRank(b.shape);
}

std::vector<TrainingShape> KnobSettings(const GptShape& gpt, const PreparedConfig& p,
                                        const TrainingShape& base, const SearchSpace& search) {
  const ParallelConfig& c = p.config;
  std::vector<int64_t> micro{base.micro_batch};
  if (search.micro_batch) micro = Divisors(base.global_batch / c.dp);
  std::vector<Recompute> recompute{base.recompute};
  if (search.recompute) recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  std::vector<bool> sp{base.sequence_parallel};
  if (search.sequence_parallel)
    sp = c.tp > 1 ? std::vector<bool>{true, false} : std::vector<bool>{false};
  std::vector<int> chunks{base.virtual_stages};
  if (search.virtual_stages) {
    chunks = {1};
    const int layers = static_cast<int>(gpt.layers) / c.pp;
    if (c.pp >= 2 && c.layers.empty() && gpt.layers % c.pp == 0) {
      for (int v = 2; v <= layers; ++v) {
        if (layers % v == 0) chunks.push_back(v);
      }
    }
  }
  std::vector<TrainingShape> out;
  for (int64_t b : micro) {
    for (Recompute r : recompute) {
      for (bool s : sp) {
        for (int v : chunks) {
          TrainingShape sh = base;
          sh.micro_batch = b;
          sh.recompute = r;
          if (search.recompute) sh.recompute_layers = 0;
          sh.sequence_parallel = s;
          sh.virtual_stages = v;
          out.push_back(sh);
        }
      }
    }
  }
  return out;
}

std::vector<ParallelConfig> EnumerateConfigs(const Model& model, const GptShape& gpt, int world,
                                             const TrainingShape& shape, bool zero) {
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
      if (zero && dp > 1 && model.optimizer.type != "none") {
        c.zero = true;
        out.push_back(c);
      }
    }
  }
  return out;
}

namespace {

Status CheckOptions(const SuggestOptions& o) {
  if (o.gpus < 1)
    return InvalidArgument("--gpus must be >= 1 (got " + std::to_string(o.gpus) + ")");
  const TrainingShape& sh = o.shape;
  if (sh.global_batch < 1 || sh.micro_batch < 1 || sh.seq_length < 1) {
    return InvalidArgument("--global-batch, --micro-batch and --seq-length must be >= 1");
  }
  if (!o.search.micro_batch && sh.global_batch % sh.micro_batch) {
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
  return Status::Ok();
}

// Uneven devices: also try stage sizes proportional to each stage's slowest device.
Status AddProportionalStages(const Model& model, const GptShape& gpt,
                             const std::vector<double>& speeds,
                             std::vector<ParallelConfig>* configs) {
  const std::size_t n = configs->size();
  for (std::size_t i = 0; i < n; ++i) {
    ParallelConfig c = (*configs)[i];
    if (c.pp < 2) continue;
    std::vector<double> w(c.pp, 1e300);
    for (int r = 0; r < c.world_size(); ++r) w[c.PpRank(r)] = std::min(w[c.PpRank(r)], speeds[r]);
    std::vector<int> layers = Apportion(static_cast<int>(gpt.layers), w);
    TP_ASSIGN_OR_RETURN(std::vector<int> bounds, StageBounds(model, c));
    std::vector<int> current;
    for (int s = 0; s < c.pp; ++s) current.push_back(bounds[s + 1] - bounds[s]);
    if (layers == current) continue;
    c.layers = layers;
    if (ValidateConfig(model, c).ok()) configs->push_back(c);
  }
  return Status::Ok();
}

// Every knob setting of one config; the best candidate, and the least memory seen.
struct ConfigResult {
  std::optional<Candidate> best;
  std::optional<Candidate> smallest;
};
ConfigResult SearchConfig(const GptShape& gpt, const PreparedConfig& p, const SuggestOptions& o,
                          int64_t* evaluated) {
  ConfigResult r;
  std::vector<Candidate> found;
  const bool crosses = TpCrossesHosts(p.config.tp, o.profile.gpus_per_host);
  int64_t micro = 0;       // the micro-batch of the settings being tried
  bool micro_fit = false;  // whether one of them fits
  for (const TrainingShape& sh : KnobSettings(gpt, p, o.shape, o.search)) {
    if (sh.micro_batch != micro) {
      if (micro != 0 && !micro_fit) break;  // a larger micro-batch needs more memory
      micro = sh.micro_batch;
      micro_fit = false;
    }
    auto e = EstimatePrepared(gpt, p, sh, o.profile, o.speeds);
    ++*evaluated;
    if (!e.ok()) continue;
    Candidate c{p.config, sh, *e, e->memory.total() <= o.profile.memory_bytes, crosses};
    micro_fit |= c.fits;
    if (!r.smallest || c.estimate.memory.total() < r.smallest->estimate.memory.total())
      r.smallest = c;
    found.push_back(c);
    if (o.search.recompute && c.fits && sh.recompute == Recompute::kFull)
      AddBlockRecompute(gpt, p, c, o, &found, evaluated);
  }
  for (const Candidate& c : found) {
    if (!r.best || BetterCandidate(c, *r.best)) r.best = c;
  }
  return r;
}

}  // namespace

Result<Suggestion> Suggest(const Model& model, const SuggestOptions& o) {
  TP_RETURN_IF_ERROR(CheckOptions(o));
  const TrainingShape& sh = o.shape;
  TP_ASSIGN_OR_RETURN(GptShape gpt, GptShapeOf(model));
  Suggestion out;
  TrainingShape enum_shape = sh;
  if (o.search.micro_batch) enum_shape.micro_batch = 1;
  std::vector<ParallelConfig> configs;
  for (int w = o.gpus; w >= 1 && configs.empty(); --w) {
    configs = EnumerateConfigs(model, gpt, w, enum_shape, o.search.distributed_optimizer);
    out.world_size = w;
  }
  if (configs.empty()) {
    return NotFound("no parallel config of model '" + model.name + "' runs global batch " +
                    std::to_string(sh.global_batch) + " in micro-batches of " +
                    std::to_string(enum_shape.micro_batch) + " on up to " + std::to_string(o.gpus) +
                    " GPUs");
  }
  out.idle_gpus = o.gpus - out.world_size;
  if (!o.speeds.empty()) TP_RETURN_IF_ERROR(AddProportionalStages(model, gpt, o.speeds, &configs));
  out.considered = static_cast<int>(configs.size());
  std::optional<Candidate> smallest;
  std::vector<Candidate> all;
  for (const ParallelConfig& c : configs) {
    auto p = PrepareConfig(model, c);
    if (!p.ok()) continue;
    ConfigResult r = SearchConfig(gpt, *p, o, &out.evaluated);
    if (!r.best) continue;
    if (!smallest || r.smallest->estimate.memory.total() < smallest->estimate.memory.total())
      smallest = r.smallest;
    out.fitting += r.best->fits ? 1 : 0;
    all.push_back(std::move(*r.best));
  }
  if (out.fitting == 0 && !o.include_unfit) {
    if (!smallest)
      return NotFound("no parallel config of model '" + model.name + "' could be evaluated");
    return ResourceExhausted("no parallel config of model '" + model.name + "' on " +
                             std::to_string(out.world_size) + " GPUs fits in " +
                             HumanBytes(o.profile.memory_bytes) + " per GPU: the smallest, " +
                             smallest->config.ToString() + " (micro-batch " +
                             std::to_string(smallest->shape.micro_batch) + ", recompute " +
                             RecomputeText(smallest->shape) + "), needs " +
                             HumanBytes(smallest->estimate.memory.total()));
  }
  for (Candidate& c : all) {
    if (c.fits || o.include_unfit) out.ranked.push_back(std::move(c));
  }
  std::sort(out.ranked.begin(), out.ranked.end(), BetterCandidate);
  return out;
}

}  // namespace tenplex::policy
