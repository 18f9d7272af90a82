#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tenplex/plan/planner.h"
#include "tenplex/util/format.h"

namespace tenplex::plan {
namespace {

void AppendBox(std::string& out, const Box& b) {
  out += '[';
  char buf[48];
  for (std::size_t k = 0; k < b.rank(); ++k) {
    std::snprintf(buf, sizeof(buf), "%s[%lld,%lld]", k ? "," : "",
                  static_cast<long long>(b[k].begin), static_cast<long long>(b[k].end));
    out += buf;
  }
  out += ']';
}

std::string Quote(const std::string& s) { return nlohmann::json(s).dump(); }

void AppendOp(std::string& out, const CopyOp& op, const std::vector<std::string>& tensors,
              const Layout& from, const Layout& to) {
  out += "{\"tensor\":" + Quote(tensors[op.tensor]) + ",\"global\":";
  AppendBox(out, op.global);
  out += ",\"src_rank\":" + std::to_string(op.src_rank) +
         ",\"src_tensor\":" + Quote(SrcTensorName(op, from, to)) + ",\"src\":";
  AppendBox(out, op.src);
  out += ",\"dst_rank\":" + std::to_string(op.dst_rank) +
         ",\"dst_tensor\":" + Quote(DstTensorName(op, to)) + ",\"dst\":";
  AppendBox(out, op.dst);
  out += op.src_new ? ",\"src_layout\":\"new\",\"after\":" + std::to_string(op.after)
                    : ",\"src_layout\":\"old\"";
  out += '}';
}

}  // namespace

const std::string& SrcTensorName(const CopyOp& op, const Layout& from, const Layout& to) {
  const Layout& l = op.src_new ? to : from;
  return (*l.ranks[op.src_rank].tensors)[op.src_tensor].name;
}

const std::string& DstTensorName(const CopyOp& op, const Layout& to) {
  return (*to.ranks[op.dst_rank].tensors)[op.dst_tensor].name;
}

std::string PlanToJson(const Plan& plan, const Layout& from, const Layout& to) {
  std::string out = "{\"ops\":[";
  out.reserve(plan.ops.size() * 256 + 1024);
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    out += i ? ",\n" : "\n";
    AppendOp(out, plan.ops[i], plan.tensors, from, to);
  }
  out += "],\n\"kept\":[";
  for (std::size_t i = 0; i < plan.kept.size(); ++i) {
    out += i ? ",\n" : "\n";
    AppendOp(out, plan.kept[i], plan.tensors, from, to);
  }
  const PlanStats& s = plan.stats;
  nlohmann::json st = {{"bytes_total", s.bytes_total},
                       {"bytes_in_place", s.bytes_in_place},
                       {"bytes_host_local", s.bytes_host_local},
                       {"bytes_cross_host", s.bytes_cross_host},
                       {"cross_host_lower_bound", s.cross_host_lower_bound},
                       {"max_host_send_bytes", s.max_host_send_bytes},
                       {"max_host_recv_bytes", s.max_host_recv_bytes},
                       {"ops", s.ops},
                       {"cross_host_ops", s.cross_host_ops},
                       {"kept", plan.kept.size()},
                       {"num_hosts", s.num_hosts},
                       {"host_send_bytes", s.host_send_bytes},
                       {"host_recv_bytes", s.host_recv_bytes}};
  out += "],\n\"stats\":" + st.dump() + "}\n";
  return out;
}

std::string PlanSummary(const Model& model, const Plan& plan, const Layout& from, const Layout& to,
                        const std::vector<int>& from_hosts, const std::vector<int>& to_hosts) {
  const PlanStats& s = plan.stats;
  auto hosts = [](const std::vector<int>& m) {
    int n = 0;
    for (int h : m) n = std::max(n, h + 1);
    return n;
  };
  auto pct = [&](int64_t b) {
    return s.bytes_total ? 100.0 * static_cast<double>(b) / s.bytes_total : 0.0;
  };
  auto argmax = [](const std::vector<int64_t>& v) {
    return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
  };
  char line[512];
  std::string out;
  std::snprintf(line, sizeof(line), "plan %s: %s (%d ranks, %d hosts) -> %s (%d ranks, %d hosts)\n",
                model.name.c_str(), from.config.ToString().c_str(), from.world_size(),
                hosts(from_hosts), to.config.ToString().c_str(), to.world_size(), hosts(to_hosts));
  out += line;
  std::snprintf(line, sizeof(line), "  new layout holds   %12s\n",
                HumanBytes(s.bytes_total).c_str());
  out += line;
  std::snprintf(line, sizeof(line), "  kept in place      %12s  %5.1f%%\n",
                HumanBytes(s.bytes_in_place).c_str(), pct(s.bytes_in_place));
  out += line;
  std::snprintf(line, sizeof(line), "  copied within host %12s  %5.1f%%\n",
                HumanBytes(s.bytes_host_local).c_str(), pct(s.bytes_host_local));
  out += line;
  std::snprintf(line, sizeof(line), "  sent across hosts  %12s  %5.1f%%  (lower bound %s%s)\n",
                HumanBytes(s.bytes_cross_host).c_str(), pct(s.bytes_cross_host),
                HumanBytes(s.cross_host_lower_bound).c_str(),
                s.bytes_cross_host == s.cross_host_lower_bound ? ", met" : ", NOT met");
  out += line;
  if (s.bytes_cross_host > 0) {
    std::snprintf(line, sizeof(line),
                  "  busiest host       host %d sends %s; host %d receives %s\n",
                  argmax(s.host_send_bytes), HumanBytes(s.max_host_send_bytes).c_str(),
                  argmax(s.host_recv_bytes), HumanBytes(s.max_host_recv_bytes).c_str());
    out += line;
  }
  std::snprintf(
      line, sizeof(line), "  ops                %12lld  (%lld across hosts, %zu regions kept)\n",
      static_cast<long long>(s.ops), static_cast<long long>(s.cross_host_ops), plan.kept.size());
  out += line;
  return out;
}

}  // namespace tenplex::plan
