#include "tenplex/io/state_info.h"

#include <set>

namespace tenplex::io {

using nlohmann::json;

namespace {

// Fields the store adds to an info; never written into a checkpoint's tenplex.json.
const std::set<std::string>& StoreFields() {
  static const std::set<std::string> f = {"cluster", "source", "safetensors"};
  return f;
}
constexpr char kShadowed[] = "shadowed_fields";

}  // namespace

Result<StateInfo> StateInfo::Parse(const std::string& text, ModelRequired model_required) {
  StateInfo s;
  s.json_ = json::parse(text, nullptr, false);
  if (s.json_.is_discarded() || !s.json_.is_object())
    return InvalidArgument("version info is not a JSON object");
  const bool optional = model_required == ModelRequired::kNo && !s.json_.contains("model");
  if (!optional && (!s.json_.contains("model") || !s.json_["model"].is_object())) {
    return InvalidArgument("version info has no \"model\" object");
  }
  if (!s.json_.contains("config") || !s.json_["config"].is_string()) {
    return InvalidArgument("version info has no \"config\" string");
  }
  if (!optional) {
    Result<Model> m = ModelFromJson(s.json_["model"].dump());
    if (!m.ok()) return m.status().WithContext("version info \"model\"");
    s.model_ = std::move(m).value();
  }
  Result<ParallelConfig> c = ParseConfig(s.json_["config"].get<std::string>());
  if (!c.ok()) return c.status().WithContext("version info \"config\"");
  s.config_ = *c;
  if (s.json_.contains("cluster")) {
    Result<Cluster> cl = ParseCluster(s.json_["cluster"].dump());
    if (!cl.ok()) return cl.status().WithContext("version info \"cluster\"");
    s.placement_ = std::move(cl).value();
  }
  for (const char* k : {"step", "samples_consumed"}) {
    if (s.json_.contains(k) && !s.json_[k].is_number_integer()) {
      return InvalidArgument(std::string("version info \"") + k + "\" must be an integer");
    }
  }
  return s;
}

StateInfo StateInfo::Make(const Model& model, const ParallelConfig& config) {
  StateInfo s;
  s.model_ = model;
  s.config_ = config;
  s.json_ = {{"model", json::parse(ModelToJson(model))}, {"config", config.ToString()}};
  return s;
}

StateInfo StateInfo::FromCheckpoint(const CheckpointInfo& checkpoint, const std::string& source) {
  StateInfo s = Make(checkpoint.model, checkpoint.config);
  for (const auto& [k, v] : checkpoint.extra.items()) {
    if (StoreFields().count(k) || k == kShadowed) {
      s.json_[kShadowed][k] = v;
    } else {
      s.json_[k] = v;
    }
  }
  s.json_["source"] = source;
  return s;
}

const json& StateInfo::field(const std::string& name) const {
  static const json null;
  auto it = json_.find(name);
  return it == json_.end() ? null : *it;
}

Result<StateInfo::Position> StateInfo::ResumePosition(const std::string& what) const {
  Position p;
  std::optional<int64_t> at = step();
  if (!at || *at < 0)
    return FailedPrecondition(what + " has no step in its info (no training position)");
  p.step = *at;
  p.samples_consumed = samples_consumed();
  if (p.samples_consumed && *p.samples_consumed < 0) {
    return FailedPrecondition(what + " has a negative samples_consumed in its info");
  }
  return p;
}

void StateInfo::set_config(const ParallelConfig& config) {
  config_ = config;
  json_["config"] = config.ToString();
}

void StateInfo::set_placement(const Cluster& cluster) {
  placement_ = cluster;
  json_["cluster"] = ClusterJson(cluster);
}

void StateInfo::set_field(const std::string& name, json value) {
  // model, config and cluster have typed setters; keep the typed view in step.
  if (name == "model" || name == "config" || name == "cluster") return;
  json_[name] = std::move(value);
}

std::optional<int64_t> StateInfo::Int(const char* name) const {
  auto it = json_.find(name);
  if (it == json_.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

CheckpointInfo StateInfo::ToCheckpoint() const {
  CheckpointInfo ci;
  ci.model = model_;
  ci.config = config_;
  ci.extra = json::object();
  for (const auto& [k, v] : json_.items()) {
    if (k == "model" || k == "config" || k == kShadowed || StoreFields().count(k)) continue;
    ci.extra[k] = v;
  }
  auto sh = json_.find(kShadowed);
  if (sh != json_.end() && sh->is_object()) {
    for (const auto& [k, v] : sh->items()) ci.extra[k] = v;
  }
  return ci;
}

Result<StateInfo> ParseStateInfo(const std::string& job, uint64_t version,
                                 const std::string& text) {
  Result<StateInfo> s = StateInfo::Parse(text);
  if (!s.ok()) {
    return FailedPrecondition(
        "version " + std::to_string(version) + " of job '" + job +
        "' has no valid model and config in its info: " + s.status().message());
  }
  return s;
}

}  // namespace tenplex::io
