// tenplex config suggest --model M --gpus N [--gpus-per-host K] [--gpu-memory 80GiB]
//   [--device-profile a100|h100|cpu|FILE] [--global-batch B --seq-length s]
//   [--micro-batch b] [--recompute none|selective|full|full:N] [--sequence-parallel |
//   --no-sequence-parallel] [--virtual-stages v] [--no-distributed-optimizer]
//   [--fixed-knobs] [--params-dtype bf16] [--device-speeds 1,1,0.5,...] [--efficiency E]
//   [--top 5] [--all] [--json]
// A knob given is fixed; the others are searched per config (policy.h).
#include <cstdio>

#include "tenplex/cli/command.h"
#include "tenplex/model/gpt.h"
#include "tenplex/policy/policy.h"
#include "tenplex/store/parse.h"
#include "tenplex/util/format.h"

namespace tenplex::cli {
namespace {

struct SuggestArgs {
  std::string model, profile = "a100", gpu_memory, speeds, recompute, params_dtype;
  int gpus = 0, gpus_per_host = 0, top = 5, virtual_stages = 0;
  int64_t global_batch = 512, micro_batch = 0, seq_length = 0;
  double efficiency = 0;
  bool sp = false, no_sp = false, no_dist_opt = false, fixed = false, all = false, json = false;
};

// A preset in the parameter dtype GPUs train with: presets are fp32 in `tenplex model`,
// the profiles' peaks are 16-bit, so a preset is bf16 here unless --params-dtype says
// otherwise; a model file keeps its own dtype (the table's header shows it).
Result<Model> LoadPolicyModel(const std::string& spec, const std::string& dtype) {
  auto args = GptPreset(spec.rfind("preset:", 0) == 0 ? spec.substr(7) : spec);
  if (!args.ok()) {
    if (dtype.empty()) return LoadModel(spec);
    return InvalidArgument("--params-dtype needs a preset name as --model (got '" + spec + "')");
  }
  args->params_dtype = dtype.empty() ? "bf16" : dtype;
  return MakeGpt(*args);
}

// The knobs: a knob given is fixed, the others searched (--fixed-knobs: none searched,
// the defaults micro-batch 1, selective recompute, sequence parallelism, no chunks).
Status SetKnobs(const SuggestArgs& a, policy::SuggestOptions& o) {
  if (a.fixed) o.search = policy::FixedKnobs();
  if (a.micro_batch != 0) {
    o.shape.micro_batch = a.micro_batch;
    o.search.micro_batch = false;
  }
  if (!a.recompute.empty()) {
    TP_RETURN_IF_ERROR(policy::ParseRecomputeText(a.recompute, &o.shape));
    o.search.recompute = false;
  }
  if (a.sp && a.no_sp)
    return InvalidArgument("give one of --sequence-parallel and --no-sequence-parallel");
  if (a.sp || a.no_sp) {
    o.shape.sequence_parallel = a.sp;
    o.search.sequence_parallel = false;
  }
  if (a.virtual_stages < 0) return InvalidArgument("--virtual-stages must be >= 1");
  if (a.virtual_stages > 0) {
    o.shape.virtual_stages = a.virtual_stages;
    o.search.virtual_stages = false;
  }
  if (a.no_dist_opt) o.search.distributed_optimizer = false;
  return Status::Ok();
}

Status RunSuggest(const SuggestArgs& a) {
  TP_ASSIGN_OR_RETURN(Model model, LoadPolicyModel(a.model, a.params_dtype));
  policy::SuggestOptions o;
  o.gpus = a.gpus;
  auto prof = policy::LoadDeviceProfile(a.profile);
  if (!prof.ok()) return prof.status().WithContext("--device-profile");
  o.profile = *prof;
  if (a.gpus_per_host < 0) return InvalidArgument("--gpus-per-host must be >= 1");
  if (a.gpus_per_host > 0) o.profile.gpus_per_host = a.gpus_per_host;
  if (!a.gpu_memory.empty()) {
    auto b = store::ParseByteSize(a.gpu_memory);
    if (!b.ok()) return b.status().WithContext("--gpu-memory");
    o.profile.memory_bytes = static_cast<int64_t>(*b);
  }
  if (a.efficiency != 0) {
    if (!(a.efficiency > 0 && a.efficiency <= 1))
      return InvalidArgument("--efficiency must be in (0, 1]");
    o.profile.efficiency = a.efficiency;
  }
  o.shape.global_batch = a.global_batch;
  o.shape.seq_length = a.seq_length;
  if (o.shape.seq_length == 0) {
    auto it = model.info.find("max_position_embeddings");
    o.shape.seq_length = it != model.info.end() ? std::stoll(it->second) : 2048;
  }
  TP_RETURN_IF_ERROR(SetKnobs(a, o));
  if (!a.speeds.empty()) {
    for (std::string_view part : SplitString(a.speeds, ',')) {
      try {
        std::size_t used = 0;
        const std::string p(part);
        const double v = std::stod(p, &used);
        if (used != p.size()) throw std::invalid_argument("");
        o.speeds.push_back(v);
      } catch (const std::exception&) {
        return InvalidArgument("--device-speeds: '" + std::string(part) + "' is not a number");
      }
    }
  }
  o.include_unfit = a.all;
  TP_ASSIGN_OR_RETURN(policy::Suggestion s, policy::Suggest(model, o));
  return WriteOutput("", a.json ? policy::SuggestionToJson(model, o, s, a.top)
                                : policy::SuggestionToText(model, o, s, a.top));
}

}  // namespace

void RegisterConfig(CLI::App& app, Context& ctx) {
  auto* config =
      app.add_subcommand("config", "Parallel configurations: choose one for a set of GPUs");
  config->require_subcommand(1);
  auto* cmd = config->add_subcommand(
      "suggest", "Rank the configs that fit in memory by predicted step time (docs/policy.md)");
  auto a = std::make_shared<SuggestArgs>();
  cmd->add_option("--model", a->model, "Model JSON file or preset name")->required();
  cmd->add_option("--gpus", a->gpus, "Number of GPUs")->required();
  cmd->add_option("--gpus-per-host", a->gpus_per_host, "GPUs per host (default: the profile's, 8)");
  cmd->add_option("--gpu-memory", a->gpu_memory,
                  "Memory per GPU, e.g. 80GiB (default: the profile's)");
  cmd->add_option("--device-profile", a->profile, "a100, h100, cpu or a JSON file")
      ->default_val("a100");
  cmd->add_option("--global-batch", a->global_batch, "Samples per step")->default_val(512);
  cmd->add_option("--micro-batch", a->micro_batch, "Samples per micro-batch (default: searched)");
  cmd->add_option("--seq-length", a->seq_length,
                  "Tokens per sample (default: the model's positions)");
  cmd->add_option("--recompute", a->recompute,
                  "Activation recomputation: none, selective, full or full:N (the first N layers "
                  "of each chunk; default: searched)");
  cmd->add_flag("--sequence-parallel", a->sp, "Sequence parallelism on (default: searched)");
  cmd->add_flag("--no-sequence-parallel", a->no_sp, "Sequence parallelism off");
  cmd->add_option("--virtual-stages", a->virtual_stages,
                  "Model chunks per pipeline rank, 1 = no interleaving (default: searched)");
  cmd->add_flag("--no-distributed-optimizer", a->no_dist_opt,
                "Do not try zero=1 (Megatron's distributed optimizer)");
  cmd->add_flag("--fixed-knobs", a->fixed,
                "Search only (tp, pp, dp, zero): micro-batch 1, selective recompute, sequence "
                "parallelism, no chunks unless given");
  cmd->add_option("--params-dtype", a->params_dtype,
                  "With a preset: fp32, bf16 or fp16 parameters (default bf16)");
  cmd->add_option("--device-speeds", a->speeds, "Relative speed of each GPU, comma-separated");
  cmd->add_option("--efficiency", a->efficiency,
                  "Fraction of peak FLOP/s reached (default: the profile's)");
  cmd->add_option("--top", a->top, "List this many configs (0: all)")->default_val(5);
  cmd->add_flag("--all", a->all, "Also list configs that do not fit in memory");
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a, &ctx] { Finish(ctx, RunSuggest(*a)); });
}

}  // namespace tenplex::cli
