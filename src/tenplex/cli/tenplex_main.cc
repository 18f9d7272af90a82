// The tenplex command. Subcommands live in src/tenplex/cli/<name>.cc.
#include <CLI/CLI.hpp>

#include "tenplex/cli/command.h"

int main(int argc, char** argv) {
  CLI::App app{"tenplex: state management for elastic multi-dimensional parallel training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tenplex 0.1.0");
  tenplex::cli::Context ctx;
  tenplex::cli::AddGlobalOptions(app);
  tenplex::cli::RegisterModel(app, ctx);
  tenplex::cli::RegisterLayout(app, ctx);
  tenplex::cli::RegisterStore(app, ctx);
  tenplex::cli::RegisterRun(app, ctx);
  tenplex::cli::RegisterPlan(app, ctx);
  tenplex::cli::RegisterCkpt(app, ctx);
  tenplex::cli::RegisterData(app, ctx);
  tenplex::cli::RegisterTransform(app, ctx);
  tenplex::cli::RegisterInterop(app, ctx);
  tenplex::cli::RegisterConfig(app, ctx);
  tenplex::cli::RegisterSimulate(app, ctx);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return tenplex::cli::ParseFailed(app, e);
  }
  return ctx.exit_code;
}
