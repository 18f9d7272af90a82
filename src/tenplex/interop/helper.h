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

// The folder holding the `tenplex` Python package: $TENPLEX_PYTHON_DIR, else the
// source tree's python/ (set at build time).
std::string PythonDir();
// The interpreter: $TENPLEX_PYTHON, else the project's .venv/bin/python (CMake's
// TENPLEX_PY) where it exists, else python3 on PATH.
std::string PythonExe();

// Runs `python -m tenplex.interop <args>` with stdout and stderr passed through and
// returns its exit status (0 ok, 2 bad input, 1 other failure). A helper that cannot
// start or dies by a signal is an error naming the reason.
Result<int> RunHelper(const std::vector<std::string>& args);

}  // namespace tenplex::interop
