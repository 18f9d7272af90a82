#include "tenplex/cluster/control_replies.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace tenplex::cluster {
namespace {

using nlohmann::json;

// The wire format, written out by hand (agent.h documents it): what an agent of
// protocol 3 sends, field for field.
constexpr char kPrepareWire[] = R"({"version": 4, "host": 2, "incarnation": "00ff00ff00ff00ff",
  "bytes_kept": 100, "bytes_linked": 200, "bytes_local": 300, "bytes_fetched": 400,
  "bytes_fetched_shm": 150, "remote_ops": 7, "peers": 3, "peers_shm": 1,
  "plan_seconds": 0.125, "warm_seconds": 0.25, "alloc_seconds": 0.5, "local_seconds": 1.5,
  "fetch_seconds": 2.25, "landed_seconds": 0.75, "seal_seconds": 0.0625, "seconds": 3.5})";

TEST(ControlRepliesTest, PrepareReplyReadsTheWireFormat) {
  Result<PrepareReply> r = DecodePrepareReply(kPrepareWire);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->version, 4u);
  EXPECT_EQ(r->host, 2);
  EXPECT_EQ(r->incarnation, "00ff00ff00ff00ff");
  EXPECT_EQ(r->bytes_kept, 100);
  EXPECT_EQ(r->bytes_linked, 200);
  EXPECT_EQ(r->bytes_local, 300);
  EXPECT_EQ(r->bytes_fetched, 400);
  EXPECT_EQ(r->bytes_fetched_shm, 150);
  EXPECT_EQ(r->remote_ops, 7);
  EXPECT_EQ(r->peers, 3);
  EXPECT_EQ(r->peers_shm, 1);
  EXPECT_EQ(r->plan_seconds, 0.125);
  EXPECT_EQ(r->warm_seconds, 0.25);
  EXPECT_EQ(r->alloc_seconds, 0.5);
  EXPECT_EQ(r->local_seconds, 1.5);
  EXPECT_EQ(r->fetch_seconds, 2.25);
  EXPECT_EQ(r->landed_seconds, 0.75);
  EXPECT_EQ(r->seal_seconds, 0.0625);
  EXPECT_EQ(r->seconds, 3.5);
  // And writes it: the same JSON object, no field more or less.
  EXPECT_EQ(json::parse(EncodePrepareReply(*r)), json::parse(kPrepareWire));
}

TEST(ControlRepliesTest, EveryReplyRoundTrips) {
  PrepareReply p;
  p.version = ~uint64_t{0};
  p.host = 1 << 30;
  p.bytes_fetched = (int64_t{1} << 62);
  p.seconds = 1.0 / 3;  // not a short decimal: the encoding keeps every bit
  p.fetch_seconds = 1e-300;
  EXPECT_EQ(*DecodePrepareReply(EncodePrepareReply(p)), p);

  PresizeReply z{3, 12, 1 << 20, 1 << 19, 1 << 18, ~uint64_t{0}, 0.1};
  EXPECT_EQ(*DecodePresizeReply(EncodePresizeReply(z)), z);

  WarmReply m{1 << 30, int64_t{1} << 62, 1.0 / 7};
  EXPECT_EQ(*DecodeWarmReply(EncodeWarmReply(m)), m);

  ProbeReply b{256ull << 20, 3.2, 3.3, 2.9, 1.1, 5.5, 20.25};
  EXPECT_EQ(*DecodeProbeReply(EncodeProbeReply(b)), b);

  AddressReply a{"ucx://abc", "ucx", "0123456789abcdef",
                 AddressReply::Local{"boot", "/dev/shm/x", "s1"}};
  EXPECT_EQ(*DecodeAddressReply(EncodeAddressReply(a)), a);
  AddressReply bare{"inproc://1", "inproc", "", std::nullopt};
  EXPECT_EQ(*DecodeAddressReply(EncodeAddressReply(bare)), bare);
  EXPECT_FALSE(json::parse(EncodeAddressReply(bare)).contains("local"));

  LocateReply l{{{"jobs/j/3/rank-00000/w", "/dev/shm/t/a", 4096, 45, ~uint64_t{0}},
                 {"jobs/j/3/rank-00001/w", "/dev/shm/t/b", 0, 0, 1}}};
  EXPECT_EQ(*DecodeLocateReply(EncodeLocateReply(l)), l);
  EXPECT_EQ(json::parse(EncodeLocateReply(l))["files"][0],
            json::parse(R"({"tensor": "jobs/j/3/rank-00000/w", "file": "/dev/shm/t/a",
                            "bytes": 4096, "dev": 45, "ino": 18446744073709551615})"));
}

TEST(ControlRepliesTest, AbsentFieldsKeepDefaultsUnknownOnesAreIgnored) {
  Result<PresizeReply> z = DecodePresizeReply(R"({"wanted_bytes": 5, "future_field": [1, 2]})");
  ASSERT_TRUE(z.ok()) << z.status().message();
  EXPECT_EQ(z->wanted_bytes, 5);
  EXPECT_EQ(z->pooled_bytes, 0);
  EXPECT_EQ(z->seconds, 0);
  // "local": null is no offer, as an absent one.
  Result<AddressReply> a = DecodeAddressReply(R"({"address": "x", "local": null})");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_FALSE(a->local.has_value());
}

// The decoder's message for `body`, "" when it accepted it.
template <class Decode>
std::string Refusal(Decode decode, const std::string& body) {
  auto r = decode(body);
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << body;
  return r.status().message();
}

TEST(ControlRepliesTest, HostileRepliesAreRefusedNamingTheField) {
  auto prepare = [](std::string_view b) { return DecodePrepareReply(b); };
  // Not JSON, not an object, nested past the depth bound.
  EXPECT_NE(Refusal(prepare, "{\"bytes_kept\": "), "");
  EXPECT_NE(Refusal(prepare, "[1, 2]"), "");
  EXPECT_NE(Refusal(prepare, std::string(100000, '[') + std::string(100000, ']')), "");
  EXPECT_NE(Refusal(prepare, "").find("prepare reply"), std::string::npos);
  // Wrong types and ranges name the field.
  EXPECT_NE(Refusal(prepare, R"({"bytes_kept": "100"})").find("\"bytes_kept\""), std::string::npos);
  EXPECT_NE(Refusal(prepare, R"({"bytes_kept": -1})").find("\"bytes_kept\""), std::string::npos);
  EXPECT_NE(Refusal(prepare, R"({"bytes_kept": 1.5})").find("\"bytes_kept\""), std::string::npos);
  EXPECT_NE(Refusal(prepare, R"({"bytes_kept": 9223372036854775807})"), "");
  EXPECT_NE(Refusal(prepare, R"({"bytes_kept": 18446744073709551615})"), "");
  EXPECT_NE(Refusal(prepare, R"({"host": -1})").find("\"host\""), std::string::npos);
  EXPECT_NE(Refusal(prepare, R"({"peers": 2147483648})").find("\"peers\""), std::string::npos);
  EXPECT_NE(Refusal(prepare, R"({"seconds": -0.5})").find("\"seconds\""), std::string::npos);
  EXPECT_NE(Refusal(prepare, R"({"seconds": 1e300})").find("\"seconds\""), std::string::npos);
  EXPECT_NE(Refusal(prepare, R"({"seconds": 1e400})"), "");  // past a double: not JSON here
  EXPECT_NE(Refusal(prepare, R"({"seconds": true})"), "");
  EXPECT_NE(Refusal(prepare, R"({"version": -4})").find("\"version\""), std::string::npos);
  EXPECT_NE(Refusal(prepare, R"({"incarnation": 5})").find("\"incarnation\""), std::string::npos);
  EXPECT_EQ(Refusal(prepare, R"({"bytes_kept": 4611686018427387904})"), "");  // 2^62: the bound

  auto probe = [](std::string_view b) { return DecodeProbeReply(b); };
  EXPECT_NE(Refusal(probe, R"({"fetch_gbps": 1e7})").find("probe reply: \"fetch_gbps\""),
            std::string::npos);
  EXPECT_NE(Refusal(probe, R"({"bytes": "big"})").find("\"bytes\""), std::string::npos);

  auto presize = [](std::string_view b) { return DecodePresizeReply(b); };
  EXPECT_NE(Refusal(presize, R"({"pool_limit": -1})").find("\"pool_limit\""), std::string::npos);
  EXPECT_NE(Refusal(presize, R"({"tensors": {}})").find("\"tensors\""), std::string::npos);

  auto warm = [](std::string_view b) { return DecodeWarmReply(b); };
  EXPECT_NE(Refusal(warm, R"({"tensors": -3})").find("warm reply: \"tensors\""), std::string::npos);
  EXPECT_NE(Refusal(warm, R"({"host": -1})").find("\"host\""), std::string::npos);
  EXPECT_NE(Refusal(warm, R"({"seconds": "soon"})").find("\"seconds\""), std::string::npos);

  auto address = [](std::string_view b) { return DecodeAddressReply(b); };
  EXPECT_NE(Refusal(address, R"({"kind": "ucx"})").find("no \"address\""), std::string::npos);
  EXPECT_NE(Refusal(address, R"({"address": 7})").find("\"address\""), std::string::npos);
  EXPECT_NE(Refusal(address, R"({"address": "x", "local": "yes"})").find("\"local\""),
            std::string::npos);
  EXPECT_NE(Refusal(address, R"({"address": "x", "local": {"shm_dir": []}})").find("\"shm_dir\""),
            std::string::npos);
  auto locate = [](std::string_view b) { return DecodeLocateReply(b); };
  EXPECT_NE(Refusal(locate, R"({})").find("\"files\""), std::string::npos);
  EXPECT_NE(Refusal(locate, R"({"files": {}})").find("\"files\""), std::string::npos);
  EXPECT_NE(Refusal(locate, R"({"files": [1]})").find("\"files\"[0]: not an object"),
            std::string::npos);
  EXPECT_NE(Refusal(locate, R"({"files": [{"tensor": "a"}, {"bytes": -1}]})")
                .find("\"files\"[1]: \"bytes\""),
            std::string::npos);
  const std::string long_address = R"({"address": ")" + std::string(5000, 'a') + "\"}";
  EXPECT_NE(Refusal(address, long_address).find("\"address\""), std::string::npos);
}

}  // namespace
}  // namespace tenplex::cluster
