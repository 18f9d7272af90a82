// Choosing the parallel configuration for a set of GPUs: a memory model, a step-time
// model and a ranking (`tenplex config suggest`, `"gpus": N` schedule entries).
//
// Candidates. For N GPUs, every (tp, pp, dp) with tp·pp·dp = N that the model accepts
// (ValidateConfig: g % tp, f % tp, ...), dp dividing the global batch B in whole
// micro-batches (B % (dp·b) == 0), pp ≤ L (layers= spreads L % pp extra layers over the
// middle stages when pp does not divide L), and zero ∈ {0, 1} when dp > 1. When no
// config uses all N GPUs (e.g. 7 GPUs and B = 128), the largest world size below N
// that has one is used and the rest idle ("idle_gpus").
//
// Knobs (search.cc). Per config Suggest also searches what Megatron-LM users tune with
// it: the micro-batch b (every divisor of B/dp), recomputation (none, selective, full,
// and full on the first n layers of each chunk, the fewest that fit: Megatron's
// --recompute-method block), sequence parallelism (on/off when tp > 1) and model chunks
// v (the interleaved 1F1B schedule: v divides every stage's layers, pp ≥ 2 and m a
// multiple of pp, as Megatron requires). Each config is reported with its fastest
// setting that fits, and MegatronArgs names it. A knob the caller fixes is not searched.
//
// Memory per GPU (bytes, the most loaded rank):
//   state        the rank's local tensors from our own layout (MakeLayout): parameters
//                plus optimizer state, exact, padding and zero=1 flat shards included;
//   gradients    one main gradient per local parameter element, 4 bytes (FP32 main
//                grads, Megatron's default with bf16/fp16 parameters and Adam);
//   activations  for one micro-batch of s tokens and b samples, per transformer layer
//                (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
//                Transformer Models", Table 2, with f the FFN width, a heads, t = tp):
//                  selective recompute + sequence parallel   s·b·h·(18 + 4f/h) / t
//                  selective recompute, no sequence parallel s·b·h·(10 + (8 + 4f/h)/t)
//                  no recompute                               the line above + 5·a·s²·b/t
//                  full recompute                             2·s·b·h (/t with SP), plus one
//                                                             layer's selective activations
//                  full on n layers per chunk (block)         n layers as full, the others as
//                                                             no recompute
//                (f = 4h gives the paper's 34/t and 10 + 24/t). Stage i of the 1F1B
//                schedule holds min(pp - i, m) micro-batches in flight (m = B / (dp·b)),
//                so stage i needs layers_i · min(pp - i, m) layer activations; stage 0
//                adds the embedding's input ids and dropout mask (8·s·b + s·b·h per
//                micro-batch in flight) and the last stage the logits and loss inputs
//                (4·s·b·h·(1 + V/h)/t with SP, 2·(s·b·V/t + s·b·h) without). These are
//                the formulas of Megatron-LM's megatron/training/theoretical_memory_usage.py
//                (which reports the first stage), applied per stage. With v chunks stage i
//                holds min(2(pp-i-1) + (v-1)pp + 1, m·v) chunk micro-batches of layers_i/v
//                layers (Megatron's interleaved warm-up plus one; stage 0 thus holds
//                Korthikanti's L·(1 + (pp-1)/(pp·v)) layers). Activations are in 16-bit
//                precision; an FP32 model doubles them.
//   reserve      profile.reserve_bytes (CUDA context, NCCL buffers, workspace: 2 GiB on
//                GPUs) + profile.reserve_fraction (5 %, the overhead factor of the same
//                Megatron file, for allocator fragmentation) of the rest.
// A config fits when the most loaded rank's total ≤ the device memory.
//
// Step time (seconds), per training step of B samples:
//   compute   the stage's FLOPs per micro-batch over (peak FLOP/s · efficiency · speed):
//             per token and layer, forward 2·W_layer + 4·s·a·d (W_layer the layer's matmul
//             weights, d the head size), backward twice that, recomputation adds a
//             forward (full) or the attention core again (selective); the last stage adds
//             the logits, 6·h·V per token (never recomputed). This is Narayanan et al.
//             (SC'21) Eq. 3 for a GPT with f = 4h: 96·B·s·l·h²(1 + s/6h + V/16lh) with
//             full recompute. The efficiency is calibrated (docs/policy.md) and speed is
//             the slowest device of the stage (--device-speeds, 1 by default); plus
//             profile.layer_overhead per layer and micro-batch (kernel launches).
//   TP        per layer and micro-batch, 4 all-reduces of s·b·h 16-bit values in the
//             tp group (2 forward, 2 backward; 6 with full recompute; all-gather plus
//             reduce-scatter with sequence parallelism moves the same bytes), each a ring:
//             2·(t-1)/t · bytes / bw + 2·(t-1) · latency, on the intra-host link when
//             the group's ranks share a host (tp ranks are consecutive, rank r on host
//             r / K) and on the inter-host link otherwise; profile.tp_overlap of it hides
//             behind the GEMMs (Transformer Engine's userbuffers overlap; 0 on a100).
//   PP        the 1F1B pipeline: (m + (pp - 1)/v) · max_i(stage i's time per micro-batch),
//             i.e. the bubble (pp-1)/(v·m) of Narayanan et al. §2.2 (v = 1: plain 1F1B);
//             each stage time includes sending and receiving s·b·h 16-bit activations
//             (forward) and gradients (backward) at each of its chunk boundaries (/t with
//             tp > 1: scatter-gather), so v chunks send about v times as often.
//   DP        the gradient all-reduce of the rank's gradients over dp ranks (a ring,
//             as above, on the intra-host link when the dp group shares a host); with
//             zero=1 a reduce-scatter of the gradients plus an all-gather of the
//             parameters instead (the same bytes on the wire for equal dtypes).
//             profile.dp_overlap of it hides behind the backward pass.
//   step      = PP + DP exposed (compute and TP are inside the stage times);
//             the parts are reported separately: compute, tp, p2p, bubble, dp.
// Ranking: predicted step time, ties broken by lower memory, then smaller tp, pp, no zero.
//
// Device profiles (bandwidths per GPU and direction, NCCL bus bandwidth as nccl-tests
// report it; sources in docs/policy.md): presets "a100" (A100-SXM4-80GB, DGX A100:
// 312 TFLOP/s BF16 dense, NVLink 3 and 8 HDR 200 Gb/s InfiniBand NICs), "h100"
// (H100-SXM5-80GB, DGX H100: 989 TFLOP/s, NVLink 4, NDR 400 Gb/s) and "cpu" (the
// CPU example: small numbers, a fake memory), or a JSON file with the same fields.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tenplex/model/model.h"
#include "tenplex/ptc/config.h"
#include "tenplex/util/status.h"

namespace tenplex::policy {

struct DeviceProfile {
  std::string name = "a100";
  double peak_flops = 312e12;  // dense 16-bit FLOP/s per GPU
  double efficiency = 0.59;    // calibrated on Narayanan et al. Table 1 (docs/policy.md)
  int64_t memory_bytes = 80LL << 30;
  int gpus_per_host = 8;
  double intra_bw = 230e9;      // bytes/s, bus bandwidth within a host
  double intra_latency = 5e-6;  // seconds per ring step
  double inter_bw = 22e9;       // bytes/s per GPU across hosts
  double inter_latency = 10e-6;
  int64_t reserve_bytes = 2LL << 30;
  double reserve_fraction = 0.05;
  double dp_overlap = 0.5;    // fraction of the DP all-reduce hidden by the backward
  double tp_overlap = 0.0;    // fraction of the TP collectives hidden behind the GEMMs
  double layer_overhead = 0;  // seconds per layer and micro-batch (launches, framework)
};

// The names of the presets, and a preset or a JSON file ({"name", "peak_tflops",
// "efficiency", "memory": "80GiB", "gpus_per_host", "intra_host_gbps", "intra_host_latency_us",
// "inter_host_gbps", "inter_host_latency_us", "reserve": "2GiB", "reserve_fraction",
// "dp_overlap", "tp_overlap", "layer_overhead_us"}; fields absent keep the "base" preset's values,
// default "a100").
std::vector<std::string> ProfilePresetNames();
Result<DeviceProfile> LoadDeviceProfile(const std::string& spec);
Result<DeviceProfile> DeviceProfileFromJson(const std::string& text);

enum class Recompute { kSelective, kFull, kNone };
// "selective", "full", "none".
Result<Recompute> ParseRecompute(const std::string& text);
const char* RecomputeName(Recompute r);

// What a step trains and how.
struct TrainingShape {
  int64_t global_batch = 512;  // B samples per step
  int64_t micro_batch = 1;     // b
  int64_t seq_length = 2048;   // s
  Recompute recompute = Recompute::kSelective;
  // With kFull: 0 recomputes every layer (Megatron's --recompute-method uniform
  // --recompute-num-layers 1); n > 0 only the first n layers of each model chunk, the
  // others keep all their activations (--recompute-method block --recompute-num-layers n).
  int recompute_layers = 0;
  bool sequence_parallel = true;
  // Model chunks per pipeline rank: 1 is plain 1F1B, v > 1 the interleaved schedule
  // (Megatron's --num-layers-per-virtual-pipeline-stage = layers per stage / v).
  int virtual_stages = 1;
};
// "selective", "full", "full:N" (block, N layers), "none"; and the reverse, which sets
// shape->recompute and shape->recompute_layers.
std::string RecomputeText(const TrainingShape& shape);
Status ParseRecomputeText(const std::string& text, TrainingShape* shape);

// The GPT hyper-parameters the formulas need, from the model's info (gpt.h).
struct GptShape {
  int64_t layers = 0, hidden = 0, ffn = 0, heads = 0, groups = 0, head_dim = 0, vocab = 0;
  int64_t vocab_divisible_by = 128;
  bool swiglu = false;
  int activation_bytes = 2;  // 2 for bf16/fp16 models, 4 for fp32
};
// Fails (InvalidArgument) for a model without GPT info.
Result<GptShape> GptShapeOf(const Model& model);

// Exact state bytes of one rank of every (stage, tp rank), from our layouts: the
// layout of the config at dp=1 (a rank's tensors do not depend on dp without zero=1);
// with zero=1 each flat optimizer tensor of length n at dp=1 becomes a shard of
// ceil(n/dp) elements (spec §5: padded to a multiple of dp, split evenly).
struct RankState {
  int stage = 0, tp = 0;
  int64_t params = 0;          // bytes of the local parameters (padding included)
  int64_t optimizer = 0;       // bytes of the optimizer state
  int64_t param_elements = 0;  // elements of the local parameters (gradients)
  int64_t param_dtype_bytes = 4;
};
Result<std::vector<RankState>> StateBytes(const Model& model, const ParallelConfig& config);

struct MemoryEstimate {
  int stage = 0, tp = 0;  // the most loaded rank's stage and tp rank
  int64_t params = 0, optimizer = 0, gradients = 0, activations = 0, reserve = 0;
  int64_t total() const { return params + optimizer + gradients + activations + reserve; }
};

// Activation bytes of pipeline stage `stage` (layers, micro-batches in flight, ends).
int64_t StageActivationBytes(const GptShape& gpt, const ParallelConfig& config,
                             const std::vector<int>& bounds, int stage, const TrainingShape& shape);

struct StepTime {
  double compute = 0;   // compute of the slowest stage over all m micro-batches
  double tp = 0;        // tensor-parallel all-reduces on the critical path
  double p2p = 0;       // pipeline sends and receives on the critical path
  double bubble = 0;    // (pp-1) idle micro-batch slots
  double dp = 0;        // exposed data-parallel gradient reduction
  double dp_total = 0;  // the whole DP reduction, before overlap
  double total() const { return compute + tp + p2p + bubble + dp; }
};

// FLOPs of one training step (all ranks), recomputation included.
double StepFlops(const GptShape& gpt, const TrainingShape& shape);

struct Estimate {
  MemoryEstimate memory;
  StepTime time;
  int64_t micro_batches = 0;  // m per dp rank
};
// Memory of the most loaded rank and predicted step time of `config`; speeds[r] is
// GPU r's relative speed (empty: all 1). Fails when the config is invalid for the
// model or the shape (InvalidArgument naming the rule).
Result<Estimate> EstimateConfig(const Model& model, const GptShape& gpt,
                                const ParallelConfig& config, const TrainingShape& shape,
                                const DeviceProfile& profile, const std::vector<double>& speeds);

// What EstimateConfig derives from (model, config) alone, so that a search over the
// training knobs computes it once per config.
struct PreparedConfig {
  ParallelConfig config;
  std::vector<int> bounds;  // layer bounds of the stages (StageBounds)
  std::vector<RankState> states;
};
Result<PreparedConfig> PrepareConfig(const Model& model, const ParallelConfig& config);
Result<Estimate> EstimatePrepared(const GptShape& gpt, const PreparedConfig& prepared,
                                  const TrainingShape& shape, const DeviceProfile& profile,
                                  const std::vector<double>& speeds);

// Whether a tp group of `tp` consecutive ranks spans hosts of gpus_per_host GPUs.
bool TpCrossesHosts(int tp, int gpus_per_host);

struct Candidate {
  ParallelConfig config;
  TrainingShape shape;  // the knobs chosen for it (micro-batch, recompute, SP, chunks)
  Estimate estimate;
  bool fits = false;
  bool tp_crosses_hosts = false;  // the tp group spans hosts (priced on the inter-host link)
};

// Which training knobs Suggest searches per (tp, pp, dp, zero); a knob not searched
// keeps SuggestOptions::shape's value. The CLI searches a knob unless it is given.
struct SearchSpace {
  bool micro_batch = true;            // every b dividing B / dp (up to the first b nothing fits)
  bool recompute = true;              // none, selective, full, full on the fewest layers that fit
  bool sequence_parallel = true;      // on and off when tp > 1 (off at tp = 1, as Megatron)
  bool virtual_stages = true;         // v = 1 and every v > 1 Megatron accepts
  bool distributed_optimizer = true;  // zero=1 besides zero=0 when dp > 1
};
// Nothing searched: the shape as given, zero=1 still tried (the policy before knobs).
SearchSpace FixedKnobs();

struct SuggestOptions {
  int gpus = 1;
  TrainingShape shape;
  SearchSpace search;
  DeviceProfile profile;
  std::vector<double> speeds;  // per GPU; empty = uniform
  bool include_unfit = false;  // also return configs that do not fit (ranked after)
};

struct Suggestion {
  int world_size = 0;  // GPUs the configs use (< gpus when no config uses all)
  int idle_gpus = 0;
  int considered = 0;             // (tp, pp, dp, zero, layers) configs, before memory
  int64_t evaluated = 0;          // configs x knob settings whose cost was computed
  int fitting = 0;                // configs with at least one setting that fits
  std::vector<Candidate> ranked;  // per config its best setting; fitting first, fastest first
};

// Ranks the configs for opts.gpus GPUs. Fails (InvalidArgument) on bad options and
// (NotFound) when no valid config exists for any world size up to gpus, or
// (ResourceExhausted) when none fits in memory (the message names the smallest need).
Result<Suggestion> Suggest(const Model& model, const SuggestOptions& opts);
// Candidate configs for exactly `world` GPUs (the enumeration above), unevaluated.
std::vector<ParallelConfig> EnumerateConfigs(const Model& model, const GptShape& gpt, int world,
                                             const TrainingShape& shape, bool zero = true);
// The knob settings searched for one config (before the block-recompute search).
std::vector<TrainingShape> KnobSettings(const GptShape& gpt, const PreparedConfig& prepared,
                                        const TrainingShape& base, const SearchSpace& search);
// Orders candidates: fitting first, then predicted step time, lower memory, smaller tp,
// pp, no zero, larger micro-batch, fewer chunks, less recomputation.
bool BetterCandidate(const Candidate& a, const Candidate& b);

// Megatron-LM's arguments for a candidate: --tensor-model-parallel-size,
// --pipeline-model-parallel-size, --global-batch-size, --micro-batch-size, --seq-length,
// the recompute flags, --sequence-parallel, --num-layers-per-virtual-pipeline-stage,
// --use-distributed-optimizer, for a model of num_layers layers. Uneven stages
// (layers=) have no Megatron argument that places extra layers in the middle stages.
std::vector<std::string> MegatronArgs(const Candidate& c, int64_t num_layers);

// JSON of a suggestion: {"model", "gpus", "world_size", "idle_gpus", "profile", "shape",
// "search", "configs": [{"config", "tp", "pp", "dp", "zero", "layers", "micro_batch",
// "recompute", "sequence_parallel", "virtual_stages", "megatron_args", "tp_crosses_hosts",
// "step_seconds", "time": {...}, "memory": {...}, "fits"}]} with at most `top` configs.
std::string SuggestionToJson(const Model& model, const SuggestOptions& opts, const Suggestion& s,
                             int top);
// A table a person reads.
std::string SuggestionToText(const Model& model, const SuggestOptions& opts, const Suggestion& s,
                             int top);

// For `tenplex run` schedules with "gpus": N: the best config for N GPUs and the worker
// arguments of its knobs. The training shape is read from the worker command's
// Megatron-style arguments (--global-batch-size, --micro-batch-size, --seq-length;
// examples/gpt/train.py's defaults 8, 2 and 64 when absent); the micro-batch is searched
// when the command does not give one, and recomputation always (the example implements
// Megatron's recompute flags; not sequence parallelism or virtual stages, which stay
// off). The device profile is `profile` ("cpu" when empty) and, when not empty,
// `gpu_memory` (e.g. "1MiB") replaces the profile's memory.
struct WorkerChoice {
  ParallelConfig config;
  std::vector<std::string> args;  // appended to the worker command (later ones win)
};
Result<WorkerChoice> ChooseForWorkers(const Model& model, const std::vector<std::string>& command,
                                      int gpus, const std::string& profile,
                                      const std::string& gpu_memory);

}  // namespace tenplex::policy
