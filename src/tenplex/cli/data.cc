// tenplex data {index,read,batches,mount}: dataset indexes, the global sample order
// and the per-rank FUSE view (docs/data.md).
#include "tenplex/cli/data_commands.h"
#include "tenplex/util/apportion.h"

namespace tenplex::cli {

Result<uint64_t> CheckCount(const char* what, int64_t v, bool zero_ok) {
  if (v < 0 || (v == 0 && !zero_ok)) {
    return InvalidArgument(std::string(what) + " must be " +
                           (zero_ok ? "non-negative" : "positive") + ", got " + std::to_string(v));
  }
  return static_cast<uint64_t>(v);
}

void DpOptions::Add(CLI::App& cmd, const char* dp_help) {
  cmd.add_option("--dp", dp, dp_help)->capture_default_str();
  cmd.add_option("--dp-weights", weights,
                 "Uneven data parallelism (spec §9): dp rank j reads a share of every global "
                 "batch proportional to w_j, e.g. 2+1+1");
}

Result<std::pair<uint64_t, std::vector<int>>> DpOptions::Get(const CLI::App& cmd) const {
  TP_ASSIGN_OR_RETURN(uint64_t d, CheckCount("--dp", dp));
  std::vector<int> w;
  if (cmd.count("--dp-weights") > 0) {
    TP_ASSIGN_OR_RETURN(w, ParseWeights(weights, "--dp-weights"));
    if (cmd.count("--dp") == 0) {
      d = w.size();
    } else if (d != w.size()) {
      return InvalidArgument("--dp-weights " + weights + " lists " + std::to_string(w.size()) +
                             " weights but --dp is " + std::to_string(d));
    }
  }
  return std::make_pair(d, std::move(w));
}

void RegisterData(CLI::App& app, Context& ctx) {
  auto* data =
      app.add_subcommand("data", "Dataset indexes, the global sample order, per-rank views");
  data->require_subcommand(1);
  RegisterDataIndex(*data, ctx);
  RegisterDataRead(*data, ctx);
  RegisterDataBatches(*data, ctx);
  RegisterDataMount(*data, ctx);
}

}  // namespace tenplex::cli
