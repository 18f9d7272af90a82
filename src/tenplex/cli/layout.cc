// tenplex layout --model M --config C [--json] [-o FILE]
#include "tenplex/ptc/layout.h"

#include "tenplex/cli/command.h"
#include "tenplex/model/model.h"

namespace tenplex::cli {

void RegisterLayout(CLI::App& app, Context& ctx) {
  auto* cmd =
      app.add_subcommand("layout", "Print what every rank holds for a model and a parallel config");
  struct Opts {
    std::string model, config, out;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "Model JSON file or preset name")->required();
  cmd->add_option("--config", o->config, "Parallel config, e.g. tp=2,pp=2,dp=2,zero=1")->required();
  cmd->add_flag("--json", o->json, "Print the spec's JSON (ranks, tensors, pieces)");
  cmd->add_option("-o,--output", o->out, "Output file (default stdout)");
  cmd->callback([o, &ctx] {
    auto m = LoadModel(o->model);
    if (!m.ok()) return Finish(ctx, m.status());
    auto c = ParseConfig(o->config);
    if (!c.ok()) return Finish(ctx, c.status());
    auto l = MakeLayout(*m, *c);
    if (!l.ok()) return Finish(ctx, l.status());
    Finish(ctx, WriteOutput(o->out, o->json ? LayoutToJson(*l) : LayoutToText(*m, *l)));
  });
}

}  // namespace tenplex::cli
