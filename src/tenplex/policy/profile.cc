// Device profiles: presets and JSON files (policy.h; sources in docs/policy.md).
#include <cmath>
#include <nlohmann/json.hpp>

#include "tenplex/policy/policy.h"
#include "tenplex/store/parse.h"
#include "tenplex/util/file.h"

namespace tenplex::policy {
namespace {

using nlohmann::json;

DeviceProfile A100() { return DeviceProfile{}; }

DeviceProfile H100() {
  DeviceProfile p;
  p.name = "h100";
  p.peak_flops = 989e12;
  p.intra_bw = 360e9;
  p.inter_bw = 45e9;
  // Megatron-Core with Transformer Engine's TP comm-GEMM overlap (--tp-comm-overlap), as
  // in its H100 scaling table: fitted there (docs/policy.md, calibration)
  p.efficiency = 0.63;
  p.tp_overlap = 0.8;
  return p;
}

// The CPU example (examples/gpt over gloo on this 2-core machine): a few GFLOP/s, a
// socket between processes, and a small fake memory so that the policy must choose.
DeviceProfile Cpu() {
  DeviceProfile p;
  p.name = "cpu";
  p.peak_flops = 20e9;
  p.efficiency = 0.5;
  p.memory_bytes = 64LL << 20;
  p.gpus_per_host = 4;
  p.intra_bw = 1e9;
  p.intra_latency = 100e-6;
  p.inter_bw = 0.5e9;
  p.inter_latency = 200e-6;
  p.reserve_bytes = 0;
  p.reserve_fraction = 0.0;
  p.dp_overlap = 0.0;
  return p;
}

Result<DeviceProfile> Preset(const std::string& name) {
  if (name == "a100") return A100();
  if (name == "h100") return H100();
  if (name == "cpu") return Cpu();
  std::string known;
  for (const std::string& n : ProfilePresetNames()) known += (known.empty() ? "" : ", ") + n;
  return NotFound("unknown device profile '" + name + "' (presets: " + known + ", or a JSON file)");
}

Result<double> Positive(const json& j, const char* key, double scale) {
  const json& v = j[key];
  if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>() * scale)) {
    return InvalidArgument(std::string("device profile: '") + key +
                           "' must be a finite number > 0");
  }
  return v.get<double>() * scale;
}

Result<double> Fraction(const json& j, const char* key) {
  const json& v = j[key];
  if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 1) {
    return InvalidArgument(std::string("device profile: '") + key + "' must be a number in [0, 1]");
  }
  return v.get<double>();
}

Result<int64_t> Bytes(const json& j, const char* key) {
  const json& v = j[key];
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
  if (v.is_string()) {
    auto b = store::ParseByteSize(v.get<std::string>());
    if (!b.ok()) return b.status().WithContext(std::string("device profile: '") + key + "'");
    return static_cast<int64_t>(*b);
  }
  return InvalidArgument(std::string("device profile: '") + key +
                         "' must be a byte count such as \"80GiB\"");
}

// A field the profile does not know is refused (a typo would silently keep the base's value).
Status CheckKnownFields(const json& j) {
  static const char* kKnown[] = {"name",
                                 "base",
                                 "peak_tflops",
                                 "efficiency",
                                 "memory",
                                 "gpus_per_host",
                                 "intra_host_gbps",
                                 "intra_host_latency_us",
                                 "inter_host_gbps",
                                 "inter_host_latency_us",
                                 "reserve",
                                 "reserve_fraction",
                                 "dp_overlap",
                                 "tp_overlap",
                                 "layer_overhead_us"};
  for (auto& [k, v] : j.items()) {
    (void)v;
    bool ok = false;
    for (const char* n : kKnown) ok |= k == n;
    if (!ok) return InvalidArgument("device profile: unknown field '" + k + "'");
  }
  return Status::Ok();
}

// The device itself: peak FLOP/s, efficiency, memory, GPUs a host.
Status ReadCompute(const json& j, DeviceProfile& p) {
  if (j.contains("peak_tflops")) {
    TP_ASSIGN_OR_RETURN(p.peak_flops, Positive(j, "peak_tflops", 1e12));
  }
  if (j.contains("efficiency")) {
    TP_ASSIGN_OR_RETURN(p.efficiency, Fraction(j, "efficiency"));
    if (p.efficiency <= 0) return InvalidArgument("device profile: 'efficiency' must be > 0");
  }
  if (j.contains("memory")) {
    TP_ASSIGN_OR_RETURN(p.memory_bytes, Bytes(j, "memory"));
  }
  if (j.contains("gpus_per_host")) {
    if (!j["gpus_per_host"].is_number_integer() || j["gpus_per_host"].get<int64_t>() < 1 ||
        j["gpus_per_host"].get<int64_t>() > 1 << 20) {
      return InvalidArgument("device profile: 'gpus_per_host' must be an integer >= 1");
    }
    p.gpus_per_host = j["gpus_per_host"].get<int>();
  }
  return Status::Ok();
}

// The links: bandwidth and latency within a host and between hosts.
Status ReadLinks(const json& j, DeviceProfile& p) {
  if (j.contains("intra_host_gbps")) {
    TP_ASSIGN_OR_RETURN(p.intra_bw, Positive(j, "intra_host_gbps", 1e9));
  }
  if (j.contains("inter_host_gbps")) {
    TP_ASSIGN_OR_RETURN(p.inter_bw, Positive(j, "inter_host_gbps", 1e9));
  }
  if (j.contains("intra_host_latency_us")) {
    TP_ASSIGN_OR_RETURN(p.intra_latency, Positive(j, "intra_host_latency_us", 1e-6));
  }
  if (j.contains("inter_host_latency_us")) {
    TP_ASSIGN_OR_RETURN(p.inter_latency, Positive(j, "inter_host_latency_us", 1e-6));
  }
  return Status::Ok();
}

// The memory the framework keeps for itself, and how much communication hides behind
// compute (overlaps, the per-layer overhead).
Status ReadReserveAndOverlap(const json& j, DeviceProfile& p) {
  if (j.contains("reserve")) {
    TP_ASSIGN_OR_RETURN(p.reserve_bytes, Bytes(j, "reserve"));
  }
  if (j.contains("reserve_fraction")) {
    TP_ASSIGN_OR_RETURN(p.reserve_fraction, Fraction(j, "reserve_fraction"));
  }
  if (j.contains("dp_overlap")) {
    TP_ASSIGN_OR_RETURN(p.dp_overlap, Fraction(j, "dp_overlap"));
  }
  if (j.contains("tp_overlap")) {
    TP_ASSIGN_OR_RETURN(p.tp_overlap, Fraction(j, "tp_overlap"));
  }
  if (j.contains("layer_overhead_us")) {
    const json& v = j["layer_overhead_us"];
    if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 1e6)
      return InvalidArgument("device profile: 'layer_overhead_us' must be a number in [0, 1e6]");
    p.layer_overhead = v.get<double>() * 1e-6;
  }
  return Status::Ok();
}

}  // namespace

std::vector<std::string> ProfilePresetNames() { return {"a100", "h100", "cpu"}; }

Result<DeviceProfile> DeviceProfileFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("device profile is not a JSON object");
  TP_RETURN_IF_ERROR(CheckKnownFields(j));
  std::string base = "a100";
  if (j.contains("base")) {
    if (!j["base"].is_string())
      return InvalidArgument("device profile: 'base' must be a preset name");
    base = j["base"].get<std::string>();
  }
  TP_ASSIGN_OR_RETURN(DeviceProfile p, Preset(base));
  if (j.contains("name")) {
    if (!j["name"].is_string()) return InvalidArgument("device profile: 'name' must be a string");
    p.name = j["name"].get<std::string>();
  }
  TP_RETURN_IF_ERROR(ReadCompute(j, p));
  TP_RETURN_IF_ERROR(ReadLinks(j, p));
  TP_RETURN_IF_ERROR(ReadReserveAndOverlap(j, p));
  return p;
}

Result<DeviceProfile> LoadDeviceProfile(const std::string& spec) {
  auto preset = Preset(spec);
  if (preset.ok()) return preset;
  if (spec.find('/') == std::string::npos && spec.find(".json") == std::string::npos)
    return preset.status();
  auto text = ReadFile(spec);
  if (!text.ok()) return text.status().WithContext("device profile");
  auto p = DeviceProfileFromJson(*text);
  if (!p.ok()) return p.status().WithContext(spec);
  return p;
}

}  // namespace tenplex::policy
