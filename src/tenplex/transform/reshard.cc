#include "tenplex/transform/reshard.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "tenplex/io/checkpoint.h"
#include "tenplex/plan/synthetic.h"
#include "tenplex/transform/executor.h"
#include "tenplex/transform/pages.h"
#include "tenplex/transform/streamed_output.h"
#include "tenplex/util/hash.h"

namespace tenplex::transform {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string StageText(const Stage& s) {
  if (s.kind == Stage::kFirst) return "first";
  if (s.kind == Stage::kLast) return "last";
  return "layer " + std::to_string(s.layer);
}

std::string RuleText(const TpRule& r) {
  switch (r.kind) {
    case TpRule::kReplicate:
      return "replicate";
    case TpRule::kSplit:
      return "split dim " + std::to_string(r.dim);
    case TpRule::kBlocks:
      return "blocks(" + std::to_string(r.blocks) + ") dim " + std::to_string(r.dim);
    case TpRule::kVocab:
      return "vocab dim " + std::to_string(r.dim) + " divisible by " +
             std::to_string(r.divisible_by);
  }
  return "?";
}

std::string TensorText(const TensorDesc& t) {
  return t.path + " " + std::string(DTypeName(t.dtype)) + " [" + ShapeToString(t.shape) + "] " +
         RuleText(t.tp) + ", stage " + StageText(t.stage);
}

template <typename Fn>
void ForEach(std::size_t n, ThreadPool* pool, Fn&& fn) {
  if (pool && n > 1) {
    pool->ParallelFor(n, fn);
  } else {
    for (std::size_t i = 0; i < n; ++i) fn(i);
  }
}

std::size_t DataBytes(const std::vector<io::SafetensorsEntry>& ts) {
  std::size_t n = 0;
  for (const io::SafetensorsEntry& e : ts) n = std::max<std::size_t>(n, e.end);
  return n;
}

void PopulateInputs(const std::vector<io::SafetensorsFile>& files, ThreadPool* pool) {
  for (const io::SafetensorsFile& f : files) {
    if (!f.tensors().empty())
      Populate(f.data(f.tensors().front()), DataBytes(f.tensors()), false, pool);
  }
}

// The xxh64 of a rank file as written (header, then data), hashed from its mapping
// where the pages are hot instead of mapping the file again.
std::string WrittenXxh64(const io::SafetensorsWriter& w, const uint8_t* data) {
  std::vector<io::SafetensorsEntry> entries = w.tensors();
  const std::string header = io::EncodeSafetensorsHeader(entries, {});
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  XXH64_update(st, header.data(), header.size());
  if (data) XXH64_update(st, data, DataBytes(entries));
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return HashHex(h);
}

// Maps an output rank file per rank of `layout` inside the writer's staging directory,
// pages populated ahead.
Result<std::vector<io::SafetensorsWriter>> CreateRankFiles(const io::CheckpointWriter& ckpt,
                                                           const Layout& layout, ThreadPool* pool) {
  std::vector<io::SafetensorsWriter> files;
  files.reserve(layout.ranks.size());
  for (const RankLayout& r : layout.ranks) {
    std::vector<io::SafetensorsEntry> entries;
    entries.reserve(r.tensors->size());
    for (const LocalTensor& t : *r.tensors) entries.push_back({t.name, t.dtype, t.shape, 0, 0});
    TP_ASSIGN_OR_RETURN(io::SafetensorsWriter w,
                        io::SafetensorsWriter::Create(ckpt.RankPath(r.rank), std::move(entries)));
    if (!w.tensors().empty()) Populate(w.data(0), DataBytes(w.tensors()), true, pool);
    files.push_back(std::move(w));
  }
  return files;
}

// Writes tenplex.json with the rank files' checksums (sums[i]: rank i's) and moves the
// directory into place.
Status CommitWithSums(io::CheckpointWriter& ckpt, io::CheckpointInfo info,
                      const std::vector<std::string>& sums) {
  nlohmann::json j = nlohmann::json::object();
  for (std::size_t i = 0; i < sums.size(); ++i) j[io::RankFileName(static_cast<int>(i))] = sums[i];
  // CheckpointWriter keeps extra fields as given: with its own hashing off, the
  // "checksums" computed here are what tenplex.json records.
  info.extra["checksums"] = std::move(j);
  return ckpt.Commit(info, /*checksums=*/false);
}

// Hashes the rank files from their mappings (in parallel), syncs and renames them,
// then writes tenplex.json with those checksums and moves the directory into place.
Status CommitAll(io::CheckpointWriter& ckpt, std::vector<io::SafetensorsWriter>& files,
                 io::CheckpointInfo info, ThreadPool* pool) {
  std::vector<std::string> sums(files.size());
  ForEach(files.size(), pool, [&](std::size_t i) {
    sums[i] = WrittenXxh64(files[i], files[i].tensors().empty() ? nullptr : files[i].data(0));
  });
  for (io::SafetensorsWriter& w : files) TP_RETURN_IF_ERROR(w.Commit());
  return CommitWithSums(ckpt, std::move(info), sums);
}

// File descriptors closed at scope exit.
struct InputFds {
  std::vector<int> fds;
  ~InputFds() {
    for (int fd : fds) ::close(fd);
  }
};

// The streamed path (streamed_output.h): pwrite from warm buffers into the rank files of
// ckpt, reading the inputs with pread from fds of their own; returns the files' checksums,
// computed on the way.
Result<std::vector<std::string>> StreamRankFiles(const plan::Plan& plan, const Layout& from,
                                                 const Layout& to,
                                                 const std::vector<io::SafetensorsFile>& inputs,
                                                 const io::CheckpointWriter& ckpt,
                                                 const StreamOptions& options) {
  std::vector<std::string> paths;
  for (const RankLayout& r : to.ranks) paths.push_back(ckpt.RankPath(r.rank));
  InputFds fds;
  std::vector<std::vector<StreamSource>> sources(from.world_size());
  for (const RankLayout& r : from.ranks) {
    const io::SafetensorsFile& f = inputs[r.rank];
    const int fd = ::open(f.path().c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) fds.fds.push_back(fd);
    for (const LocalTensor& t : *r.tensors) {
      const io::SafetensorsEntry* e = f.Find(t.name);
      sources[r.rank].push_back({f.data(*e), fd, f.header().data_offset + e->begin});
    }
  }
  return WriteRankFilesStreamed(plan, from, to, sources, paths, options);
}

// The mapped path: executes the plan from the inputs' mappings into the outputs'.
Status CopyMapped(const plan::Plan& plan, const Layout& from, const Layout& to,
                  const std::vector<io::SafetensorsFile>& inputs,
                  std::vector<io::SafetensorsWriter>& outputs, ThreadPool* pool) {
  std::vector<std::vector<const void*>> src(from.world_size());
  for (const RankLayout& r : from.ranks) {
    for (const LocalTensor& t : *r.tensors) {
      src[r.rank].push_back(inputs[r.rank].data(*inputs[r.rank].Find(t.name)));
    }
  }
  std::vector<std::vector<void*>> dst(to.world_size());
  for (const RankLayout& r : to.ranks) {
    for (std::size_t i = 0; i < r.tensors->size(); ++i)
      dst[r.rank].push_back(outputs[r.rank].data(i));
  }
  ExecuteOptions ex;
  ex.pool = pool;
  return ExecutePlan(plan, from, to, src, dst, ex);
}

}  // namespace

Status CheckSameModel(const Model& given, const Model& ckpt) {
  auto differ = [](const std::string& what) {
    return InvalidArgument("the given model does not match the checkpoint's model: " + what);
  };
  if (given.num_layers != ckpt.num_layers) {
    return differ(std::to_string(given.num_layers) + " layers, the checkpoint has " +
                  std::to_string(ckpt.num_layers));
  }
  if (given.layer_prefix != ckpt.layer_prefix) return differ("layer prefix " + given.layer_prefix);
  if (given.tensors.size() != ckpt.tensors.size()) {
    return differ(std::to_string(given.tensors.size()) + " parameters, the checkpoint has " +
                  std::to_string(ckpt.tensors.size()));
  }
  for (std::size_t i = 0; i < given.tensors.size(); ++i) {
    const TensorDesc &a = given.tensors[i], &b = ckpt.tensors[i];
    if (a.path != b.path || a.dtype != b.dtype || a.shape != b.shape || !(a.tp == b.tp) ||
        !(a.stage == b.stage)) {
      return differ("parameter " + std::to_string(i) + " is " + TensorText(a) +
                    ", the checkpoint has " + TensorText(b));
    }
  }
  if (given.aliases.size() != ckpt.aliases.size()) {
    return differ(std::to_string(given.aliases.size()) +
                  " aliases (tied weights), the checkpoint has " +
                  std::to_string(ckpt.aliases.size()));
  }
  for (std::size_t i = 0; i < given.aliases.size(); ++i) {
    const AliasDesc &a = given.aliases[i], &b = ckpt.aliases[i];
    if (a.name != b.name || a.target != b.target || !(a.stage == b.stage)) {
      return differ("alias " + a.name + " -> " + a.target + ", the checkpoint has " + b.name +
                    " -> " + b.target);
    }
  }
  if (given.optimizer.type != ckpt.optimizer.type ||
      given.optimizer.states != ckpt.optimizer.states) {
    return differ("optimizer " + given.optimizer.type + ", the checkpoint has " +
                  ckpt.optimizer.type);
  }
  return Status::Ok();
}

Result<ReshardReport> Reshard(const ReshardOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  ReshardReport report;
  TP_ASSIGN_OR_RETURN(io::CheckpointInfo info, io::ReadCheckpointInfo(o.in));
  if (o.model) {
    TP_RETURN_IF_ERROR(CheckSameModel(*o.model, info.model).WithContext(o.in));
  }
  if (o.from && !(*o.from == info.config)) {
    return InvalidArgument("checkpoint " + o.in + " is in config " + info.config.ToString() +
                           ", not " + o.from->ToString() + " as given");
  }
  report.from = info.config;
  auto from = MakeLayout(info.model, info.config);
  if (!from.ok()) return from.status().WithContext("checkpoint " + o.in);
  auto to = MakeLayout(info.model, o.to);
  if (!to.ok()) return to.status().WithContext("target config " + o.to.ToString());
  TP_ASSIGN_OR_RETURN(std::vector<io::SafetensorsFile> inputs,
                      io::OpenCheckpoint(o.in, *from, info, /*verify_checksums=*/false));
  // The streamed path reads the inputs with pread: their mappings need no pages ahead
  // unless they are hashed from them.
  if (o.verify_checksums || !o.streamed) PopulateInputs(inputs, o.pool);
  if (o.verify_checksums) {
    TP_RETURN_IF_ERROR(io::VerifyChecksums(inputs, info, o.in, o.pool));
  }

  const auto tp = std::chrono::steady_clock::now();
  TP_ASSIGN_OR_RETURN(plan::Plan plan, plan::MakePlan(info.model, *from, *to,
                                                      std::vector<int>(from->world_size(), 0),
                                                      std::vector<int>(to->world_size(), 0)));
  report.plan_seconds = Since(tp);
  report.stats = plan.stats;

  // Declared before the rank files, so that on an error the files go first, then the
  // staging directory.
  TP_ASSIGN_OR_RETURN(io::CheckpointWriter ckpt, io::CheckpointWriter::Create(o.out));
  for (const RankLayout& r : to->ranks) {
    for (const LocalTensor& t : *r.tensors) report.bytes_written += t.bytes();
  }
  io::CheckpointInfo out_info = info;
  out_info.config = o.to;
  const auto tc = std::chrono::steady_clock::now();
  if (o.streamed && CanStreamPlan(plan)) {
    TP_ASSIGN_OR_RETURN(std::vector<std::string> sums,
                        StreamRankFiles(plan, *from, *to, inputs, ckpt, o.stream));
    report.copy_seconds = Since(tc);
    report.streamed = true;
    TP_RETURN_IF_ERROR(CommitWithSums(ckpt, std::move(out_info), sums));
    report.total_seconds = Since(t0);
    return report;
  }
  TP_ASSIGN_OR_RETURN(std::vector<io::SafetensorsWriter> outputs,
                      CreateRankFiles(ckpt, *to, o.pool));
  TP_RETURN_IF_ERROR(CopyMapped(plan, *from, *to, inputs, outputs, o.pool));
  report.copy_seconds = Since(tc);
  TP_RETURN_IF_ERROR(CommitAll(ckpt, outputs, std::move(out_info), o.pool));
  report.total_seconds = Since(t0);
  return report;
}

Status InitCheckpoint(const Model& model, const ParallelConfig& config, const std::string& out,
                      uint64_t seed, ThreadPool* pool) {
  TP_ASSIGN_OR_RETURN(Layout layout, MakeLayout(model, config));
  TP_ASSIGN_OR_RETURN(io::CheckpointWriter ckpt, io::CheckpointWriter::Create(out));
  TP_ASSIGN_OR_RETURN(std::vector<io::SafetensorsWriter> files,
                      CreateRankFiles(ckpt, layout, pool));
  for (const RankLayout& r : layout.ranks) {
    for (std::size_t i = 0; i < r.tensors->size(); ++i) {
      TP_RETURN_IF_ERROR(
          plan::FillSynthetic(layout, (*r.tensors)[i], seed, files[r.rank].data(i), pool));
    }
  }
  io::CheckpointInfo info;
  info.model = model;
  info.config = config;
  info.extra["synthetic_seed"] = seed;
  return CommitAll(ckpt, files, std::move(info), pool);
}

Status VerifyCheckpoint(const std::string& dir, std::optional<uint64_t> seed, ThreadPool* pool) {
  TP_ASSIGN_OR_RETURN(io::CheckpointInfo info, io::ReadCheckpointInfo(dir));
  if (!seed) {
    const auto& s = info.extra["synthetic_seed"];
    if (!s.is_number_unsigned() && !s.is_number_integer()) {
      return InvalidArgument(dir + "/tenplex.json records no synthetic_seed; give the seed");
    }
    seed = s.get<uint64_t>();
  }
  auto layout = MakeLayout(info.model, info.config);
  if (!layout.ok()) return layout.status().WithContext("checkpoint " + dir);
  TP_ASSIGN_OR_RETURN(std::vector<io::SafetensorsFile> files,
                      io::OpenCheckpoint(dir, *layout, info, /*verify_checksums=*/false));
  PopulateInputs(files, pool);
  TP_RETURN_IF_ERROR(io::VerifyChecksums(files, info, dir, pool));
  for (const RankLayout& r : layout->ranks) {
    for (const LocalTensor& t : *r.tensors) {
      const io::SafetensorsFile& f = files[r.rank];
      Status s = plan::CheckSynthetic(*layout, t, *seed, f.data(*f.Find(t.name)), pool);
      if (!s.ok()) return s.WithContext(f.path());
    }
  }
  return Status::Ok();
}

}  // namespace tenplex::transform
