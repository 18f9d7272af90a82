// `tenplex data ...`: the subcommands of the data group, one file each
// (data_index.cc, data_read.cc, data_batches.cc, data_mount.cc), registered by
// RegisterData (data.cc).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "tenplex/cli/command.h"

namespace tenplex::cli {

void RegisterDataIndex(CLI::App& data, Context& ctx);
void RegisterDataRead(CLI::App& data, Context& ctx);
void RegisterDataBatches(CLI::App& data, Context& ctx);
void RegisterDataMount(CLI::App& data, Context& ctx);

// Sizes are taken as signed integers so that "0" and "-3" get our message, not a
// parser's: `what` must be > 0 (or >= 0 when zero_ok).
Result<uint64_t> CheckCount(const char* what, int64_t v, bool zero_ok = false);

}  // namespace tenplex::cli
