// The control-plane prepare request: encode/decode round trip, refusal of other
// protocol versions and malformed fields, and the plan digest's sensitivity.
#include "tenplex/transform/control_protocol.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tenplex/model/gpt.h"
#include "tenplex/ptc/layout.h"

namespace tenplex::transform {
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
  r.from_hosts = {0, -1};
  r.to_hosts = {1, 0};
  r.plan_digest = "00000000000000ff";
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
  EXPECT_EQ(d->request.plan_digest, r.plan_digest);
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
  for (json v : {json(0), json(1), json(3), json(1000), json(nullptr), json("2")}) {
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
      {"digest", with("plan_digest", "xyz")},
      {"digest case", with("plan_digest", "00000000000000FF")},
      {"no digest", with("plan_digest", gone)},
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

}  // namespace
}  // namespace tenplex::transform
