// The memory and step-time models of policy.h.
#include <algorithm>
#include <cmath>
#include <map>

#include "tenplex/policy/policy.h"
#include "tenplex/ptc/layout.h"

namespace tenplex::policy {
namespace {

constexpr int64_t kGradBytes = 4;  // FP32 main gradients

Result<int64_t> InfoInt(const Model& m, const char* key) {
  auto it = m.info.find(key);
  if (it == m.info.end()) {
    return InvalidArgument(
        "the policy needs a GPT model (`tenplex model gpt` or a preset): model '" + m.name +
        "' has no '" + key + "' in its info");
  }
  try {
    std::size_t used = 0;
    long long v = std::stoll(it->second, &used);
    if (used != it->second.size() || v <= 0) throw std::invalid_argument("");
    return static_cast<int64_t>(v);
  } catch (const std::exception&) {
    return InvalidArgument("model info '" + std::string(key) + "' is not a positive integer: '" +
                           it->second + "'");
  }
}

// Vp = ceil(V / (m t)) m t, the padded vocabulary of a tp group (spec §4).
int64_t PaddedVocab(const GptShape& g, int tp) {
  const int64_t unit = g.vocab_divisible_by * tp;
  return (g.vocab + unit - 1) / unit * unit;
}

// Ring all-reduce (or reduce-scatter + all-gather) of `bytes` over n ranks.
double RingAllReduce(double bytes, int n, double bw, double latency) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * latency;
}
double RingHalf(double bytes, int n, double bw, double latency) {
  if (n <= 1) return 0;
  return 1.0 * (n - 1) / n * bytes / bw + (n - 1) * latency;
}

bool SameHost(int64_t first_rank, int64_t last_rank, int gpus_per_host) {
  return first_rank / gpus_per_host == last_rank / gpus_per_host;
}

// Forward FLOPs per token of one transformer layer: its matmul weights twice, plus the
// attention core QK^T and AV over s positions (4·s·a·d).
double LayerForwardFlopsPerToken(const GptShape& g, int64_t s) {
  const double h = g.hidden, a = g.heads, d = g.head_dim, f = g.ffn, k = g.swiglu ? 2 : 1;
  const double weights = (a + 2.0 * g.groups) * d * h + h * a * d + k * f * h + h * f;
  return 2 * weights + 4.0 * s * a * d;
}
double AttentionCoreFlopsPerToken(const GptShape& g, int64_t s) {
  return 4.0 * s * g.heads * g.head_dim;
}

// Training FLOPs per token of one layer recomputed as `mode` (block recompute mixes kFull
// layers with kNone ones): forward, backward (2x), recomputation.
double LayerTrainFlopsPerToken(const GptShape& g, int64_t s, Recompute mode) {
  const double fwd = LayerForwardFlopsPerToken(g, s);
  double f = 3 * fwd;
  if (mode == Recompute::kFull) f += fwd;
  if (mode == Recompute::kSelective) f += AttentionCoreFlopsPerToken(g, s);
  return f;
}

// Of a stage's `layers` layers in v chunks, how many are recomputed in full.
int64_t FullyRecomputedLayers(const TrainingShape& sh, int64_t layers) {
  if (sh.recompute != Recompute::kFull) return 0;
  if (sh.recompute_layers == 0) return layers;
  const int64_t v = std::max(1, sh.virtual_stages);
  return v * std::min<int64_t>(sh.recompute_layers, layers / v);
}
// The mode of the layers that are not recomputed in full.
Recompute OtherLayers(const TrainingShape& sh) {
  return sh.recompute == Recompute::kFull ? Recompute::kNone : sh.recompute;
}

}  // namespace

bool TpCrossesHosts(int tp, int gpus_per_host) { return tp > gpus_per_host || gpus_per_host % tp; }

std::string RecomputeText(const TrainingShape& sh) {
  if (sh.recompute == Recompute::kFull && sh.recompute_layers > 0)
    return "full:" + std::to_string(sh.recompute_layers);
  return RecomputeName(sh.recompute);
}

Status ParseRecomputeText(const std::string& text, TrainingShape* shape) {
  const std::size_t colon = text.find(':');
  int layers = 0;
  if (colon != std::string::npos) {
    const std::string n = text.substr(colon + 1);
    const bool digits = !n.empty() && n.size() <= 6 && std::all_of(n.begin(), n.end(), [](char c) {
      return c >= '0' && c <= '9';
    });
    if (digits) layers = std::stoi(n);
    if (text.substr(0, colon) != "full" || layers < 1)
      return InvalidArgument("--recompute full:N needs N >= 1 layers (got '" + text + "')");
  }
  TP_ASSIGN_OR_RETURN(shape->recompute, ParseRecompute(text.substr(0, colon)));
  shape->recompute_layers = layers;
  return Status::Ok();
}

Result<Recompute> ParseRecompute(const std::string& text) {
  if (text == "selective") return Recompute::kSelective;
  if (text == "full") return Recompute::kFull;
  if (text == "none") return Recompute::kNone;
  return InvalidArgument("--recompute must be selective, full or none (got '" + text + "')");
}

const char* RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
    case Recompute::kNone:
      return "none";
  }
  return "?";
}

Result<GptShape> GptShapeOf(const Model& model) {
  GptShape g;
  TP_ASSIGN_OR_RETURN(g.layers, InfoInt(model, "num_layers"));
  TP_ASSIGN_OR_RETURN(g.hidden, InfoInt(model, "hidden_size"));
  TP_ASSIGN_OR_RETURN(g.ffn, InfoInt(model, "ffn_hidden_size"));
  TP_ASSIGN_OR_RETURN(g.heads, InfoInt(model, "num_attention_heads"));
  TP_ASSIGN_OR_RETURN(g.groups, InfoInt(model, "num_query_groups"));
  TP_ASSIGN_OR_RETURN(g.head_dim, InfoInt(model, "kv_channels"));
  TP_ASSIGN_OR_RETURN(g.vocab, InfoInt(model, "vocab_size"));
  TP_ASSIGN_OR_RETURN(g.vocab_divisible_by, InfoInt(model, "make_vocab_size_divisible_by"));
  if (g.layers != model.num_layers) {
    return InvalidArgument("model info num_layers (" + std::to_string(g.layers) +
                           ") differs from num_layers (" + std::to_string(model.num_layers) + ")");
  }
  auto sw = model.info.find("swiglu");
  g.swiglu = sw != model.info.end() && sw->second == "true";
  auto dt = model.info.find("params_dtype");
  g.activation_bytes = dt != model.info.end() && dt->second == "fp32" ? 4 : 2;
  return g;
}

Result<std::vector<RankState>> StateBytes(const Model& model, const ParallelConfig& config) {
  ParallelConfig one = config;
  one.dp = 1;
  TP_ASSIGN_OR_RETURN(Layout layout, MakeLayout(model, one));
  std::vector<RankState> out;
  for (const RankLayout& r : layout.ranks) {
    RankState st;
    st.stage = r.pp;
    st.tp = r.tp;
    for (const LocalTensor& t : *r.tensors) {
      const bool opt = t.name.rfind("optimizer.", 0) == 0;
      if (!opt) {
        st.params += t.bytes();
        st.param_elements += Volume(t.shape);
        st.param_dtype_bytes = DTypeSize(t.dtype);
      } else if (config.zero && t.name.rfind("optimizer.flat.", 0) == 0) {
        const int64_t n = Volume(t.shape), shard = (n + config.dp - 1) / config.dp;
        st.optimizer += shard * static_cast<int64_t>(DTypeSize(t.dtype));
      } else {
        st.optimizer += t.bytes();
      }
    }
    out.push_back(st);
  }
  return out;
}

int64_t StageActivationBytes(const GptShape& g, const ParallelConfig& c,
                             const std::vector<int>& bounds, int stage, const TrainingShape& sh) {
  const double s = sh.seq_length, b = sh.micro_batch, h = g.hidden, t = c.tp;
  const double sbh = s * b * h;
  const bool sp = sh.sequence_parallel;  // at t = 1 only the logits term differs (FP32 logits)
  const int64_t m =
      std::max<int64_t>(1, sh.global_batch / (static_cast<int64_t>(c.dp) * sh.micro_batch));
  const int64_t v = std::max(1, sh.virtual_stages);
  const int64_t layers = bounds[stage + 1] - bounds[stage];
  // Units in flight: micro-batches of the whole stage (1F1B), or of one model chunk
  // (interleaved: the warm-up of Megatron's schedule, 2(p - i - 1) + (v - 1)p, plus one).
  const int64_t units = v == 1
                            ? std::min<int64_t>(c.pp - stage, m)
                            : std::min<int64_t>(2 * (c.pp - stage - 1) + (v - 1) * c.pp + 1, m * v);
  const double unit_layers = static_cast<double>(layers) / v;
  const double inflight_mb = v == 1 ? units : std::min<double>(m, std::ceil(1.0 * units / v));
  // Korthikanti et al. Table 2 (f = ffn width; f = 4h gives 34/t and 10 + 24/t).
  const double selective =
      sp ? sbh * (18 + 4.0 * g.ffn / h) / t : sbh * (10 + (8 + 4.0 * g.ffn / h) / t);
  const double none = selective + 5.0 * g.heads * s * s * b / t;
  const double full_input = 2 * sbh / (sp ? t : 1);
  const double recomputed = static_cast<double>(FullyRecomputedLayers(sh, layers)) / v;
  const double other = OtherLayers(sh) == Recompute::kNone ? none : selective;
  const double per_unit = recomputed * full_input + (unit_layers - recomputed) * other;
  // the layer being recomputed in the backward holds its working set once
  const double once = recomputed > 0 ? selective : 0;
  double bytes = per_unit * static_cast<double>(units) + once;
  if (stage == 0)
    bytes += (8 * s * b + sbh) * inflight_mb / (sp ? t : 1);  // token ids, embedding dropout
  if (stage == c.pp - 1) {
    const double vp = static_cast<double>(PaddedVocab(g, c.tp));
    bytes +=
        sp ? 4 * sbh * (1 + vp / h) / t : 2 * (s * b * vp / t + sbh);  // logits and loss inputs
  }
  return static_cast<int64_t>(std::llround(bytes * g.activation_bytes / 2.0));
}

double StepFlops(const GptShape& g, const TrainingShape& sh) {
  const double tokens = static_cast<double>(sh.global_batch) * sh.seq_length;
  const int64_t full = FullyRecomputedLayers(sh, g.layers);
  return tokens *
         (static_cast<double>(full) * LayerTrainFlopsPerToken(g, sh.seq_length, Recompute::kFull) +
          static_cast<double>(g.layers - full) *
              LayerTrainFlopsPerToken(g, sh.seq_length, OtherLayers(sh)) +
          6.0 * g.hidden * g.vocab);
}

namespace {

Status CheckShape(const ParallelConfig& c, const std::vector<int>& bounds, const TrainingShape& sh,
                  const std::vector<double>& speeds) {
  if (sh.global_batch < 1 || sh.micro_batch < 1 || sh.seq_length < 1) {
    return InvalidArgument("global batch, micro-batch and sequence length must be >= 1");
  }
  if (sh.global_batch % (static_cast<int64_t>(c.dp) * sh.micro_batch) != 0) {
    return InvalidArgument("global batch " + std::to_string(sh.global_batch) +
                           " is not a multiple of dp x micro-batch (" + std::to_string(c.dp) +
                           " x " + std::to_string(sh.micro_batch) + ")");
  }
  if (!speeds.empty() && static_cast<int>(speeds.size()) < c.world_size()) {
    return InvalidArgument("--device-speeds has " + std::to_string(speeds.size()) +
                           " entries for " + std::to_string(c.world_size()) + " GPUs");
  }
  if (sh.recompute_layers < 0 || (sh.recompute_layers > 0 && sh.recompute != Recompute::kFull)) {
    return InvalidArgument(
        "a number of recomputed layers needs full recomputation (full:N, N >= 1)");
  }
  const int v = sh.virtual_stages;
  if (v < 1) return InvalidArgument("virtual pipeline stages must be >= 1");
  if (v == 1) return Status::Ok();
  const int64_t m = sh.global_batch / (static_cast<int64_t>(c.dp) * sh.micro_batch);
  if (c.pp < 2) return InvalidArgument("virtual pipeline stages need pp >= 2");
  for (int st = 0; st < c.pp; ++st) {
    const int layers = bounds[st + 1] - bounds[st];
    if (layers % v != 0 || layers != bounds[1] - bounds[0]) {
      return InvalidArgument("virtual pipeline stages (" + std::to_string(v) +
                             ") need every stage's layers to be the same multiple of them");
    }
  }
  if (m % c.pp != 0) {
    return InvalidArgument("the interleaved schedule needs the micro-batches per step (" +
                           std::to_string(m) + ") to be a multiple of pp (" + std::to_string(c.pp) +
                           ")");
  }
  return Status::Ok();
}

// Memory of the most loaded (stage, tp rank).
MemoryEstimate PeakMemory(const std::vector<RankState>& states, const std::vector<int64_t>& acts,
                          const DeviceProfile& prof) {
  MemoryEstimate peak;
  bool first = true;
  for (const RankState& st : states) {
    MemoryEstimate m;
    m.stage = st.stage;
    m.tp = st.tp;
    m.params = st.params;
    m.optimizer = st.optimizer;
    m.gradients = st.param_elements * kGradBytes;
    m.activations = acts[st.stage];
    m.reserve = prof.reserve_bytes +
                static_cast<int64_t>(prof.reserve_fraction *
                                     (m.params + m.optimizer + m.gradients + m.activations));
    if (first || m.total() > peak.total()) peak = m;
    first = false;
  }
  return peak;
}

// Per micro-batch times of the slowest pipeline stage (the pipeline runs at its pace).
struct StageTime {
  double compute = 0, tp = 0, p2p = 0;
  double total() const { return compute + tp + p2p; }
};

// Pipeline sends and receives of rank `st` per micro-batch: along the chunk order
// (chunk k on rank k mod pp), every boundary moves an activation forward and its gradient
// backward, each endpoint sending or receiving once per direction.
double P2pTime(const ParallelConfig& c, int st, int v, double msg, const DeviceProfile& prof) {
  const int K = prof.gpus_per_host;
  auto link = [&](int other) {
    const int64_t ra = c.RankOf(0, 0, st), ro = c.RankOf(0, 0, other);
    const bool same = SameHost(std::min(ra, ro), std::max(ra, ro), K);
    return 2 * (msg / (same ? prof.intra_bw : prof.inter_bw) +
                (same ? prof.intra_latency : prof.inter_latency));
  };
  double time = 0;
  for (int j = 0; j < v; ++j) {  // chunk k = j·pp + st, with neighbours k - 1 and k + 1
    const int k = j * c.pp + st;
    if (k > 0) time += link((k - 1) % c.pp);
    if (k + 1 < c.pp * v) time += link((k + 1) % c.pp);
  }
  return time;
}

StageTime SlowestStage(const GptShape& g, const ParallelConfig& c, const std::vector<int>& bounds,
                       const TrainingShape& sh, const DeviceProfile& prof,
                       const std::vector<double>& speeds) {
  const double s = sh.seq_length, b = sh.micro_batch, t = c.tp;
  const double act_msg = s * b * g.hidden * g.activation_bytes;  // one s·b·h activation tensor
  const bool tp_intra = !TpCrossesHosts(c.tp, prof.gpus_per_host);
  const double tp_bw = tp_intra ? prof.intra_bw : prof.inter_bw,
               tp_lat = tp_intra ? prof.intra_latency : prof.inter_latency;
  const double tp_one = RingAllReduce(act_msg, c.tp, tp_bw, tp_lat) * (1 - prof.tp_overlap);
  const double full_flops = LayerTrainFlopsPerToken(g, sh.seq_length, Recompute::kFull) * s * b / t;
  const double other_flops = LayerTrainFlopsPerToken(g, sh.seq_length, OtherLayers(sh)) * s * b / t;
  const double logit_flops = 6.0 * g.hidden * static_cast<double>(PaddedVocab(g, c.tp)) * s * b / t;
  const double p2p_msg = c.tp > 1 ? act_msg / t : act_msg;  // scatter-gather / sequence parallel
  StageTime worst;
  bool first = true;
  for (int st = 0; st < c.pp; ++st) {
    double speed = 1;
    if (!speeds.empty()) {
      speed = speeds[c.RankOf(0, 0, st)];
      for (int dr = 0; dr < c.dp; ++dr) {
        for (int tr = 0; tr < c.tp; ++tr) speed = std::min(speed, speeds[c.RankOf(tr, dr, st)]);
      }
    }
    const int64_t layers = bounds[st + 1] - bounds[st];
    const int64_t full = FullyRecomputedLayers(sh, layers);
    const double flops = static_cast<double>(full) * full_flops +
                         static_cast<double>(layers - full) * other_flops +
                         (st == c.pp - 1 ? logit_flops : 0);
    StageTime x;
    x.compute = flops / (prof.peak_flops * prof.efficiency * speed) +
                static_cast<double>(layers) * prof.layer_overhead;
    // 4 all-reduces per layer (2 forward, 2 backward), 2 more when recomputed in full
    x.tp = static_cast<double>(4 * layers + 2 * full) * tp_one;
    x.p2p = P2pTime(c, st, std::max(1, sh.virtual_stages), p2p_msg, prof);
    if (first || x.total() > worst.total()) worst = x;
    first = false;
  }
  return worst;
}

// Data parallel: every rank reduces its gradients over its dp group at the end of a step;
// the step waits for the slowest group.
double DpReduceTime(const ParallelConfig& c, const std::vector<RankState>& states,
                    const DeviceProfile& prof) {
  if (c.dp <= 1) return 0;
  const int K = prof.gpus_per_host;
  double dp_time = 0;
  for (const RankState& st : states) {
    const int64_t lo = c.RankOf(st.tp, 0, st.stage), hi = c.RankOf(st.tp, c.dp - 1, st.stage);
    const bool same = SameHost(lo, hi, K);
    const double bw = same ? prof.intra_bw : prof.inter_bw,
                 lat = same ? prof.intra_latency : prof.inter_latency;
    const double grads = static_cast<double>(st.param_elements) * kGradBytes;
    const double x = c.zero ? RingHalf(grads, c.dp, bw, lat) + RingHalf(st.params, c.dp, bw, lat)
                            : RingAllReduce(grads, c.dp, bw, lat);
    dp_time = std::max(dp_time, x);
  }
  return dp_time;
}

}  // namespace

Result<PreparedConfig> PrepareConfig(const Model& model, const ParallelConfig& c) {
  PreparedConfig p;
  p.config = c;
  TP_ASSIGN_OR_RETURN(p.bounds, StageBounds(model, c));
  TP_ASSIGN_OR_RETURN(p.states, StateBytes(model, c));
  return p;
}

Result<Estimate> EstimatePrepared(const GptShape& g, const PreparedConfig& p,
                                  const TrainingShape& sh, const DeviceProfile& prof,
                                  const std::vector<double>& speeds) {
  const ParallelConfig& c = p.config;
  TP_RETURN_IF_ERROR(CheckShape(c, p.bounds, sh, speeds));
  Estimate est;
  est.micro_batches = sh.global_batch / (static_cast<int64_t>(c.dp) * sh.micro_batch);
  std::vector<int64_t> acts(c.pp);
  for (int s = 0; s < c.pp; ++s) acts[s] = StageActivationBytes(g, c, p.bounds, s, sh);
  est.memory = PeakMemory(p.states, acts, prof);

  const StageTime worst = SlowestStage(g, c, p.bounds, sh, prof, speeds);
  const double m = static_cast<double>(est.micro_batches);
  est.time.compute = m * worst.compute;
  est.time.tp = m * worst.tp;
  est.time.p2p = m * worst.p2p;
  // 1F1B idles (pp - 1) micro-batch slots; the interleaved schedule 1/v of them
  est.time.bubble = (c.pp - 1) * worst.total() / std::max(1, sh.virtual_stages);
  est.time.dp_total = DpReduceTime(c, p.states, prof);
  est.time.dp = est.time.dp_total * (1 - prof.dp_overlap);
  return est;
}

Result<Estimate> EstimateConfig(const Model& model, const GptShape& g, const ParallelConfig& c,
                                const TrainingShape& sh, const DeviceProfile& prof,
                                const std::vector<double>& speeds) {
  TP_ASSIGN_OR_RETURN(PreparedConfig p, PrepareConfig(model, c));
  return EstimatePrepared(g, p, sh, prof, speeds);
}

}  // namespace tenplex::policy
