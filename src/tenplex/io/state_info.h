// The info of a version of a job's state: the one typed owner of the JSON object that
// the store keeps as a version's info (store::VersionInfo::info) and that every
// writer of state (`tenplex run`, `store load`, transforms) fills in:
//
//   {"model": <model JSON>, "config": "tp=2,pp=2,dp=1",
//    "step": 24, "samples_consumed": 192, <other training fields>,
//    "cluster": {"hosts": [...], "gpus_per_host": K,    where the ranks live
//                "host_ids": [...]},                    (the hosts' ids: placement.h)
//    "source": "/ckpt/dir",                             the checkpoint it was loaded from
//    "safetensors": {"rank-00000.safetensors": {"metadata": {...}, "order": [...]}}}
//
// "model" and "config" are required; everything else is kept verbatim and carried
// from version to version (a transform changes only "config" and "cluster"). The
// elastic Python API (tenplex.elastic) also commits infos of a user's own model that
// have no "model": Parse reads those with ModelRequired::kNo (model() is then empty and
// has_model() false); whatever needs the model (a transform, a checkpoint) refuses them.
//
// A checkpoint directory's tenplex.json (spec §7) holds the same training fields:
// loading one copies each of its fields (but model, config and checksums) into the
// info, saving a version writes every info field back, except the store's bookkeeping
// ("cluster", "source", "safetensors"). A tenplex.json field that happens to carry one
// of those names is parked under "shadowed_fields" and restored on save, so every
// field survives a load/save round trip in both directions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tenplex/io/checkpoint.h"
#include "tenplex/io/placement.h"
#include "tenplex/model/model.h"
#include "tenplex/ptc/config.h"
#include "tenplex/util/status.h"

namespace tenplex::io {

class StateInfo {
 public:
  enum class ModelRequired { kYes, kNo };
  // Parses a version's info (InvalidArgument naming what is missing or malformed).
  static Result<StateInfo> Parse(const std::string& text,
                                 ModelRequired model_required = ModelRequired::kYes);
  // A new info of a model in a config, with no other fields.
  static StateInfo Make(const Model& model, const ParallelConfig& config);
  // The info of a checkpoint directory's tenplex.json, loaded from `source`.
  static StateInfo FromCheckpoint(const CheckpointInfo& checkpoint, const std::string& source);

  const Model& model() const { return model_; }
  // False only for an info parsed with ModelRequired::kNo that has no "model".
  bool has_model() const { return json_.contains("model"); }
  const ParallelConfig& config() const { return config_; }
  // Where the ranks live (nullopt: not recorded, e.g. a single store).
  const std::optional<Cluster>& placement() const { return placement_; }
  // Training position; nullopt when the info has none.
  std::optional<int64_t> step() const { return Int("step"); }
  std::optional<int64_t> samples_consumed() const { return Int("samples_consumed"); }
  // Any field (null when absent).
  const nlohmann::json& field(const std::string& name) const;

  // The training position a run continues from: FailedPrecondition naming `what` (e.g.
  // "version 3 of job 'j'") when "step" is missing or negative ("... has no step in its
  // info (no training position)"), or "samples_consumed" is negative.
  struct Position {
    int64_t step = 0;
    std::optional<int64_t> samples_consumed;  // nullopt: not recorded
  };
  Result<Position> ResumePosition(const std::string& what) const;

  void set_config(const ParallelConfig& config);
  void set_placement(const Cluster& cluster);
  void set_step(int64_t step) { json_["step"] = step; }
  void set_samples_consumed(int64_t samples) { json_["samples_consumed"] = samples; }
  void set_field(const std::string& name, nlohmann::json value);

  // The JSON text the store keeps.
  std::string ToJson() const { return json_.dump(); }
  // The same as an object (a hand-off file: the info plus the ranks' files).
  const nlohmann::json& AsJson() const { return json_; }
  // tenplex.json of a checkpoint of this state (checksums are added by the writer).
  CheckpointInfo ToCheckpoint() const;

 private:
  std::optional<int64_t> Int(const char* name) const;
  nlohmann::json json_ = nlohmann::json::object();
  Model model_;
  ParallelConfig config_;
  std::optional<Cluster> placement_;
};

// The version's info, or FailedPrecondition naming the job and version (a version not
// written by tenplex: no model and config).
Result<StateInfo> ParseStateInfo(const std::string& job, uint64_t version, const std::string& text);

}  // namespace tenplex::io

// The names the transform and cluster code use unqualified (they live in tenplex::transform
// and tenplex::cluster).
namespace tenplex::transform {
using io::ParseStateInfo;
using io::StateInfo;
}  // namespace tenplex::transform
namespace tenplex::cluster {
using io::ParseStateInfo;
using io::StateInfo;
}  // namespace tenplex::cluster
