// tenplex import --from dcp|megatron|hf SRC --model M --config C --out CKPT
// tenplex export --to dcp|megatron|hf CKPT --out DIR [--config C] [--max-shard-size B]
// (both: [--json])
// (docs/interop.md). The format work is done by the Python helper (interop/helper.h);
// this file checks the arguments first and the imported checkpoint afterwards.
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "tenplex/cli/command.h"
#include "tenplex/interop/helper.h"
#include "tenplex/io/checkpoint.h"
#include "tenplex/model/model.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/store/parse.h"
#include "tenplex/util/file.h"
#include "tenplex/util/log.h"

namespace tenplex::cli {
namespace {

namespace fs = std::filesystem;

std::string SelfExe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "tenplex" : p.string();
}

Status CheckFormat(const std::string& f) {
  for (const char* k : interop::kFormats) {
    if (f == k) return Status::Ok();
  }
  return InvalidArgument("unknown format '" + f +
                         "' (formats: dcp, megatron, hf, ds-universal, mcore)");
}

Status CheckTarget(const std::string& out) {
  std::error_code ec;
  if (fs::exists(out, ec) && (!fs::is_directory(out, ec) || !fs::is_empty(out, ec))) {
    return AlreadyExists(out + " exists and is not an empty directory (nothing is overwritten)");
  }
  return Status::Ok();
}

// Runs the helper and maps its exit status: 0 ok; 2 (bad input) and 1 were reported
// by the helper itself, so only the code is passed on.
int Run(const std::vector<std::string>& args) {
  auto rc = interop::RunHelper(args);
  if (!rc.ok()) return Fail(rc.status());
  return *rc == 0 ? 0 : (*rc == 2 ? 2 : 1);
}

// The helper prints one line on success: JSON with --json, else a sentence (none with
// -q).
std::vector<std::string> OutputArgs(std::vector<std::string> args, bool json) {
  if (json) {
    args.push_back("--json");
  } else if (GetLogLevel() == LogLevel::kQuiet) {
    args.push_back("--quiet");
  }
  return args;
}

struct ImportOpts {
  std::string from, src, model, config, out;
  int64_t step = -1, samples = -1;
  bool json = false;
};

int Import(const ImportOpts& o) {
  if (Status s = CheckFormat(o.from); !s.ok()) return Fail(s);
  auto m = LoadModel(o.model);
  if (!m.ok()) return Fail(m.status());
  auto c = ParseConfig(o.config);
  if (!c.ok()) return Fail(c.status());
  auto l = MakeLayout(*m, *c);
  if (!l.ok()) return Fail(l.status());
  if (Status s = CheckTarget(o.out); !s.ok()) return Fail(s);
  std::error_code ec;
  if (!fs::exists(o.src, ec)) return Fail(NotFound(o.src + " does not exist"));
  // The helper reads the model as a file (a preset name becomes its JSON).
  char tmpl[] = "/tmp/tenplex-import-model-XXXXXX";
  int fd = ::mkstemp(tmpl);
  if (fd < 0) return Fail(ErrnoError("mkstemp", errno));
  ::close(fd);
  const std::string model_file = tmpl;
  if (Status s = WriteFileAtomic(model_file, ModelToJson(*m)); !s.ok()) return Fail(s);
  std::vector<std::string> args = {"import",       "--from",   o.from,      o.src,
                                   "--model-file", model_file, "--config",  c->ToString(),
                                   "--out",        o.out,      "--tenplex", SelfExe()};
  if (o.step >= 0) args.insert(args.end(), {"--step", std::to_string(o.step)});
  if (o.samples >= 0) args.insert(args.end(), {"--samples", std::to_string(o.samples)});
  int rc = Run(OutputArgs(std::move(args), o.json));
  ::unlink(model_file.c_str());
  if (rc != 0) return rc;
  // The new checkpoint against our own layout: every file, tensor, dtype and shape,
  // and the checksums when recorded.
  auto info = io::ReadCheckpointInfo(o.out);
  if (!info.ok())
    return Fail(Internal("the imported checkpoint is unreadable: " + info.status().message()));
  auto opened =
      io::OpenCheckpoint(o.out, *l, *info, /*verify_checksums=*/true, &ThreadPool::Default());
  if (!opened.ok())
    return Fail(Internal("the imported checkpoint does not match its layout: " +
                         opened.status().message()));
  return 0;
}

struct ExportOpts {
  std::string to, src, out, config;
  std::string max_shard_size = "5e9";  // a size as every size option takes (ParseByteSize)
  bool no_verify = false, json = false;
};

int Export(const ExportOpts& o) {
  if (Status s = CheckFormat(o.to); !s.ok()) return Fail(s);
  if (o.to == "ds-universal")
    return Fail(InvalidArgument(
        "export --to ds-universal is not supported (import only); export --to dcp or hf"));
  auto info = io::ReadCheckpointInfo(o.src);
  if (!info.ok()) return Fail(info.status());
  auto l = MakeLayout(info->model, info->config);
  if (!l.ok()) return Fail(l.status());
  if (auto opened = io::OpenCheckpoint(o.src, *l, *info, /*verify_checksums=*/!o.no_verify,
                                       &ThreadPool::Default());
      !opened.ok())
    return Fail(opened.status());
  std::string config;
  if (!o.config.empty()) {
    auto c = ParseConfig(o.config);
    if (!c.ok()) return Fail(c.status());
    if (Status s = ValidateConfig(info->model, *c); !s.ok()) return Fail(s);
    if (o.to == "megatron" && (c->dp != 1 || c->zero)) {
      return Fail(InvalidArgument(
          "--config for megatron gives tp and pp (and layers=) only: Megatron files "
          "hold one data-parallel replica and no ZeRO shards"));
    }
    config = c->ToString();
  }
  if (o.to == "hf" && !o.config.empty())
    return Fail(InvalidArgument("--config does not apply to --to hf"));
  auto shard = store::ParseByteSize(o.max_shard_size);
  if (!shard.ok()) return Fail(shard.status().WithContext("--max-shard-size"));
  if (*shard < 1) return Fail(InvalidArgument("--max-shard-size must be >= 1 byte"));
  if (Status s = CheckTarget(o.out); !s.ok()) return Fail(s);
  return Run(OutputArgs({"export", "--to", o.to, o.src, "--out", o.out, "--tenplex", SelfExe(),
                         "--config", config, "--max-shard-size", std::to_string(*shard)},
                        o.json));
}

}  // namespace

void RegisterInterop(CLI::App& app, Context& ctx) {
  auto* imp = app.add_subcommand(
      "import",
      "Convert a PyTorch DCP, Megatron-LM or Hugging Face checkpoint into a tenplex checkpoint");
  auto io = std::make_shared<ImportOpts>();
  imp->add_option("--from", io->from, "Source format: dcp, megatron, hf, ds-universal or mcore")
      ->required();
  imp->add_option("src", io->src, "Source directory")->required();
  imp->add_option("--model", io->model, "Model JSON file or preset name")->required();
  imp->add_option("--config", io->config, "Parallel config of the new checkpoint, e.g. tp=2,pp=2")
      ->required();
  imp->add_option("--out", io->out, "New checkpoint directory (must not exist)")->required();
  imp->add_option("--step", io->step,
                  "Training step to record (default: the source's; 0 when it has none)");
  imp->add_option("--samples", io->samples,
                  "Samples consumed to record (default: from the source)");
  imp->add_flag("--json", io->json, "Print the result as JSON");
  imp->callback([io, &ctx] { ctx.exit_code = Import(*io); });

  auto* exp = app.add_subcommand(
      "export",
      "Convert a tenplex checkpoint into a PyTorch DCP, Megatron-LM or Hugging Face checkpoint");
  auto eo = std::make_shared<ExportOpts>();
  exp->add_option("--to", eo->to, "Target format: dcp, megatron, hf or mcore")->required();
  exp->add_option("src", eo->src, "tenplex checkpoint directory")->required();
  exp->add_option("--out", eo->out, "Output directory (must not exist)")->required();
  exp->add_option(
      "--config", eo->config,
      "megatron: target tp/pp (default: the checkpoint's); dcp: must be the checkpoint's own; "
      "mcore: its tp sets the vocabulary padding (default: the checkpoint's)");
  exp->add_option("--max-shard-size", eo->max_shard_size,
                  "hf: bytes per safetensors file before sharding with an index (e.g. 5e9, "
                  "5GB, 2GiB)")
      ->capture_default_str();
  exp->add_flag("--json", eo->json, "Print the result as JSON");
  exp->add_flag("--no-verify", eo->no_verify,
                "Export even without checksums in tenplex.json (they are required and checked)");
  exp->callback([eo, &ctx] { ctx.exit_code = Export(*eo); });
}

}  // namespace tenplex::cli
