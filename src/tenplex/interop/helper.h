// Checkpoint import and export (docs/interop.md): the torch formats (PyTorch DCP,
// Megatron-LM .pt files) are pickles that only torch reads, so the format codecs live
// in one Python package, python/tenplex/interop, run with the project's interpreter. This side
// checks what it can before (the model, the configs, the source checkpoint against its
// layout, the target not existing) and after an import (the new checkpoint against
// the C++ layout, every rank file and tensor), so a bad argument is an exit-2 error
// without starting Python and a wrong conversion cannot pass as a checkpoint.
#pragma once

#include <string>
#include <vector>

#include "tenplex/util/status.h"

namespace tenplex::interop {

inline constexpr const char* kFormats[] = {"dcp", "megatron", "hf", "ds-universal", "mcore"};

// The folder holding the `tenplex` Python package (one with tenplex/interop/__main__.py)
// for a CLI whose executable lies in `exe_dir`: $TENPLEX_PYTHON_DIR, else, relative to
// the executable, EXE/../lib/python3*/{dist,site}-packages (`cmake --install`, pip into an
// environment) or EXE/.. (`pip install --target DIR`: DIR/bin and DIR/tenplex); the source
// tree's python/ only for the executable in the build tree (compiled-in paths, never
// used by an installed CLI). NotFound lists the places looked in.
Result<std::string> PythonDirFor(const std::string& exe_dir);
// PythonDirFor the running executable (/proc/self/exe).
Result<std::string> PythonDir();
// The interpreter: $TENPLEX_PYTHON, else python3 beside the executable (a CLI that pip
// installed into an environment), else the interpreter CMake built the native module for
// (TENPLEX_PY, the project's .venv/bin/python) where it exists, else python3 on PATH.
std::string PythonExe();

// Runs `python -m tenplex.interop <args>` with stdout and stderr passed through and
// returns its exit status (0 ok, 2 bad input, 1 other failure). A helper that cannot
// start or dies by a signal is an error naming the reason.
Result<int> RunHelper(const std::vector<std::string>& args);

}  // namespace tenplex::interop
