// The `tenplex` command line: one file per subcommand, each with a Register function
// that adds its CLI11 subcommand. A subcommand's callback stores its exit code in the
// shared Context; errors are printed in one place (Fail).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "tenplex/util/status.h"

namespace tenplex::cli {

struct Context {
  int exit_code = 0;
};

// -v/--verbose and -q/--quiet (log levels, util/log.h), accepted before or after the
// subcommand (the app falls through to them). Call before registering subcommands.
void AddGlobalOptions(CLI::App& app);
// The one place command-line errors are reported: "tenplex: error: <message>" and a
// pointer to the subcommand's --help on stderr, exit code 2 (help and --version: 0).
int ParseFailed(CLI::App& app, const CLI::ParseError& e);

// Prints "tenplex: error: <message>" to stderr and returns the exit code for the
// status: 2 for bad input (InvalidArgument, NotFound, OutOfRange, ...), 1 otherwise.
int Fail(const Status& status);
// Sets ctx.exit_code from a status (0 when ok, printing the error otherwise).
void Finish(Context& ctx, const Status& status);

// Writes text to path atomically (temp file, fsync, rename), or to stdout when path is
// empty or "-".
Status WriteOutput(const std::string& path, const std::string& text);
// Reads a whole file (or stdin for "-").
Result<std::string> ReadInput(const std::string& path);

// The daemons' bearer token (cli/token.cc, docs/reliability.md): `--token-file PATH`
// (a regular file not accessible by group or others) or else TENPLEX_TOKEN; `--token`
// on the command line is refused (exit 2), since `ps` shows it to every local user.
struct TokenOptions {
  std::string file;
  std::string refused;  // the value of a refused --token
};
void AddTokenOptions(CLI::App* cmd, TokenOptions* o);
// The token, or "" when neither the file nor the environment gives one.
Result<std::string> ResolveToken(const TokenOptions& o);

// A store directory belongs on a memory file system (tmpfs, ramfs, hugetlbfs): one on a
// disk (a typo in --shm-dir) is InvalidArgument naming `what` unless allow_disk. Returns
// the file system's name for a start line (cli/store.cc).
Result<std::string> CheckStoreFileSystem(const std::string& dir, const std::string& what,
                                         bool allow_disk);

void RegisterModel(CLI::App& app, Context& ctx);
void RegisterLayout(CLI::App& app, Context& ctx);
void RegisterStore(CLI::App& app, Context& ctx);
// `tenplex store ls|rm` (cli/store_admin.cc), under the `store` subcommand.
void RegisterStoreAdmin(CLI::App& store_cmd, Context& ctx);
void RegisterRun(CLI::App& app, Context& ctx);
void RegisterPlan(CLI::App& app, Context& ctx);
void RegisterCkpt(CLI::App& app, Context& ctx);
void RegisterData(CLI::App& app, Context& ctx);
void RegisterTransform(CLI::App& app, Context& ctx);
void RegisterInterop(CLI::App& app, Context& ctx);  // import, export
void RegisterConfig(CLI::App& app, Context& ctx);
void RegisterSimulate(CLI::App& app, Context& ctx);  // cli/simulate.cc

}  // namespace tenplex::cli
