// Offline resharding of checkpoint directories (spec §7), and synthetic checkpoints
// to test it with.
//
// Reshard reads tenplex.json and every rank file of the input (validated against the
// layout before anything is written), plans the move with every rank on one host (so
// every op is a local copy from a mapped input file), writes each output rank file
// with pwrite from warm buffers, hashing on the way (streamed_output.h), inside
// CheckpointWriter's staging directory, and commits tenplex.json last. Inputs
// are read through mmap; no global tensor is ever built. On any error the staging
// directory is removed, so no partial output directory is left.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tenplex/model/model.h"
#include "tenplex/plan/planner.h"
#include "tenplex/ptc/config.h"
#include "tenplex/transform/streamed_output.h"
#include "tenplex/util/status.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::transform {

struct ReshardOptions {
  std::string in;
  std::string out;
  ParallelConfig to;
  std::optional<Model> model;          // when set, must match the checkpoint's model
  std::optional<ParallelConfig> from;  // when set, must match the checkpoint's config
  bool verify_checksums = true;        // hash input files against tenplex.json first
  // Write the output with pwrite from warm buffers (streamed_output.h) when the plan
  // allows; false: fill mapped output files (the path before; the tests compare both).
  bool streamed = true;
  StreamOptions stream;
  ThreadPool* pool = nullptr;
};

struct ReshardReport {
  ParallelConfig from;
  plan::PlanStats stats;
  int64_t bytes_written = 0;  // tensor bytes of the output, padding included
  bool streamed = false;      // written by the streamed output path
  double plan_seconds = 0;
  double copy_seconds = 0;
  double total_seconds = 0;
};

Result<ReshardReport> Reshard(const ReshardOptions& options);

// InvalidArgument naming the first structural difference (tensors, shapes, dtypes,
// slicing, stages, aliases, optimizer); names and free-form info are ignored.
Status CheckSameModel(const Model& given, const Model& checkpoint);

// Writes a checkpoint of `model` in `config` whose content is synthetic (synthetic.h)
// for `seed`; tenplex.json records "synthetic_seed".
Status InitCheckpoint(const Model& model, const ParallelConfig& config, const std::string& out,
                      uint64_t seed, ThreadPool* pool = nullptr);

// Checks every element of a checkpoint against the synthetic content for `seed`
// (default: tenplex.json's "synthetic_seed"), padding zero, checksums verified.
Status VerifyCheckpoint(const std::string& dir, std::optional<uint64_t> seed,
                        ThreadPool* pool = nullptr);

}  // namespace tenplex::transform
