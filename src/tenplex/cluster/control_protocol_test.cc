// The control-plane prepare request: encode/decode round trip, refusal of other
// protocol versions and malformed fields, the plan digest's sensitivity, and every
// host's part (HostPlanParts) against that host's own plan and the whole plan filtered
// by hand.
#include "tenplex/cluster/control_protocol.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "tenplex/model/gpt.h"
#include "tenplex/plan/planner_testing.h"
#include "tenplex/ptc/layout.h"

namespace tenplex::cluster {
namespace {

using nlohmann::json;

Model Tiny() {
  GptArgs a;
  a.num_layers = 2;
  a.hidden_size = 8;
  a.num_attention_heads = 2;
  a.vocab_size = 16;
  a.max_position_embeddings = 4;
  return *MakeGpt(a);
}

PrepareRequest Valid() {
  const Model m = Tiny();
  PrepareRequest r;
  r.job = "j";
  r.from_version = 3;
  r.to_version = 4;
  r.host = 1;
  r.info = StateInfo::Make(m, *ParseConfig("tp=2")).ToJson();
  r.to_config = *ParseConfig("pp=2");
  r.new_info = StateInfo::Make(m, r.to_config).ToJson();
  r.addresses = {"inproc:a", "inproc:b", ""};
  r.from_hosts = {1, -1};
  r.to_hosts = {1, 0};
  r.host_plan_digest = "00000000000000ff";
  r.served = {{0, 3, 0}, {0, 5, 2}};  // old rank 0's tensors 3 and 5, read by hosts 0 and 2
  return r;
}

TEST(ControlProtocol, RoundTrip) {
  const PrepareRequest r = Valid();
  const std::string text = EncodePrepare(r);
  EXPECT_EQ(json::parse(text)["protocol"], kControlProtocolVersion);
  Result<DecodedPrepare> d = DecodePrepare(text);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->request.job, r.job);
  EXPECT_EQ(d->request.from_version, 3u);
  EXPECT_EQ(d->request.to_version, 4u);
  EXPECT_EQ(d->request.host, 1);
  EXPECT_EQ(json::parse(d->request.info), json::parse(r.info));
  EXPECT_EQ(json::parse(d->request.new_info), json::parse(r.new_info));
  EXPECT_EQ(d->request.to_config, r.to_config);
  EXPECT_EQ(d->request.addresses, r.addresses);
  EXPECT_EQ(d->request.from_hosts, r.from_hosts);
  EXPECT_EQ(d->request.to_hosts, r.to_hosts);
  EXPECT_EQ(d->request.host_plan_digest, r.host_plan_digest);
  EXPECT_EQ(d->request.served, r.served);
  // One incarnation per address ("" where none was given).
  EXPECT_EQ(d->request.incarnations, std::vector<std::string>(r.addresses.size(), ""));
  EXPECT_EQ(d->from.config().ToString(), "tp=2,pp=1,dp=1");
  EXPECT_EQ(d->from.model().tensors.size(), Tiny().tensors.size());
}

TEST(ControlProtocol, IncarnationsAreOnePerHostOfHexDigits) {
  PrepareRequest r = Valid();
  r.incarnations.assign(r.addresses.size(), "");
  r.incarnations[0] = "0123456789abcdef";
  Result<DecodedPrepare> d = DecodePrepare(EncodePrepare(r));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->request.incarnations, r.incarnations);
  json j = json::parse(EncodePrepare(r));
  ASSERT_EQ(r.addresses.size(), 3u);
  for (const json& bad : {json(nullptr), json::array(), json("x"), json::array({"", ""}),
                          json::array({"0123", "", ""}), json::array({1, "", ""}),
                          json::array({"0123456789ABCDEF", "", ""})}) {
    j["incarnations"] = bad;
    EXPECT_EQ(DecodePrepare(j.dump()).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  j.erase("incarnations");  // required since version 2
  EXPECT_EQ(DecodePrepare(j.dump()).status().code(), StatusCode::kInvalidArgument);
}

TEST(ControlProtocol, RefusesOtherVersions) {
  json j = json::parse(EncodePrepare(Valid()));
  for (json v : {json(0), json(1), json(2), json(4), json(1000), json(nullptr), json("3")}) {
    j["protocol"] = v;
    Result<DecodedPrepare> d = DecodePrepare(j.dump());
    EXPECT_EQ(d.status().code(), StatusCode::kFailedPrecondition)
        << v.dump() << ": " << d.status().ToString();
  }
  j.erase("protocol");
  EXPECT_EQ(DecodePrepare(j.dump()).status().code(), StatusCode::kFailedPrecondition);
}

TEST(ControlProtocol, RefusesMalformedFields) {
  const json good = json::parse(EncodePrepare(Valid()));
  auto with = [&](const char* key, json value) {
    json j = good;
    if (value.is_discarded()) {
      j.erase(key);
    } else {
      j[key] = std::move(value);
    }
    return j.dump();
  };
  const json gone = json::value_t::discarded;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "{"},
      {"array", "[]"},
      {"unknown field", with("extra", 1)},
      {"job", with("job", "../x")},
      {"job type", with("job", 7)},
      {"no job", with("job", gone)},
      {"versions", with("to_version", 3)},
      {"negative version", with("from_version", -1)},
      {"host", with("host", 3)},
      {"addresses", with("addresses", json::array())},
      {"address type", with("addresses", {1, 2})},
      {"info", with("info", "x")},
      {"info without model", with("info", {{"config", "tp=1"}})},
      {"to_config", with("to_config", "tp=0")},
      {"new_info", with("new_info", json::array())},
      {"from_hosts range", with("from_hosts", {0, -2})},
      {"from_hosts count", with("from_hosts", {0})},
      {"to_hosts range", with("to_hosts", {1, 3})},
      {"to_hosts lost", with("to_hosts", {1, -1})},
      {"rank on a host without address", with("to_hosts", {2, 0})},
      {"digest", with("host_plan_digest", "xyz")},
      {"digest case", with("host_plan_digest", "00000000000000FF")},
      {"no digest", with("host_plan_digest", gone)},
      {"version 2's digest", with("plan_digest", "00000000000000ff")},
      {"no served", with("served", gone)},
      {"served type", with("served", "x")},
      {"served entry", with("served", {{0, 3}})},
      {"served rank", with("served", {{2, 3, 0}})},
      {"served rank elsewhere", with("served", {{1, 3, 0}})},
      {"served to itself", with("served", {{0, 3, 1}})},
      {"served reader", with("served", {{0, 3, 3}})},
      {"served tensor", with("served", {{0, -1, 0}})},
  };
  ASSERT_TRUE(DecodePrepare(good.dump()).ok());
  for (const auto& [what, text] : cases) {
    Result<DecodedPrepare> d = DecodePrepare(text);
    ASSERT_FALSE(d.ok()) << what;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument)
        << what << ": " << d.status().ToString();
  }
}

TEST(ControlProtocol, PlanDigestSeesEveryChange) {
  const Model m = Tiny();
  const Layout a = *MakeLayout(m, *ParseConfig("tp=2")),
               b = *MakeLayout(m, *ParseConfig("tp=1,pp=2"));
  const plan::Plan p = *plan::MakePlan(m, a, b, {0, 1}, {1, 0});
  const std::string d = PlanDigest(p);
  EXPECT_EQ(d.size(), 16u);
  EXPECT_EQ(PlanDigest(*plan::MakePlan(m, a, b, {0, 1}, {1, 0})), d);  // deterministic
  EXPECT_NE(PlanDigest(*plan::MakePlan(m, a, b, {0, 1}, {0, 1})), d);  // another placement
  ASSERT_FALSE(p.ops.empty());
  plan::Plan q = p;
  q.ops[0].dst.dims[0].end -= 1;
  EXPECT_NE(PlanDigest(q), d);
  q = p;
  q.ops[0].src_rank += 1;
  EXPECT_NE(PlanDigest(q), d);
  q = p;
  std::swap(q.ops.front(), q.ops.back());
  if (p.ops.size() > 1 && !(p.ops.front().tensor == p.ops.back().tensor &&
                            p.ops.front().global == p.ops.back().global)) {
    EXPECT_NE(PlanDigest(q), d);
  }
  q = p;
  q.kept.clear();
  if (!p.kept.empty()) {
    EXPECT_NE(PlanDigest(q), d);
  }
  q = p;
  q.tensors[0] += "x";
  EXPECT_NE(PlanDigest(q), d);
}

// The reference for one host: the whole plan's ops and kept regions whose destination
// is on `host`, `after` renumbered within them, and the old tensors on it that other
// hosts' ops read.
plan::Plan FilteredByHand(const plan::Plan& p, const std::vector<int>& th, int host) {
  plan::Plan out;
  out.tensors = p.tensors;
  std::vector<int64_t> index(p.ops.size(), -1);
  for (std::size_t k = 0; k < p.ops.size(); ++k) {
    if (th[p.ops[k].dst_rank] != host) continue;
    plan::CopyOp op = p.ops[k];
    if (op.src_new) op.after = index[op.after];
    index[k] = static_cast<int64_t>(out.ops.size());
    out.ops.push_back(op);
  }
  for (const plan::CopyOp& op : p.kept)
    if (th[op.dst_rank] == host) out.kept.push_back(op);
  return out;
}

std::vector<ServedTensor> ServedByHand(const plan::Plan& p, const std::vector<int>& fh,
                                       const std::vector<int>& th, int host) {
  std::set<ServedTensor> out;
  for (const plan::CopyOp& op : p.ops) {
    if (!op.src_new && fh[op.src_rank] == host && th[op.dst_rank] != host)
      out.insert({op.src_rank, op.src_tensor, th[op.dst_rank]});
  }
  return {out.begin(), out.end()};
}

// What an agent checks (agent_plan.h): the digest of its own part, plan::MakeHostPlan,
// equals the coordinator's HostPlanParts of the whole plan, on random configs and
// placements (lost hosts included); both equal the digest of the whole plan filtered by
// hand, and "served" is what other hosts' ops read. Different parts have different
// digests.
TEST(ControlProtocol, HostPlanPartsAreEachHostsOwnPlan) {
  std::mt19937 rng(36);
  int checked = 0, served = 0;
  for (int c = 0; c < 40; ++c) {
    const plan::testing::ModelSpec& spec =
        plan::testing::Specs()[c % plan::testing::Specs().size()];
    const Model m = plan::testing::Tiny(spec);
    const ParallelConfig fc = plan::testing::RandomConfig(rng, spec.groups);
    const ParallelConfig tc = plan::testing::RandomConfig(rng, spec.groups);
    auto from = MakeLayout(m, fc);
    auto to = MakeLayout(m, tc);
    if (!from.ok() || !to.ok()) continue;
    const int gpus = 1 + c % 3;
    std::vector<int> fh = plan::testing::RandomHosts(rng, from->world_size(), gpus, c % 2 == 1);
    const std::vector<int> th = plan::testing::RandomHosts(rng, to->world_size(), gpus, c % 4 == 3);
    if (c % 5 == 4) std::replace(fh.begin(), fh.end(), 0, plan::kLostHost);
    auto full = plan::MakePlan(m, *from, *to, fh, th);
    if (!full.ok()) continue;  // data lost with the host
    int hosts = 0;
    for (int h : fh) hosts = std::max(hosts, h + 1);
    for (int h : th) hosts = std::max(hosts, h + 1);
    const std::vector<HostPart> parts = HostPlanParts(*full, fh, th, hosts, 1);
    ASSERT_EQ(parts.size(), static_cast<std::size_t>(hosts));
    // The hosts split into ranges on threads: the same parts.
    const std::vector<HostPart> threaded = HostPlanParts(*full, fh, th, hosts, 3);
    ASSERT_EQ(threaded.size(), parts.size());
    std::set<std::string> distinct;
    int with_ops = 0;
    for (int h = 0; h < hosts; ++h) {
      SCOPED_TRACE(fc.ToString() + " -> " + tc.ToString() + ", host " + std::to_string(h));
      const plan::Plan mine = FilteredByHand(*full, th, h);
      EXPECT_EQ(parts[h].plan_digest, PlanDigest(mine));
      EXPECT_EQ(parts[h].served, ServedByHand(*full, fh, th, h));
      EXPECT_EQ(threaded[h].plan_digest, parts[h].plan_digest);
      EXPECT_EQ(threaded[h].served, parts[h].served);
      served += static_cast<int>(parts[h].served.size());
      if (!mine.ops.empty() || !mine.kept.empty()) {
        ++with_ops;
        distinct.insert(parts[h].plan_digest);
      }
      if (std::find(th.begin(), th.end(), h) == th.end()) continue;
      auto own = plan::MakeHostPlan(m, *from, *to, fh, th, h);
      ASSERT_TRUE(own.ok()) << own.status().ToString();
      EXPECT_EQ(PlanDigest(*own), parts[h].plan_digest);
      ++checked;
    }
    EXPECT_EQ(static_cast<int>(distinct.size()), with_ops);
    if (hosts == 1) {
      EXPECT_EQ(parts[0].plan_digest, PlanDigest(*full));
    }
  }
  EXPECT_GT(checked, 40);
  EXPECT_GT(served, 0);
}

}  // namespace
}  // namespace tenplex::cluster
