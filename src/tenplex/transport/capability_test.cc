#include "tenplex/transport/capability.h"

#include <gtest/gtest.h>

namespace tenplex::transport {
namespace {

TEST(CapabilityTest, HmacMatchesRfc4231) {
  // RFC 4231, test case 2.
  EXPECT_EQ(HmacSha256Hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(CapabilityTest, MintAndCheck) {
  const CapabilityGrant g{"job-1", 3, 4, 1000, "00112233aabbccdd"};
  const std::string cap = MintCapability("key", g);
  // The MAC is HMAC-SHA256 over the documented message.
  EXPECT_EQ(cap, "tpc2:3:4:1000:00112233aabbccdd:" +
                     HmacSha256Hex("key", "tenplex-fetch-v2\njob-1\n00112233aabbccdd\n3\n4\n1000") +
                     ":job-1");
  CapabilityCheck c = CheckCapability("key", cap, 999);
  EXPECT_EQ(c.refusal, CapabilityRefusal::kNone) << c.why;
  EXPECT_EQ(c.grant.job, "job-1");
  EXPECT_EQ(c.grant.incarnation, "00112233aabbccdd");
  EXPECT_EQ(c.grant.from_version, 3u);
  EXPECT_EQ(c.grant.to_version, 4u);
  EXPECT_EQ(CheckCapability("key", cap, 1000).refusal, CapabilityRefusal::kExpired);
  EXPECT_EQ(CheckCapability("other", cap, 999).refusal, CapabilityRefusal::kWrong);
  EXPECT_EQ(CheckCapability("key", "", 999).refusal, CapabilityRefusal::kMissing);
}

// A correctly signed capability that claims to outlive any transform (issue 35: the
// year 2^40 was accepted) is refused; one at the bound is not.
TEST(CapabilityTest, LifetimeIsBounded) {
  const int64_t now = 1'700'000'000;
  const std::string forever = MintCapability("key", {"j", 1, 2, int64_t{1} << 40});
  CapabilityCheck c = CheckCapability("key", forever, now);
  EXPECT_EQ(c.refusal, CapabilityRefusal::kWrong);
  EXPECT_NE(c.why.find("longer than any daemon mints"), std::string::npos) << c.why;
  const std::string hour = MintCapability("key", {"j", 1, 2, now + kMaxCapabilityLifetimeSeconds});
  EXPECT_EQ(CheckCapability("key", hour, now).refusal, CapabilityRefusal::kNone);
  EXPECT_EQ(CheckCapability("key", hour, now - 1).refusal, CapabilityRefusal::kWrong);
  const std::string minted = MintCapability("key", {"j", 1, 2, now + 900});  // the agent's
  EXPECT_EQ(CheckCapability("key", minted, now).refusal, CapabilityRefusal::kNone);
}

// The format of issue 35's first fixes (no incarnation) is refused even when its MAC is
// right: it could read any incarnation of its job.
TEST(CapabilityTest, FormatOneIsRefused) {
  const std::string v1 =
      "tpc1:1:2:5000:" + HmacSha256Hex("key", "tenplex-fetch-v1\nj\n1\n2\n5000") + ":j";
  CapabilityCheck c = CheckCapability("key", v1, 10);
  EXPECT_EQ(c.refusal, CapabilityRefusal::kWrong);
  EXPECT_NE(c.why.find("tpc1"), std::string::npos) << c.why;
  // An incarnation that is not 16 lower-case hex digits is never valid.
  for (const char* inc : {"", "0011", "00112233AABBCCDD", "00112233aabbccdd0"}) {
    EXPECT_EQ(CheckCapability("key", MintCapability("key", {"j", 1, 2, 5000, inc}), 10).refusal,
              CapabilityRefusal::kWrong)
        << inc;
  }
}

TEST(CapabilityTest, AnyChangedByteIsWrong) {
  const std::string cap = MintCapability("key", {"j", 1, 2, 5000, "0123456789abcdef"});
  for (std::size_t i = 0; i < cap.size(); ++i) {
    for (char c : {'0', '1', '9', 'a', 'f', 'x', ':'}) {
      if (cap[i] == c) continue;
      std::string bad = cap;
      bad[i] = c;
      EXPECT_NE(CheckCapability("key", bad, 10).refusal, CapabilityRefusal::kNone) << bad;
    }
  }
  // Truncated, extended, or with a later expiry but the old MAC.
  EXPECT_EQ(CheckCapability("key", cap.substr(0, cap.size() - 1), 10).refusal,
            CapabilityRefusal::kWrong);
  EXPECT_EQ(CheckCapability("key", cap + "x", 10).refusal, CapabilityRefusal::kWrong);
  std::string later = cap;
  later.replace(later.find(":5000:"), 6, ":9000:");
  EXPECT_EQ(CheckCapability("key", later, 6000).refusal, CapabilityRefusal::kWrong);
  for (const char* junk :
       {"x", "tpc2", "tpc2::::::", "tpc2:1:2:3:4:5:j", "tpc2:01:2:3:", "tpc1:1:2:3:4:j"}) {
    EXPECT_EQ(CheckCapability("key", junk, 0).refusal, CapabilityRefusal::kWrong) << junk;
  }
}

}  // namespace
}  // namespace tenplex::transport
