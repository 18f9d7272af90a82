// tenplex ckpt init --model M --config C --out DIR [--seed S]
// tenplex ckpt verify --in DIR [--seed S]
#include <cstdio>

#include "tenplex/cli/command.h"
#include "tenplex/transform/reshard.h"

namespace tenplex::cli {

void RegisterCkpt(CLI::App& app, Context& ctx) {
  auto* ckpt = app.add_subcommand("ckpt", "Synthetic checkpoints for tests and benchmarks");
  ckpt->require_subcommand(1);
  {
    auto* cmd = ckpt->add_subcommand(
        "init", "Write a checkpoint whose every element is a function of (tensor, index, seed)");
    struct Opts {
      std::string model, config, out;
      uint64_t seed = 0;
    };
    auto o = std::make_shared<Opts>();
    cmd->add_option("--model", o->model, "Model JSON file or preset name")->required();
    cmd->add_option("--config", o->config, "Parallel config")->required();
    cmd->add_option("--out", o->out, "Output checkpoint directory (must not exist or be empty)")
        ->required();
    cmd->add_option("--seed", o->seed, "Seed of the synthetic content")->default_val(0);
    cmd->callback([o, &ctx] {
      auto run = [&]() -> Status {
        TP_ASSIGN_OR_RETURN(Model m, LoadModel(o->model));
        auto c = ParseConfig(o->config);
        if (!c.ok()) return c.status().WithContext("--config");
        return transform::InitCheckpoint(m, *c, o->out, o->seed, &ThreadPool::Default());
      };
      Finish(ctx, run());
    });
  }
  {
    auto* cmd = ckpt->add_subcommand(
        "verify", "Check every element of a synthetic checkpoint (padding zero)");
    struct Opts {
      std::string in;
      uint64_t seed = 0;
    };
    auto o = std::make_shared<Opts>();
    cmd->add_option("--in", o->in, "Checkpoint directory")->required();
    auto* seed = cmd->add_option("--seed", o->seed, "Seed (default: the one tenplex.json records)");
    cmd->callback([o, seed, &ctx] {
      std::optional<uint64_t> s;
      if (seed->count() > 0) s = o->seed;
      Status st = transform::VerifyCheckpoint(o->in, s, &ThreadPool::Default());
      if (st.ok()) std::printf("%s: every element matches\n", o->in.c_str());
      Finish(ctx, st);
    });
  }
}

}  // namespace tenplex::cli
