#include "tenplex/cli/command.h"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>

#include "tenplex/util/file.h"
#include "tenplex/util/log.h"

namespace tenplex::cli {

void AddGlobalOptions(CLI::App& app) {
  app.fallthrough();  // subcommands inherit it: -q/-v work after the subcommand too
  app.add_flag_callback(
      "-q,--quiet", [] { SetLogLevel(LogLevel::kQuiet); }, "Print only results and errors");
  app.add_flag_callback(
      "-v,--verbose", [] { SetLogLevel(LogLevel::kVerbose); },
      "Also print what was decided and why");
}

namespace {

// The deepest subcommand the parser reached, and its path from the app (for "see
// tenplex X Y --help").
CLI::App* DeepestCommand(CLI::App& app, std::string* path) {
  *path = app.get_name();
  CLI::App* cur = &app;
  for (bool found = true; found;) {
    found = false;
    for (CLI::App* sub : cur->get_subcommands()) {
      if (sub->parsed()) {
        *path += " " + sub->get_name();
        cur = sub;
        found = true;
        break;
      }
    }
  }
  return cur;
}

// "A subcommand is required" from CLI11, also when a word that is no subcommand was
// given (`tenplex store lss`): name the word and the subcommands there are.
std::string MissingSubcommand(CLI::App& app, CLI::App& cmd, const std::string& where) {
  std::string names;
  for (const CLI::App* sub :
       cmd.get_subcommands([](CLI::App* a) { return !a->get_name().empty(); }))
    names += (names.empty() ? "" : ", ") + sub->get_name();
  for (const std::string& word : app.remaining(/*recurse=*/true)) {
    if (!word.empty() && word[0] != '-')
      return "unknown subcommand '" + word + "' of '" + where + "' (subcommands: " + names + ")";
  }
  return "'" + where + "' needs a subcommand: " + names;
}

}  // namespace

int ParseFailed(CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success) ||
      dynamic_cast<const CLI::CallForHelp*>(&e) || dynamic_cast<const CLI::CallForAllHelp*>(&e) ||
      dynamic_cast<const CLI::CallForVersion*>(&e)) {
    return app.exit(e);  // help or version on stdout, exit 0
  }
  std::string message = e.what();
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
    // CLI11 lists unexpected arguments last-first; show them in the order given.
    std::size_t colon = message.find(": ");
    std::istringstream words(colon == std::string::npos ? "" : message.substr(colon + 2));
    std::vector<std::string> args{std::istream_iterator<std::string>(words),
                                  std::istream_iterator<std::string>()};
    std::string list;
    for (auto it = args.rbegin(); it != args.rend(); ++it) list += (list.empty() ? "" : " ") + *it;
    message = "unexpected argument(s): " + list;
  }
  std::string cmd;
  CLI::App* deepest = DeepestCommand(app, &cmd);
  const std::string where =
      cmd == app.get_name() ? "tenplex" : "tenplex" + cmd.substr(app.get_name().size());
  if (dynamic_cast<const CLI::RequiredError*>(&e) && message.rfind("A subcommand", 0) == 0 &&
      deepest->get_require_subcommand_min() > 0) {
    message = MissingSubcommand(app, *deepest, where);
  }
  std::fprintf(stderr, "tenplex: error: %s\n(see '%s --help')\n", message.c_str(), where.c_str());
  return 2;
}

int Fail(const Status& status) {
  std::fprintf(stderr, "tenplex: error: %s\n", status.message().c_str());
  switch (status.code()) {
    case StatusCode::kOk:
      return 0;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kOutOfRange:
    case StatusCode::kAlreadyExists:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kDataLoss:
      return 2;
    default:
      return 1;
  }
}

void Finish(Context& ctx, const Status& status) { ctx.exit_code = status.ok() ? 0 : Fail(status); }

Status WriteOutput(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return Status::Ok();
  }
  return WriteFileAtomic(path, text);
}

Result<std::string> ReadInput(const std::string& path) {
  if (path == "-") {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  return ReadFile(path);
}

}  // namespace tenplex::cli
