// tenplex data mount --index DIR --mountpoint M --seed S --global-batch B --dp D [--dp-weights W]
//                    --start-sample P
#include <cstdio>

#include "tenplex/cli/data_commands.h"
#include "tenplex/data/dataset.h"
#include "tenplex/data/fuse_mount.h"
#include "tenplex/data/view.h"

namespace tenplex::cli {

void RegisterDataMount(CLI::App& data, Context& ctx) {
  auto* cmd = data.add_subcommand(
      "mount", "Serve each rank's samples from a position as read-only files (FUSE; foreground)");
  struct Opts {
    std::string index, mountpoint;
    uint64_t seed = 0;
    int64_t global_batch = 0, start = 0, threads = 4;
    DpOptions dp;
    bool allow_other = false, debug = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--index", o->index, "Index directory (tenplex data index)")->required();
  cmd->add_option("--mountpoint", o->mountpoint, "Existing empty directory to mount on")
      ->required();
  cmd->add_option("--seed", o->seed, "Seed of the order")->required();
  cmd->add_option("--global-batch", o->global_batch, "Samples per global batch")->required();
  o->dp.Add(*cmd, "Data-parallel degree (one directory per rank)");
  cmd->add_option("--start-sample", o->start, "Position (a multiple of the global batch)")
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "Request-serving threads")->capture_default_str();
  cmd->add_flag("--allow-other", o->allow_other, "Let other users read the mount");
  cmd->add_flag("--debug", o->debug, "Log FUSE requests to stderr");
  cmd->callback([o, cmd, &ctx] {
    auto run = [&]() -> Status {
      data::ViewSpec spec;
      spec.seed = o->seed;
      TP_ASSIGN_OR_RETURN(spec.global_batch, CheckCount("--global-batch", o->global_batch));
      TP_ASSIGN_OR_RETURN(auto dp, o->dp.Get(*cmd));
      spec.dp = dp.first;
      spec.dp_weights = std::move(dp.second);
      TP_ASSIGN_OR_RETURN(spec.start_sample, CheckCount("--start-sample", o->start, true));
      TP_ASSIGN_OR_RETURN(uint64_t threads, CheckCount("--threads", o->threads));
      TP_ASSIGN_OR_RETURN(auto dataset, data::Dataset::Open(o->index));
      TP_ASSIGN_OR_RETURN(auto view, data::DatasetView::Create(dataset, spec));
      data::MountOptions mo;
      mo.threads = static_cast<int>(std::min<uint64_t>(threads, 64));
      mo.allow_other = o->allow_other;
      mo.debug = o->debug;
      mo.handle_signals = true;
      TP_ASSIGN_OR_RETURN(auto mount, data::FuseMount::Start(view, o->mountpoint, mo));
      std::printf(
          "serving %llu ranks, steps %llu..%llu (epoch %llu) at %s; unmount or SIGTERM to stop\n",
          static_cast<unsigned long long>(spec.dp),
          static_cast<unsigned long long>(view->first_step().step),
          static_cast<unsigned long long>(view->first_step().step + view->steps() - 1),
          static_cast<unsigned long long>(view->first_step().epoch), o->mountpoint.c_str());
      std::fflush(stdout);
      return mount->Wait();
    };
    Finish(ctx, run());
  });
}

}  // namespace tenplex::cli
