// tenplex data index --input PATH --format jsonl|megatron -o DIR
#include <nlohmann/json.hpp>

#include "tenplex/cli/data_commands.h"
#include "tenplex/data/dataset.h"
#include "tenplex/util/log.h"

namespace tenplex::cli {

void RegisterDataIndex(CLI::App& data, Context& ctx) {
  auto* cmd = data.add_subcommand("index", "Build a dataset index directory (validates the input)");
  struct Opts {
    std::string input, format, out;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--input", o->input,
                  "JSONL file, or Megatron PREFIX (or PREFIX.bin / PREFIX.idx)")
      ->required();
  cmd->add_option("--format", o->format, "jsonl or megatron")->required();
  cmd->add_option("-o,--output", o->out, "Index directory to write")->required();
  cmd->add_flag("--json", o->json, "Print the result as JSON");
  cmd->callback([o, &ctx] {
    auto format = data::ParseDataFormat(o->format);
    if (!format.ok()) return Finish(ctx, format.status());
    Progress progress("data index");
    Status s = data::BuildIndex(o->input, *format, o->out);
    progress.Done();
    if (!s.ok()) return Finish(ctx, s);
    auto d = data::Dataset::Open(o->out);
    if (!d.ok()) return Finish(ctx, d.status());
    if (o->json) {
      nlohmann::json j = {{"index", o->out},
                          {"format", std::string(data::DataFormatName(*format))},
                          {"num_samples", (*d)->num_samples()}};
      return Finish(ctx, WriteOutput("", j.dump() + "\n"));
    }
    if (GetLogLevel() == LogLevel::kQuiet) return Finish(ctx, Status::Ok());
    std::printf("indexed %llu samples (%s) into %s\n",
                static_cast<unsigned long long>((*d)->num_samples()),
                std::string(data::DataFormatName(*format)).c_str(), o->out.c_str());
    Finish(ctx, Status::Ok());
  });
}

}  // namespace tenplex::cli
