// tenplex data batches --index DIR --seed S --global-batch B --dp D [--dp-weights W] --rank R
//                      --start-sample P --steps N [--json]
#include <nlohmann/json.hpp>

#include "tenplex/cli/data_commands.h"
#include "tenplex/data/dataset.h"
#include "tenplex/data/order.h"

namespace tenplex::cli {

void RegisterDataBatches(CLI::App& data, Context& ctx) {
  auto* cmd =
      data.add_subcommand("batches", "Print a rank's sample ids for N steps from a position");
  struct Opts {
    std::string index;
    uint64_t seed = 0;
    int64_t global_batch = 0, rank = 0, start = 0, steps = 1;
    DpOptions dp;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--index", o->index, "Index directory (tenplex data index)")->required();
  cmd->add_option("--seed", o->seed, "Seed of the order (unsigned 64-bit)")->required();
  cmd->add_option("--global-batch", o->global_batch, "Samples per global batch")->required();
  o->dp.Add(*cmd, "Data-parallel degree");
  cmd->add_option("--rank", o->rank, "Data-parallel rank (0-based)")->capture_default_str();
  cmd->add_option(
         "--start-sample", o->start,
         "Position: samples consumed so far, across epochs (a multiple of the global batch)")
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "Number of steps to print")->capture_default_str();
  cmd->add_flag("--json", o->json, R"(Print {"steps": [{"step": g, "samples": [ids]}]})");
  cmd->callback([o, cmd, &ctx] {
    auto run = [&]() -> Status {
      TP_ASSIGN_OR_RETURN(uint64_t batch, CheckCount("--global-batch", o->global_batch));
      TP_ASSIGN_OR_RETURN(auto dp, o->dp.Get(*cmd));
      TP_ASSIGN_OR_RETURN(uint64_t rank, CheckCount("--rank", o->rank, true));
      TP_ASSIGN_OR_RETURN(uint64_t start, CheckCount("--start-sample", o->start, true));
      TP_ASSIGN_OR_RETURN(uint64_t steps, CheckCount("--steps", o->steps));
      TP_ASSIGN_OR_RETURN(data::Slice slice,
                          data::WeightedRankSlice(batch, dp.first, dp.second, rank));
      TP_ASSIGN_OR_RETURN(auto dataset, data::Dataset::Open(o->index));
      TP_ASSIGN_OR_RETURN(data::GlobalOrder order,
                          data::GlobalOrder::Create({dataset->num_samples(), o->seed, batch}));
      TP_ASSIGN_OR_RETURN(data::StepInfo first, order.Locate(start));
      if (steps > UINT64_MAX - first.step)
        return InvalidArgument("--steps runs past the last representable step");
      nlohmann::ordered_json out = {{"steps", nlohmann::ordered_json::array()}};
      std::string text;
      std::vector<uint64_t> ids;
      for (uint64_t g = first.step; g < first.step + steps; ++g) {
        ids.clear();
        order.AppendBatch(g, slice, &ids);
        if (o->json) {
          out["steps"].push_back({{"step", g}, {"samples", ids}});
        } else {
          text += "step " + std::to_string(g) + ":";
          for (uint64_t id : ids) text += " " + std::to_string(id);
          text += "\n";
        }
      }
      return WriteOutput("", o->json ? out.dump() + "\n" : text);
    };
    Finish(ctx, run());
  });
}

}  // namespace tenplex::cli
