// tenplex plan --model M --from C1 --to C2 [--gpus-per-host K] [--json] [-o FILE]
// tenplex reshard --in DIR --to C2 --out DIR2 [--model M] [--from C1] [--no-verify]
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tenplex/cli/command.h"
#include "tenplex/plan/planner.h"
#include "tenplex/transform/reshard.h"
#include "tenplex/util/format.h"
#include "tenplex/util/log.h"

namespace tenplex::cli {
namespace {

Status RunPlan(const std::string& model_spec, const std::string& from_text,
               const std::string& to_text, int gpus, bool json, const std::string& out) {
  if (gpus < 1)
    return InvalidArgument("--gpus-per-host must be at least 1, got " + std::to_string(gpus));
  TP_ASSIGN_OR_RETURN(Model model, LoadModel(model_spec));
  auto from_cfg = ParseConfig(from_text);
  if (!from_cfg.ok()) return from_cfg.status().WithContext("--from");
  auto to_cfg = ParseConfig(to_text);
  if (!to_cfg.ok()) return to_cfg.status().WithContext("--to");
  auto from = MakeLayout(model, *from_cfg);
  if (!from.ok()) return from.status().WithContext("--from " + from_cfg->ToString());
  auto to = MakeLayout(model, *to_cfg);
  if (!to.ok()) return to.status().WithContext("--to " + to_cfg->ToString());
  const std::vector<int> from_hosts = plan::DefaultHosts(from->world_size(), gpus);
  const std::vector<int> to_hosts = plan::DefaultHosts(to->world_size(), gpus);
  TP_ASSIGN_OR_RETURN(plan::Plan p, plan::MakePlan(model, *from, *to, from_hosts, to_hosts));
  return WriteOutput(out, json ? plan::PlanToJson(p, *from, *to)
                               : plan::PlanSummary(model, p, *from, *to, from_hosts, to_hosts));
}

struct ReshardOpts {
  std::string in, out, to, model, from;
  bool no_verify = false, json = false, mmap_output = false;
};

// tenplex reshard: converts the checkpoint and prints its report.
Status RunReshard(const ReshardOpts& o) {
  transform::ReshardOptions ro;
  ro.in = o.in;
  ro.out = o.out;
  auto to = ParseConfig(o.to);
  if (!to.ok()) return to.status().WithContext("--to");
  ro.to = *to;
  if (!o.model.empty()) {
    auto m = LoadModel(o.model);
    if (!m.ok()) return m.status().WithContext("--model");
    ro.model = std::move(m).value();
  }
  if (!o.from.empty()) {
    auto f = ParseConfig(o.from);
    if (!f.ok()) return f.status().WithContext("--from");
    ro.from = *f;
  }
  ro.verify_checksums = !o.no_verify;
  ro.streamed = !o.mmap_output;
  ro.pool = &ThreadPool::Default();
  Progress progress("reshard");
  TP_ASSIGN_OR_RETURN(transform::ReshardReport r, transform::Reshard(ro));
  progress.Done();
  if (o.json) {
    nlohmann::json j = {{"in", o.in},
                        {"out", o.out},
                        {"from", r.from.ToString()},
                        {"to", ro.to.ToString()},
                        {"bytes_written", r.bytes_written},
                        {"plan_seconds", r.plan_seconds},
                        {"copy_seconds", r.copy_seconds},
                        {"output", r.streamed ? "streamed" : "mmap"},
                        {"seconds", r.total_seconds}};
    return WriteOutput("", j.dump() + "\n");
  }
  if (GetLogLevel() != LogLevel::kQuiet) {
    std::printf("resharded %s (%s) -> %s (%s): %s written in %.2f s (%.2f GB/s), plan %.3f s\n",
                o.in.c_str(), r.from.ToString().c_str(), o.out.c_str(), ro.to.ToString().c_str(),
                HumanBytes(r.bytes_written).c_str(), r.total_seconds,
                r.total_seconds > 0 ? r.bytes_written / r.total_seconds / 1e9 : 0.0,
                r.plan_seconds);
  }
  return Status::Ok();
}

// tenplex plan
void RegisterPlanCommand(CLI::App& app, Context& ctx) {
  auto* cmd =
      app.add_subcommand("plan", "Plan a reconfiguration: which bytes move from where to where");
  struct Opts {
    std::string model, from, to, out;
    int gpus = 8;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "Model JSON file or preset name")->required();
  cmd->add_option("--from", o->from, "Old parallel config, e.g. tp=2,pp=2,dp=2")->required();
  cmd->add_option("--to", o->to, "New parallel config")->required();
  cmd->add_option("--gpus-per-host", o->gpus, "Ranks per host (rank r on host r / K)")
      ->default_val(8);
  cmd->add_flag("--json", o->json, "Print the plan as JSON (spec section 8)");
  cmd->add_option("-o,--output", o->out, "Output file (default stdout)");
  cmd->callback(
      [o, &ctx] { Finish(ctx, RunPlan(o->model, o->from, o->to, o->gpus, o->json, o->out)); });
}

// tenplex reshard
void RegisterReshardCommand(CLI::App& app, Context& ctx) {
  auto* cmd =
      app.add_subcommand("reshard", "Convert a checkpoint directory to another parallel config");
  auto o = std::make_shared<ReshardOpts>();
  cmd->add_option("--in", o->in, "Input checkpoint directory")->required();
  cmd->add_option("--to", o->to, "New parallel config")->required();
  cmd->add_option("--out", o->out, "Output checkpoint directory (must not exist or be empty)")
      ->required();
  cmd->add_option("--model", o->model,
                  "Expected model (file or preset); checked against the checkpoint");
  cmd->add_option("--from", o->from, "Expected config of the checkpoint; checked");
  cmd->add_flag(
      "--no-verify", o->no_verify,
      "Read the input even without checksums in tenplex.json (they are required and checked)");
  // -q/--quiet is the global flag (before or after the subcommand): nothing on success.
  cmd->add_flag("--json", o->json, "Print the report as JSON");
  cmd->add_flag("--mmap-output", o->mmap_output,
                "Fill mapped output files instead of writing from warm buffers (the earlier "
                "output path, kept for comparison; same bytes)");
  cmd->callback([o, &ctx] { Finish(ctx, RunReshard(*o)); });
}

}  // namespace

void RegisterPlan(CLI::App& app, Context& ctx) {
  RegisterPlanCommand(app, ctx);
  RegisterReshardCommand(app, ctx);
}

}  // namespace tenplex::cli
