// tenplex data index --input PATH --format jsonl|megatron -o DIR
#include "tenplex/cli/data_commands.h"
#include "tenplex/data/dataset.h"

namespace tenplex::cli {

void RegisterDataIndex(CLI::App& data, Context& ctx) {
  auto* cmd = data.add_subcommand("index", "Build a dataset index directory (validates the input)");
  struct Opts {
    std::string input, format, out;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--input", o->input,
                  "JSONL file, or Megatron PREFIX (or PREFIX.bin / PREFIX.idx)")
      ->required();
  cmd->add_option("--format", o->format, "jsonl or megatron")->required();
  cmd->add_option("-o,--output", o->out, "Index directory to write")->required();
  cmd->callback([o, &ctx] {
    auto format = data::ParseDataFormat(o->format);
    if (!format.ok()) return Finish(ctx, format.status());
    Status s = data::BuildIndex(o->input, *format, o->out);
    if (!s.ok()) return Finish(ctx, s);
    auto d = data::Dataset::Open(o->out);
    if (!d.ok()) return Finish(ctx, d.status());
    std::printf("indexed %llu samples (%s) into %s\n",
                static_cast<unsigned long long>((*d)->num_samples()),
                std::string(data::DataFormatName(*format)).c_str(), o->out.c_str());
    Finish(ctx, Status::Ok());
  });
}

}  // namespace tenplex::cli
