// tenplex data read --index DIR --sample N [--sample M ...] [--json]
#include <nlohmann/json.hpp>

#include "tenplex/cli/data_commands.h"
#include "tenplex/data/dataset.h"

namespace tenplex::cli {

void RegisterDataRead(CLI::App& data, Context& ctx) {
  auto* cmd = data.add_subcommand("read",
                                  "Print samples: the JSONL line as it was, or a Megatron sequence "
                                  "as a JSON array of token ids");
  struct Opts {
    std::string index;
    std::vector<int64_t> samples;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--index", o->index, "Index directory (tenplex data index)")->required();
  cmd->add_option("--sample", o->samples,
                  "Sample id (0-based); repeat for several, printed one per line")
      ->required();
  cmd->add_flag("--json", o->json,
                "One JSON object per line: {\"sample\", \"bytes\", \"text\"} (JSONL: the line as "
                "a string) or {\"sample\", \"bytes\", \"tokens\"} (Megatron)");
  cmd->callback([o, &ctx] {
    auto d = data::Dataset::Open(o->index);
    if (!d.ok()) return Finish(ctx, d.status());
    std::string out;
    for (int64_t id : o->samples) {
      auto n = CheckCount("--sample", id, /*zero_ok=*/true);
      if (!n.ok()) return Finish(ctx, n.status());
      auto text = (*d)->SampleText(*n);
      if (!text.ok()) return Finish(ctx, text.status());
      if (o->json) {
        nlohmann::json j = {{"sample", *n}, {"bytes", (*d)->SampleBytes(*n)}};
        if ((*d)->jsonl()) {
          j["text"] = *text;
        } else {
          j["tokens"] = nlohmann::json::parse(*text);  // our own "[1,2,3]"
        }
        // A JSONL line that is not UTF-8 is printed with U+FFFD, not refused.
        out += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      } else {
        out += *text;
      }
      out += '\n';
    }
    Finish(ctx, WriteOutput("", out));
  });
}

}  // namespace tenplex::cli
