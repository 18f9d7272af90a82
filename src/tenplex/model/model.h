// A generic model description: the global tensors of a parallelizable tensor
// collection (PTC) and, for each, how tensor parallelism slices it and which pipeline
// stage holds it. Nothing here knows about GPT; the GPT generator (gpt.h) is one
// producer of descriptions, and the layouts and the planner read only this.
//
// JSON form ("format": "tenplex.model.v1"):
//   {"format": "tenplex.model.v1", "name": "gpt", "num_layers": 2,
//    "layer_prefix": "decoder.layers.",
//    "tensors": [{"path": "...", "dtype": "F32", "shape": [8, 4],
//                 "tp": {"rule": "replicate"} | {"rule": "split", "dim": 1}
//                       | {"rule": "split", "dim": 0, "granule": 24, "granule_name": "query
//                       groups"} | {"rule": "blocks", "dim": 0, "blocks": 2} | {"rule": "vocab",
//                       "dim": 0, "divisible_by": 128},
//                 "stage": "first" | "last" | {"layer": 3}}, ...],
//    "aliases": [{"name": "output_layer.weight", "target": "embedding.word_embeddings.weight",
//                 "stage": "last"}],
//    "optimizer": {"type": "adam", "states": ["exp_avg", "exp_avg_sq"]}}
//
// Local names: a tensor on {"layer": i} has a path starting with layer_prefix + "i.";
// a stage renumbers i from 0 (spec §4). An alias is a local replica of its target held
// by the alias's stage when that stage does not already hold the target (the tied
// output embedding on the last stage when pp > 1).
//
// Optimizer companions (spec §5): for every parameter p and state s, a global F32
// tensor "optimizer.<s>.<p>" of p's shape and slicing; and "optimizer.fp32_param.<p>"
// for parameters whose dtype is not F32.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tenplex/geometry/box.h"
#include "tenplex/geometry/dtype.h"
#include "tenplex/util/status.h"

namespace tenplex {

struct TpRule {
  enum Kind { kReplicate, kSplit, kBlocks, kVocab };
  Kind kind = kReplicate;
  int dim = 0;
  int blocks = 1;            // kBlocks: number of equal blocks along dim
  int64_t granule = 1;       // kSplit: each part must be a multiple of this many rows
  std::string granule_name;  // for error messages ("query groups")
  int64_t divisible_by = 1;  // kVocab: m in Vp = ceil(V / (m*tp)) * m*tp
  friend bool operator==(const TpRule&, const TpRule&) = default;
};

struct Stage {
  enum Kind { kFirst, kLast, kLayer };
  Kind kind = kFirst;
  int layer = 0;
  friend bool operator==(const Stage&, const Stage&) = default;
};

struct TensorDesc {
  std::string path;
  DType dtype = DType::kF32;
  Shape shape;
  TpRule tp;
  Stage stage;
};

struct AliasDesc {
  std::string name;    // local name of the replica
  std::string target;  // global path it replicates
  Stage stage;
};

struct OptimizerDesc {
  std::string type = "none";        // "adam" or "none"
  std::vector<std::string> states;  // {"exp_avg", "exp_avg_sq"} for adam
};

struct Model {
  std::string name;
  int num_layers = 0;
  std::string layer_prefix = "decoder.layers.";
  std::vector<TensorDesc> tensors;  // parameters, in the order of spec §2
  std::vector<AliasDesc> aliases;
  OptimizerDesc optimizer;
  std::map<std::string, std::string> info;  // free-form (hyper-parameters), kept as given

  // Index of the parameter with this path, or -1.
  int Find(const std::string& path) const;
};

// A global tensor of the PTC: a parameter or an optimizer companion of one.
struct GlobalTensor {
  std::string name;   // "decoder.layers.0.mlp.linear_fc1.weight", "optimizer.exp_avg.<p>"
  std::string param;  // the parameter it belongs to (== name for parameters)
  std::string kind;   // "param", or the state name ("exp_avg", "fp32_param")
  DType dtype;
  Shape shape;
};

// The optimizer companion kinds of a parameter of dtype d, in order: states, then
// "fp32_param" when d != F32.
std::vector<std::string> CompanionKinds(const Model& model, DType param_dtype);
// "optimizer.<kind>.<param>"
std::string CompanionName(const std::string& kind, const std::string& param);
// All global tensors: parameters in order, then companions by kind then parameter.
std::vector<GlobalTensor> GlobalTensors(const Model& model);
// Total bytes of all global tensors (no padding).
int64_t GlobalBytes(const Model& model);

// Checks the description: unique paths, known stages, layers in range, tp dims in
// range, shapes non-negative, aliases pointing at existing tensors of the same shape.
Status Validate(const Model& model);

Result<Model> ModelFromJson(const std::string& text);
std::string ModelToJson(const Model& model, int indent = 2);
// Reads a model from a file, or builds a preset when spec is "preset:NAME" or a bare
// preset name that is not a file.
Result<Model> LoadModel(const std::string& spec);

}  // namespace tenplex
