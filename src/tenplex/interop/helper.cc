#include "tenplex/interop/helper.h"

#include <glob.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "tenplex/util/log.h"

namespace tenplex::interop {

namespace {

namespace fs = std::filesystem;

bool HasHelper(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "tenplex/interop/__main__.py", ec);
}

// `dir` with `..` and links resolved (as given when that fails).
std::string Resolved(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(dir, ec);
  return ec ? dir : p.string();
}

// The same directory (both exist and resolve to one path).
bool SameDir(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::equivalent(a, b, ec) && !ec;
}

}  // namespace

Result<std::string> PythonDirFor(const std::string& exe_dir) {
  if (const char* env = std::getenv("TENPLEX_PYTHON_DIR"); env && *env) {
    if (HasHelper(env)) return std::string(env);
    return NotFound(std::string("the Python helper is missing: ") + env +
                    "/tenplex/interop (TENPLEX_PYTHON_DIR must name the folder holding the "
                    "tenplex package)");
  }
  std::vector<std::string> looked;
  const std::string up = exe_dir + "/..";
  for (const char* pattern : {"/lib/python3*/dist-packages", "/lib/python3*/site-packages"}) {
    glob_t g{};
    if (::glob((up + pattern).c_str(), 0, nullptr, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        if (HasHelper(g.gl_pathv[i])) {
          std::string found = g.gl_pathv[i];
          ::globfree(&g);
          return Resolved(found);
        }
      }
    }
    ::globfree(&g);
    looked.push_back(up + pattern);
  }
  if (HasHelper(up)) return Resolved(up);
  looked.push_back(up);
  // The build tree's executable uses the source tree's python/ (an installed copy never
  // does, even while the source tree exists: issue 34).
  if (SameDir(exe_dir, TENPLEX_BUILD_BIN_DIR) && HasHelper(TENPLEX_SOURCE_PYTHON_DIR)) {
    return std::string(TENPLEX_SOURCE_PYTHON_DIR);
  }
  std::string where;
  for (const std::string& l : looked) where += (where.empty() ? "" : ", ") + l;
  return NotFound(
      "the Python helper (tenplex/interop of the tenplex package) is not installed "
      "beside this tenplex CLI: looked in " +
      where +
      " (install the package with the CLI, docs/install.md, or set TENPLEX_PYTHON_DIR "
      "to the folder holding the tenplex package)");
}

Result<std::string> PythonDir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return Internal("cannot read /proc/self/exe: " + ec.message());
  return PythonDirFor(exe.parent_path().string());
}

std::string PythonExe() {
  const char* env = std::getenv("TENPLEX_PYTHON");
  if (env && *env) return env;
  // A CLI installed into a Python environment by pip (ENV/bin/tenplex) uses that
  // environment's interpreter.
  std::error_code ec;
  fs::path beside = fs::read_symlink("/proc/self/exe", ec).parent_path() / "python3";
  if (!ec && ::access(beside.c_str(), X_OK) == 0) return beside.string();
  // The interpreter CMake built the native module for (TENPLEX_PY); where it is gone
  // (an installed CLI whose checkout was removed), python3 on PATH.
  if (::access(TENPLEX_PY, X_OK) == 0) return TENPLEX_PY;
  return "python3";
}

Result<int> RunHelper(const std::vector<std::string>& args) {
  Result<std::string> found = PythonDir();
  if (!found.ok()) return FailedPrecondition(found.status().message());
  const std::string dir = *found;
  const std::string exe = PythonExe();
  LogVerbose("running %s -m tenplex.interop with the tenplex package of %s", exe.c_str(),
             dir.c_str());
  if (exe.find('/') != std::string::npos && ::access(exe.c_str(), X_OK) != 0) {
    return FailedPrecondition("cannot run " + exe +
                              " (the torch formats need Python 3 with torch: run "
                              "scripts/setup-venv.sh, or set TENPLEX_PYTHON)");
  }
  std::string pythonpath = dir;
  if (const char* old = std::getenv("PYTHONPATH"); old && *old)
    pythonpath += std::string(":") + old;
  std::vector<std::string> argv_s = {exe, "-m", "tenplex.interop"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid < 0) return Internal(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setenv("PYTHONPATH", pythonpath.c_str(), 1);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "tenplex: error: exec %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Internal(std::string("waitpid: ") + std::strerror(errno));
  }
  if (WIFSIGNALED(status)) {
    return Internal("the Python helper (" + exe + " -m tenplex.interop) died by signal " +
                    std::to_string(WTERMSIG(status)));
  }
  return WEXITSTATUS(status);
}

}  // namespace tenplex::interop
