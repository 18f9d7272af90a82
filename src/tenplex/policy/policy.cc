// Output of policy.h: JSON, the table, Megatron-LM's arguments, the `tenplex run` chooser.
#include "tenplex/policy/policy.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tenplex/store/parse.h"
#include "tenplex/util/format.h"

namespace tenplex::policy {
namespace {

using nlohmann::json;

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

// Every config that fits runs its tp group across hosts.
bool FitsOnlyAcrossHosts(const Suggestion& s) {
  bool any = false;
  for (const Candidate& c : s.ranked) {
    if (!c.fits) continue;
    if (!c.tp_crosses_hosts) return false;
    any = true;
  }
  return any;
}

std::string ParamsDtype(const Model& m) {
  auto it = m.info.find("params_dtype");
  return it != m.info.end() ? it->second : "fp32";
}

// Megatron-LM's recomputation flags for a shape (none without recomputation).
std::vector<std::string> RecomputeArgs(const TrainingShape& sh) {
  if (sh.recompute == Recompute::kSelective) return {"--recompute-granularity", "selective"};
  if (sh.recompute != Recompute::kFull) return {};
  return {"--recompute-granularity", "full",
          "--recompute-method",      sh.recompute_layers > 0 ? "block" : "uniform",
          "--recompute-num-layers",  std::to_string(std::max(1, sh.recompute_layers))};
}

}  // namespace

std::vector<std::string> MegatronArgs(const Candidate& c, int64_t num_layers) {
  const TrainingShape& sh = c.shape;
  std::vector<std::string> a = {"--tensor-model-parallel-size",
                                std::to_string(c.config.tp),
                                "--pipeline-model-parallel-size",
                                std::to_string(c.config.pp),
                                "--global-batch-size",
                                std::to_string(sh.global_batch),
                                "--micro-batch-size",
                                std::to_string(sh.micro_batch),
                                "--seq-length",
                                std::to_string(sh.seq_length)};
  auto add = [&a](std::initializer_list<std::string> more) { a.insert(a.end(), more); };
  const std::vector<std::string> recompute = RecomputeArgs(sh);
  a.insert(a.end(), recompute.begin(), recompute.end());
  if (sh.sequence_parallel && c.config.tp > 1) add({"--sequence-parallel"});
  if (sh.virtual_stages > 1) {  // every stage holds the same layers then (CheckShape)
    add({"--num-layers-per-virtual-pipeline-stage",
         std::to_string(num_layers / c.config.pp / sh.virtual_stages)});
  }
  if (c.config.zero) add({"--use-distributed-optimizer"});
  return a;
}

std::string SuggestionToJson(const Model& model, const SuggestOptions& o, const Suggestion& s,
                             int top) {
  const DeviceProfile& p = o.profile;
  json j;
  j["model"] = model.name;
  j["params_dtype"] = ParamsDtype(model);
  j["gpus"] = o.gpus;
  j["world_size"] = s.world_size;
  j["idle_gpus"] = s.idle_gpus;
  j["considered"] = s.considered;
  j["evaluated"] = s.evaluated;
  j["fitting"] = s.fitting;
  j["profile"] = {{"name", p.name},
                  {"peak_tflops", p.peak_flops / 1e12},
                  {"efficiency", p.efficiency},
                  {"memory", p.memory_bytes},
                  {"gpus_per_host", p.gpus_per_host},
                  {"intra_host_gbps", p.intra_bw / 1e9},
                  {"inter_host_gbps", p.inter_bw / 1e9},
                  {"dp_overlap", p.dp_overlap},
                  {"tp_overlap", p.tp_overlap},
                  {"layer_overhead_us", p.layer_overhead * 1e6}};
  j["shape"] = {{"global_batch", o.shape.global_batch},
                {"micro_batch", o.shape.micro_batch},
                {"seq_length", o.shape.seq_length},
                {"recompute", RecomputeText(o.shape)},
                {"sequence_parallel", o.shape.sequence_parallel},
                {"virtual_stages", o.shape.virtual_stages}};
  j["search"] = {{"micro_batch", o.search.micro_batch},
                 {"recompute", o.search.recompute},
                 {"sequence_parallel", o.search.sequence_parallel},
                 {"virtual_stages", o.search.virtual_stages},
                 {"distributed_optimizer", o.search.distributed_optimizer}};
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
    e["micro_batch"] = c.shape.micro_batch;
    e["recompute"] = RecomputeText(c.shape);
    e["sequence_parallel"] = c.shape.sequence_parallel;
    e["virtual_stages"] = c.shape.virtual_stages;
    e["megatron_args"] = MegatronArgs(c, model.num_layers);
    e["tp_crosses_hosts"] = c.tp_crosses_hosts;
    e["micro_batches"] = c.estimate.micro_batches;
    e["step_seconds"] = c.estimate.time.total();
    e["time"] = TimeJson(c.estimate.time);
    e["memory"] = MemoryJson(c.estimate.memory);
    e["fits"] = c.fits;
    list.push_back(std::move(e));
  }
  j["configs"] = std::move(list);
  j["fits_only_across_hosts"] = FitsOnlyAcrossHosts(s);
  return j.dump() + "\n";
}

namespace {

// "b=2 full:3 sp v=2": the knobs of a candidate in a few characters.
std::string KnobsText(const Candidate& c) {
  std::string k = "b=" + std::to_string(c.shape.micro_batch) + " " + RecomputeText(c.shape);
  if (c.shape.sequence_parallel && c.config.tp > 1) k += " sp";
  if (c.shape.virtual_stages > 1) k += " v=" + std::to_string(c.shape.virtual_stages);
  return k;
}

std::string Searched(const SearchSpace& s) {
  std::string out;
  auto add = [&out](bool on, const char* name) {
    if (on) out += std::string(out.empty() ? "" : ", ") + name;
  };
  add(s.micro_batch, "micro-batch");
  add(s.recompute, "recompute");
  add(s.sequence_parallel, "sequence parallelism");
  add(s.virtual_stages, "virtual stages");
  add(s.distributed_optimizer, "distributed optimizer");
  return out.empty() ? "none" : out;
}

}  // namespace

std::string SuggestionToText(const Model& model, const SuggestOptions& o, const Suggestion& s,
                             int top) {
  std::string out;
  char line[640];
  const SearchSpace& q = o.search;
  std::snprintf(
      line, sizeof line,
      "%s (%s parameters) on %d GPUs (%d per host, %s: %.0f TFLOP/s x %.2f, %s each); "
      "batch %lld x seq %lld%s%s%s\n  searched per config: %s\n",
      model.name.c_str(), ParamsDtype(model).c_str(), o.gpus, o.profile.gpus_per_host,
      o.profile.name.c_str(), o.profile.peak_flops / 1e12, o.profile.efficiency,
      HumanBytes(o.profile.memory_bytes).c_str(), static_cast<long long>(o.shape.global_batch),
      static_cast<long long>(o.shape.seq_length),
      q.micro_batch ? "" : (", micro-batch " + std::to_string(o.shape.micro_batch)).c_str(),
      q.recompute ? "" : (", recompute " + RecomputeText(o.shape)).c_str(),
      q.sequence_parallel
          ? ""
          : (o.shape.sequence_parallel ? ", sequence parallel" : ", no sequence parallelism"),
      Searched(q).c_str());
  out += line;
  if (s.idle_gpus) out += "  no config uses all GPUs: " + std::to_string(s.idle_gpus) + " idle\n";
  std::snprintf(line, sizeof line, "  %-4s %-30s %-18s %9s %9s %8s %8s %8s %8s %10s %10s %4s\n",
                "#", "config", "knobs", "step s", "compute", "tp", "p2p", "bubble", "dp", "memory",
                "activation", "fits");
  out += line;
  int shown = 0;
  for (int i = 0; i < static_cast<int>(s.ranked.size()) && (top <= 0 || i < top); ++i, ++shown) {
    const Candidate& c = s.ranked[i];
    const StepTime& t = c.estimate.time;
    const std::string cfg = c.config.ToString() + (c.tp_crosses_hosts ? " (x-host tp)" : "");
    std::snprintf(line, sizeof line,
                  "  %-4d %-30s %-18s %9.3f %9.3f %8.3f %8.3f %8.3f %8.3f %10s %10s %4s\n", i + 1,
                  cfg.c_str(), KnobsText(c).c_str(), t.total(), t.compute, t.tp, t.p2p, t.bubble,
                  t.dp, HumanBytes(c.estimate.memory.total()).c_str(),
                  HumanBytes(c.estimate.memory.activations).c_str(), c.fits ? "yes" : "no");
    out += line;
  }
  if (FitsOnlyAcrossHosts(s)) {
    out +=
        "  note: no config with its tp group inside a host fits; these cross hosts (TP priced "
        "on the inter-host link)\n";
  }
  if (!s.ranked.empty()) {
    std::string args;
    for (const std::string& a : MegatronArgs(s.ranked.front(), model.num_layers))
      args += (args.empty() ? "" : " ") + a;
    out += "  Megatron-LM arguments of #1: " + args + "\n";
  }
  out += "  (" + std::to_string(s.considered) + " configs, " + std::to_string(s.evaluated) +
         " knob settings evaluated; " + std::to_string(s.fitting) + " configs fit, " +
         std::to_string(shown) + " shown)\n";
  return out;
}

Result<WorkerChoice> ChooseForWorkers(const Model& model, const std::vector<std::string>& command,
                                      int gpus, const std::string& profile,
                                      const std::string& gpu_memory) {
  SuggestOptions o;
  o.gpus = gpus;
  o.shape.global_batch = 8;
  o.shape.micro_batch = 2;
  o.shape.seq_length = 64;
  // the example implements recomputation and micro-batches, not SP or virtual stages
  o.search = FixedKnobs();
  o.search.recompute = true;
  o.search.micro_batch = true;
  o.shape.sequence_parallel = false;
  for (std::size_t i = 0; i + 1 < command.size(); ++i) {
    int64_t* field = command[i] == "--global-batch-size"  ? &o.shape.global_batch
                     : command[i] == "--micro-batch-size" ? &o.shape.micro_batch
                     : command[i] == "--seq-length"       ? &o.shape.seq_length
                                                          : nullptr;
    if (!field) continue;
    if (field == &o.shape.micro_batch) o.search.micro_batch = false;  // the user's choice
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
  const Candidate& best = s.ranked.front();
  WorkerChoice out;
  out.config = best.config;
  // Megatron's flags for the knobs searched here, without the parallel sizes (the run
  // gives the config itself) and the batch arguments the command already has
  if (o.search.micro_batch)
    out.args = {"--micro-batch-size", std::to_string(best.shape.micro_batch)};
  const std::vector<std::string> recompute = RecomputeArgs(best.shape);
  out.args.insert(out.args.end(), recompute.begin(), recompute.end());
  return out;
}

}  // namespace tenplex::policy
