#include "tenplex/model/model.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <set>

#include "tenplex/model/gpt.h"
#include "tenplex/util/file.h"
#include "tenplex/util/json_depth.h"

namespace tenplex {

using nlohmann::json;

int Model::Find(const std::string& path) const {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].path == path) return static_cast<int>(i);
  }
  return -1;
}

std::vector<std::string> CompanionKinds(const Model& model, DType param_dtype) {
  std::vector<std::string> kinds;
  if (model.optimizer.type == "none") return kinds;
  kinds = model.optimizer.states;
  if (param_dtype != DType::kF32) kinds.push_back("fp32_param");
  return kinds;
}

std::string CompanionName(const std::string& kind, const std::string& param) {
  return "optimizer." + kind + "." + param;
}

std::vector<GlobalTensor> GlobalTensors(const Model& model) {
  std::vector<GlobalTensor> out;
  for (const TensorDesc& t : model.tensors)
    out.push_back({t.path, t.path, "param", t.dtype, t.shape});
  if (model.optimizer.type == "none") return out;
  std::vector<std::string> kinds = model.optimizer.states;
  kinds.push_back("fp32_param");
  for (const std::string& kind : kinds) {
    for (const TensorDesc& t : model.tensors) {
      auto ck = CompanionKinds(model, t.dtype);
      if (std::find(ck.begin(), ck.end(), kind) == ck.end()) continue;
      out.push_back({CompanionName(kind, t.path), t.path, kind, DType::kF32, t.shape});
    }
  }
  return out;
}

int64_t GlobalBytes(const Model& model) {
  int64_t total = 0;
  for (const GlobalTensor& g : GlobalTensors(model)) {
    total += Volume(g.shape) * static_cast<int64_t>(DTypeSize(g.dtype));
  }
  return total;
}

namespace {

std::string StageName(const Stage& s) {
  if (s.kind == Stage::kFirst) return "first";
  if (s.kind == Stage::kLast) return "last";
  return "layer " + std::to_string(s.layer);
}

Status ValidateStage(const Model& model, const Stage& s, const std::string& path) {
  if (s.kind == Stage::kLayer) {
    if (s.layer < 0 || s.layer >= model.num_layers) {
      return InvalidArgument("tensor " + path + " is placed on layer " + std::to_string(s.layer) +
                             " but the model has " + std::to_string(model.num_layers) + " layers");
    }
    std::string prefix = model.layer_prefix + std::to_string(s.layer) + ".";
    if (path.rfind(prefix, 0) != 0) {
      return InvalidArgument("tensor " + path + " is on layer " + std::to_string(s.layer) +
                             " but its path does not start with '" + prefix + "'");
    }
  }
  return Status::Ok();
}

}  // namespace

Status Validate(const Model& model) {
  if (model.num_layers < 0) return InvalidArgument("num_layers must be >= 0");
  if (model.tensors.empty()) return InvalidArgument("the model has no tensors");
  std::set<std::string> seen;
  for (const TensorDesc& t : model.tensors) {
    if (t.path.empty()) return InvalidArgument("a tensor has an empty path");
    if (!seen.insert(t.path).second) return InvalidArgument("duplicate tensor path " + t.path);
    TP_RETURN_IF_ERROR(CheckedVolume(t.shape, static_cast<int64_t>(DTypeSize(t.dtype)))
                           .status()
                           .WithContext("tensor " + t.path));
    TP_RETURN_IF_ERROR(ValidateStage(model, t.stage, t.path));
    const TpRule& r = t.tp;
    if (r.kind != TpRule::kReplicate) {
      if (r.dim < 0 || r.dim >= static_cast<int>(t.shape.size())) {
        return InvalidArgument("tensor " + t.path + " has tp dim " + std::to_string(r.dim) +
                               " but rank " + std::to_string(t.shape.size()));
      }
      if ((r.kind == TpRule::kBlocks || r.kind == TpRule::kVocab) && r.dim != 0) {
        return InvalidArgument("tensor " + t.path + ": blocks and vocab rules split dim 0 only");
      }
    }
    if (r.kind == TpRule::kBlocks && (r.blocks < 1 || t.shape[0] % r.blocks != 0)) {
      return InvalidArgument("tensor " + t.path + ": dim 0 (" + std::to_string(t.shape[0]) +
                             ") is not " + std::to_string(r.blocks) + " equal blocks");
    }
    if (r.kind == TpRule::kSplit && r.granule < 1) {
      return InvalidArgument("tensor " + t.path + ": split granule must be >= 1");
    }
    if (r.kind == TpRule::kVocab && r.divisible_by < 1) {
      return InvalidArgument("tensor " + t.path + ": divisible_by must be >= 1");
    }
  }
  for (const AliasDesc& a : model.aliases) {
    int i = model.Find(a.target);
    if (i < 0) return InvalidArgument("alias " + a.name + " targets unknown tensor " + a.target);
    if (a.stage.kind == Stage::kLayer) {
      return InvalidArgument("alias " + a.name + " must be on stage first or last");
    }
    if (seen.count(a.name)) return InvalidArgument("alias " + a.name + " collides with a tensor");
  }
  if (model.optimizer.type != "none" && model.optimizer.type != "adam") {
    return InvalidArgument("unknown optimizer type '" + model.optimizer.type +
                           "' (expected adam or none)");
  }
  return Status::Ok();
}

namespace {

json StageToJson(const Stage& s) {
  if (s.kind == Stage::kLayer) return json{{"layer", s.layer}};
  return StageName(s);
}

Result<Stage> StageFromJson(const json& j, const std::string& where) {
  if (j.is_string()) {
    std::string v = j.get<std::string>();
    if (v == "first") return Stage{Stage::kFirst, 0};
    if (v == "last") return Stage{Stage::kLast, 0};
  } else if (j.is_object() && j.contains("layer") && j["layer"].is_number_integer()) {
    return Stage{Stage::kLayer, j["layer"].get<int>()};
  }
  return InvalidArgument(where + ": stage must be \"first\", \"last\" or {\"layer\": i}");
}

json RuleToJson(const TpRule& r) {
  switch (r.kind) {
    case TpRule::kReplicate:
      return {{"rule", "replicate"}};
    case TpRule::kSplit: {
      json j = {{"rule", "split"}, {"dim", r.dim}};
      if (r.granule != 1) {
        j["granule"] = r.granule;
        j["granule_name"] = r.granule_name;
      }
      return j;
    }
    case TpRule::kBlocks:
      return {{"rule", "blocks"}, {"dim", r.dim}, {"blocks", r.blocks}};
    case TpRule::kVocab:
      return {{"rule", "vocab"}, {"dim", r.dim}, {"divisible_by", r.divisible_by}};
  }
  return {};
}

template <typename T>
Result<T> Get(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) {
    return InvalidArgument(where + ": missing field '" + key + "'");
  }
  const json& v = j[key];
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return InvalidArgument(where + ": field '" + key + "' must be a string");
  } else {
    if (!v.is_number_integer()) {
      return InvalidArgument(where + ": field '" + key + "' must be an integer");
    }
  }
  return v.get<T>();
}

Result<TpRule> RuleFromJson(const json& j, const std::string& where) {
  TpRule r;
  TP_ASSIGN_OR_RETURN(std::string rule, Get<std::string>(j, "rule", where + ".tp"));
  if (rule == "replicate") return r;
  if (rule != "split" && rule != "blocks" && rule != "vocab") {
    return InvalidArgument(where + ": unknown tp rule '" + rule +
                           "' (expected replicate, split, blocks or vocab)");
  }
  TP_ASSIGN_OR_RETURN(r.dim, Get<int>(j, "dim", where + ".tp"));
  if (rule == "split") {
    r.kind = TpRule::kSplit;
    if (j.contains("granule")) {
      TP_ASSIGN_OR_RETURN(r.granule, Get<int64_t>(j, "granule", where + ".tp"));
      if (j.contains("granule_name")) {
        TP_ASSIGN_OR_RETURN(r.granule_name, Get<std::string>(j, "granule_name", where + ".tp"));
      }
    }
  } else if (rule == "blocks") {
    r.kind = TpRule::kBlocks;
    TP_ASSIGN_OR_RETURN(r.blocks, Get<int>(j, "blocks", where + ".tp"));
  } else {
    r.kind = TpRule::kVocab;
    TP_ASSIGN_OR_RETURN(r.divisible_by, Get<int64_t>(j, "divisible_by", where + ".tp"));
  }
  return r;
}

}  // namespace

std::string ModelToJson(const Model& m, int indent) {
  json j;
  j["format"] = "tenplex.model.v1";
  j["name"] = m.name;
  j["num_layers"] = m.num_layers;
  j["layer_prefix"] = m.layer_prefix;
  if (!m.info.empty()) j["info"] = m.info;
  json ts = json::array();
  for (const TensorDesc& t : m.tensors) {
    ts.push_back({{"path", t.path},
                  {"dtype", std::string(DTypeName(t.dtype))},
                  {"shape", t.shape},
                  {"tp", RuleToJson(t.tp)},
                  {"stage", StageToJson(t.stage)}});
  }
  j["tensors"] = ts;
  json as = json::array();
  for (const AliasDesc& a : m.aliases) {
    as.push_back({{"name", a.name}, {"target", a.target}, {"stage", StageToJson(a.stage)}});
  }
  j["aliases"] = as;
  j["optimizer"] = {{"type", m.optimizer.type}, {"states", m.optimizer.states}};
  return j.dump(indent) + "\n";
}

Result<Model> ModelFromJson(const std::string& text) {
  TP_RETURN_IF_ERROR(CheckJsonDepth(text, "model description"));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("model description is not valid JSON");
  if (!j.is_object()) return InvalidArgument("model description must be a JSON object");
  if (j.contains("format") && j["format"] != "tenplex.model.v1") {
    return InvalidArgument("unknown model format " + j["format"].dump() +
                           " (expected \"tenplex.model.v1\")");
  }
  Model m;
  if (j.contains("name")) {
    TP_ASSIGN_OR_RETURN(m.name, Get<std::string>(j, "name", "model"));
  }
  TP_ASSIGN_OR_RETURN(m.num_layers, Get<int>(j, "num_layers", "model"));
  if (j.contains("layer_prefix")) {
    TP_ASSIGN_OR_RETURN(m.layer_prefix, Get<std::string>(j, "layer_prefix", "model"));
  }
  if (j.contains("info") && j["info"].is_object()) {
    for (auto& [k, v] : j["info"].items())
      m.info[k] = v.is_string() ? v.get<std::string>() : v.dump();
  }
  if (!j.contains("tensors") || !j["tensors"].is_array()) {
    return InvalidArgument("model: 'tensors' must be an array");
  }
  for (std::size_t i = 0; i < j["tensors"].size(); ++i) {
    const json& jt = j["tensors"][i];
    std::string where = "model.tensors[" + std::to_string(i) + "]";
    TensorDesc t;
    TP_ASSIGN_OR_RETURN(t.path, Get<std::string>(jt, "path", where));
    where += " (" + t.path + ")";
    TP_ASSIGN_OR_RETURN(std::string dt, Get<std::string>(jt, "dtype", where));
    TP_ASSIGN_OR_RETURN(t.dtype, ParseDType(dt));
    if (!jt.contains("shape") || !jt["shape"].is_array()) {
      return InvalidArgument(where + ": 'shape' must be an array of integers");
    }
    for (const json& d : jt["shape"]) {
      if (!d.is_number_integer()) return InvalidArgument(where + ": 'shape' must be integers");
      t.shape.push_back(d.get<int64_t>());
    }
    if (jt.contains("tp")) {
      TP_ASSIGN_OR_RETURN(t.tp, RuleFromJson(jt["tp"], where));
    }
    if (!jt.contains("stage")) return InvalidArgument(where + ": missing field 'stage'");
    TP_ASSIGN_OR_RETURN(t.stage, StageFromJson(jt["stage"], where));
    m.tensors.push_back(std::move(t));
  }
  if (j.contains("aliases")) {
    if (!j["aliases"].is_array()) return InvalidArgument("model: 'aliases' must be an array");
    for (std::size_t i = 0; i < j["aliases"].size(); ++i) {
      const json& ja = j["aliases"][i];
      std::string where = "model.aliases[" + std::to_string(i) + "]";
      AliasDesc a;
      TP_ASSIGN_OR_RETURN(a.name, Get<std::string>(ja, "name", where));
      TP_ASSIGN_OR_RETURN(a.target, Get<std::string>(ja, "target", where));
      if (!ja.contains("stage")) return InvalidArgument(where + ": missing field 'stage'");
      TP_ASSIGN_OR_RETURN(a.stage, StageFromJson(ja["stage"], where));
      m.aliases.push_back(std::move(a));
    }
  }
  if (j.contains("optimizer")) {
    const json& jo = j["optimizer"];
    TP_ASSIGN_OR_RETURN(m.optimizer.type, Get<std::string>(jo, "type", "model.optimizer"));
    if (jo.contains("states")) {
      if (!jo["states"].is_array())
        return InvalidArgument("model.optimizer.states must be an array");
      for (const json& s : jo["states"]) {
        if (!s.is_string()) return InvalidArgument("model.optimizer.states must be strings");
        m.optimizer.states.push_back(s.get<std::string>());
      }
    } else if (m.optimizer.type == "adam") {
      m.optimizer.states = {"exp_avg", "exp_avg_sq"};
    }
  }
  TP_RETURN_IF_ERROR(Validate(m));
  return m;
}

Result<Model> LoadModel(const std::string& spec) {
  std::string name = spec;
  if (name.rfind("preset:", 0) == 0) {
    name = name.substr(7);
  } else {
    struct stat st;
    if (::stat(spec.c_str(), &st) == 0 || spec.find('/') != std::string::npos ||
        spec.find(".json") != std::string::npos) {
      TP_ASSIGN_OR_RETURN(std::string text, ReadFile(spec));
      auto m = ModelFromJson(text);
      if (!m.ok()) return m.status().WithContext(spec);
      return m;
    }
  }
  TP_ASSIGN_OR_RETURN(GptArgs args, GptPreset(name));
  return MakeGpt(args);
}

}  // namespace tenplex
