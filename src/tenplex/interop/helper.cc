#include "tenplex/interop/helper.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tenplex::interop {

std::string PythonDir() {
  const char* env = std::getenv("TENPLEX_PYTHON_DIR");
  return env && *env ? env : TENPLEX_PYTHON_DIR;
}

std::string PythonExe() {
  const char* env = std::getenv("TENPLEX_PYTHON");
  if (env && *env) return env;
  // The project's virtual environment (CMake's TENPLEX_PY); an installed CLI whose
  // source tree is gone falls back to python3 on PATH.
  if (::access(TENPLEX_PY, X_OK) == 0) return TENPLEX_PY;
  return "python3";
}

Result<int> RunHelper(const std::vector<std::string>& args) {
  const std::string dir = PythonDir();
  const std::string exe = PythonExe();
  struct stat sb;
  if (::stat((dir + "/tenplex/interop/__main__.py").c_str(), &sb) != 0) {
    return FailedPrecondition(
        "the Python helper is missing: " + dir +
        "/tenplex/interop (set TENPLEX_PYTHON_DIR to the folder holding the tenplex package)");
  }
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
