// tenplex run --schedule S.json --log LOG.jsonl [--model M] [--baseline LOG] -- CMD ARGS...
#include "tenplex/cli/command.h"
#include "tenplex/runtime/runner.h"
#include "tenplex/util/log.h"

namespace tenplex::cli {
namespace {

// What the command line sets besides runtime::RunOptions: the callback reads it.
struct RunFlags {
  bool quiet = false;
  bool json = false;
  bool no_presize = false;
  bool allow_disk = false;
  TokenOptions token;
};

// Where the job's state lives and where the run writes: schedule, log, model, job, store
// directory or cluster, token, work directory.
void AddStateOptions(CLI::App* cmd, runtime::RunOptions* o, RunFlags* f) {
  cmd->add_option("--schedule", o->schedule_path, "JSON list of {step, config | stop, kill_ranks}")
      ->required();
  cmd->add_option("--log", o->log_path,
                  "JSON-lines log: one line per step and per reconfiguration (an existing log is "
                  "appended to)")
      ->required();
  cmd->add_option("--model", o->model_path,
                  "Model JSON or preset (default: --model of the command)");
  cmd->add_option("--job", o->job,
                  "Job name in the store; a job with a committed version is continued from it")
      ->capture_default_str();
  cmd->add_option(
      "--shm-dir", o->shm_dir,
      "Store directory, kept: a second run with the same --job continues from its last commit "
      "(default: a fresh one in /dev/shm, removed at exit)");
  cmd->add_option(
      "--cluster", o->cluster_path,
      "Keep the state in the store daemons of this cluster file (docs/transform.md) instead of an "
      "embedded store; needs --work-dir");
  cmd->add_flag("--allow-disk", f->allow_disk,
                "Allow a --shm-dir that is not on a memory file system (the state then lives on "
                "disk)");
  AddTokenOptions(cmd, &f->token);
  cmd->add_option("--work-dir", o->work_dir,
                  "Hand-off files and worker logs (default: inside the store directory)");
}

// How the workers run between and across reconfigurations: hang limit, periodic commits,
// warm workers, presizing.
void AddWorkerOptions(CLI::App* cmd, runtime::RunOptions* o, RunFlags* f) {
  cmd->add_option("--hang-seconds", o->hang_seconds, "Fail when no step completes for this long")
      ->capture_default_str();
  cmd->add_option(
         "--commit-every", o->commit_every,
         "Also commit the workers' state every N steps while they train on (0: only at config "
         "changes); a failure then re-runs at most the N steps since the last commit")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--warm", o->warm,
                "Keep workers alive across reconfigurations and failures: they re-join the new "
                "world and re-map their state; only added ranks start new processes (the command "
                "must speak --warm-control, as examples/gpt/train.py does; docs/runtime.md)");
  cmd->add_flag("--no-presize", f->no_presize,
                "With --cluster: do not make the next config's new tensors ahead on its hosts "
                "while the current config trains (docs/runtime.md)");
}

// Moving to an uneven split when ranks run at different speeds (docs/hetero.md).
void AddRebalanceOptions(CLI::App* cmd, runtime::RunOptions* o) {
  cmd->add_flag("--rebalance", o->rebalance,
                "Measure per-rank speeds (rank_seconds) and move to an uneven split (tp_weights, "
                "dp_weights, layers=) when the predicted gain exceeds the reconfiguration cost "
                "(docs/hetero.md)");
  cmd->add_option("--rebalance-window", o->rebalance_window,
                  "With --rebalance: steps between commits where speeds are checked")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--rebalance-min-gain", o->rebalance_min_gain,
                  "With --rebalance: relative step-time gain below which the split stays")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--rebalance-cost", o->rebalance_cost,
                  "With --rebalance: assume a reconfiguration costs this many seconds instead of "
                  "the measured cost (what-if runs; tests on a loaded machine)");
}

// Checks the store directory and the token, runs the schedule and prints its summary.
void RunCommand(const std::shared_ptr<runtime::RunOptions>& o, const RunFlags& f, Context& ctx) {
  o->presize = !f.no_presize;
  if (!o->shm_dir.empty()) {  // as store serve (issue 34 finding 5)
    Result<std::string> fs = CheckStoreFileSystem(o->shm_dir, "--shm-dir", f.allow_disk);
    if (!fs.ok()) return Finish(ctx, fs.status());
  }
  Result<std::string> t = ResolveToken(f.token);
  if (!t.ok()) return Finish(ctx, t.status());
  o->token = *t;
  o->notify = [](const std::string& m) { std::fprintf(stderr, "tenplex run: %s\n", m.c_str()); };
  auto s = runtime::Run(*o);
  if (!s.ok()) return Finish(ctx, s.status());
  if (f.json) {
    std::printf("%s\n", runtime::SummaryJson(*s).c_str());
  } else if (!f.quiet && GetLogLevel() != LogLevel::kQuiet) {
    std::fputs(runtime::SummaryTable(*s).c_str(), stdout);
  }
  ctx.exit_code = 0;
}

}  // namespace

void RegisterRun(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "run", "Run a training command through an elastic schedule of parallel configs");
  auto o = std::make_shared<runtime::RunOptions>();
  auto f = std::make_shared<RunFlags>();
  AddStateOptions(cmd, o.get(), f.get());
  AddWorkerOptions(cmd, o.get(), f.get());
  AddRebalanceOptions(cmd, o.get());
  cmd->add_option("--baseline", o->baseline_log,
                  "Log of a static run to compare losses and samples with");
  cmd->add_flag("--quiet", f->quiet, "Do not print the summary table (-q/--quiet does too)");
  cmd->add_flag("--json", f->json,
                "Print the summary as one JSON object (steps, reconfigurations)");
  cmd->add_option("command", o->command, "Worker command and arguments (after --)")->required();
  cmd->callback([o, f, &ctx] { RunCommand(o, *f, ctx); });
}

}  // namespace tenplex::cli
