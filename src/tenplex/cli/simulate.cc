// tenplex simulate SCENARIO.json [--json] [-o FILE]: predicts a distributed transform on a
// cluster described in the scenario (sim/simulate.h, docs/scale.md).
#include "tenplex/sim/simulate.h"

#include "tenplex/cli/command.h"

namespace tenplex::cli {
namespace {

Status RunSimulate(const std::string& path, bool json, const std::string& out) {
  TP_ASSIGN_OR_RETURN(std::string text, ReadInput(path));
  auto scenario = sim::ParseScenario(text);
  if (!scenario.ok()) return scenario.status().WithContext(path);
  auto r = sim::Simulate(*scenario);
  if (!r.ok()) return r.status().WithContext(path);
  return WriteOutput(out, json ? sim::SimResultToJson(*r) : sim::SimSummary(*r));
}

}  // namespace

void RegisterSimulate(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "simulate", "Predict a transform's bytes and time on a cluster described in a scenario");
  struct Opts {
    std::string scenario, out;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("scenario", o->scenario, "Scenario JSON file ('-' for stdin; docs/scale.md)")
      ->required();
  cmd->add_flag("--json", o->json, "Print the prediction as JSON (every host's bytes and phases)");
  cmd->add_option("-o,--output", o->out, "Output file (default stdout)");
  cmd->callback([o, &ctx] { Finish(ctx, RunSimulate(o->scenario, o->json, o->out)); });
}

}  // namespace tenplex::cli
