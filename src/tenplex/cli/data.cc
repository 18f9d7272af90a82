// tenplex data {index,read,batches,mount}: dataset indexes, the global sample order
// and the per-rank FUSE view (docs/data.md).
#include "tenplex/cli/data_commands.h"

namespace tenplex::cli {

Result<uint64_t> CheckCount(const char* what, int64_t v, bool zero_ok) {
  if (v < 0 || (v == 0 && !zero_ok)) {
    return InvalidArgument(std::string(what) + " must be " +
                           (zero_ok ? "non-negative" : "positive") + ", got " + std::to_string(v));
  }
  return static_cast<uint64_t>(v);
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
