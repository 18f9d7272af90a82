#include "tenplex/cli/command.h"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>

#include "tenplex/util/file.h"

namespace tenplex::cli {

int Fail(const Status& status) {
  std::fprintf(stderr, "tenplex: error: %s\n", status.message().c_str());
  switch (status.code()) {
    case StatusCode::kOk: return 0;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kOutOfRange:
    case StatusCode::kAlreadyExists:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kDataLoss: return 2;
    default: return 1;
  }
}

void Finish(Context& ctx, const Status& status) {
  ctx.exit_code = status.ok() ? 0 : Fail(status);
}

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
