// `tenplex data ...`: the subcommands of the data group, one file each
// (data_index.cc, data_read.cc, data_batches.cc, data_mount.cc), registered by
// RegisterData (data.cc).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tenplex/cli/command.h"

namespace tenplex::cli {

void RegisterDataIndex(CLI::App& data, Context& ctx);
void RegisterDataRead(CLI::App& data, Context& ctx);
void RegisterDataBatches(CLI::App& data, Context& ctx);
void RegisterDataMount(CLI::App& data, Context& ctx);

// Sizes are taken as signed integers so that "0" and "-3" get our message, not a
// parser's: `what` must be > 0 (or >= 0 when zero_ok).
Result<uint64_t> CheckCount(const char* what, int64_t v, bool zero_ok = false);

// --dp and --dp-weights (spec §9, "2+1+1"): the dp degree and the weights (empty when
// none are given). With weights and no --dp, dp is their count; a --dp that differs
// from their count is an error.
struct DpOptions {
  int64_t dp = 1;
  std::string weights;
  void Add(CLI::App& cmd, const char* dp_help);
  Result<std::pair<uint64_t, std::vector<int>>> Get(const CLI::App& cmd) const;
};

}  // namespace tenplex::cli
