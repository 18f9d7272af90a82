#include "tenplex/util/json_depth.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace tenplex {
namespace {

std::string Nested(int n) { return "{\"a\": " + std::string(n, '[') + std::string(n, ']') + "}"; }

TEST(JsonDepthTest, AcceptsUpToTheLimitAndRefusesBeyond) {
  EXPECT_TRUE(CheckJsonDepth(Nested(kMaxJsonDepth - 1)).ok());  // the object is one level
  Status s = CheckJsonDepth(Nested(kMaxJsonDepth), "version info");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("version info"), std::string::npos);
  EXPECT_FALSE(
      CheckJsonDepth(Nested(100000)).ok());  // the crash of issue 19 (SIGSEGV in the parser)
}

TEST(JsonDepthTest, BracketsInStringsDoNotCount) {
  const std::string deep_string =
      "{\"k\": \"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"}";
  EXPECT_TRUE(CheckJsonDepth(deep_string, "x", 2).ok());
  EXPECT_FALSE(
      CheckJsonDepth("{\"k\": \"\\\\\", \"v\": [[[]]]}", "x", 3).ok());  // escaped backslash ends
}

// Oracle: the depth nlohmann::json computes for random shallow documents.
int Depth(const nlohmann::json& j) {
  if (!j.is_structured()) return 0;
  int d = 0;
  for (const auto& e : j) d = std::max(d, Depth(e));
  return d + 1;
}

TEST(JsonDepthTest, MatchesTheParsedDepth) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::function<nlohmann::json(int)> gen = [&](int left) -> nlohmann::json {
      const int kind = left == 0 ? 2 : static_cast<int>(rng() % 3);
      if (kind == 0) {
        nlohmann::json a = nlohmann::json::array();
        for (unsigned i = rng() % 3; i > 0; --i) a.push_back(gen(left - 1));
        return a;
      }
      if (kind == 1) {
        nlohmann::json o = nlohmann::json::object();
        for (unsigned i = rng() % 3; i > 0; --i) o["k[{\"" + std::to_string(i)] = gen(left - 1);
        return o;
      }
      return "s]}\\\"[" + std::to_string(rng() % 10);
    };
    const nlohmann::json j = gen(8);
    const std::string text = j.dump();
    const int d = Depth(j);
    EXPECT_TRUE(CheckJsonDepth(text, "x", d).ok()) << text;
    if (d > 0) {
      EXPECT_FALSE(CheckJsonDepth(text, "x", d - 1).ok()) << text;
    }
  }
}

}  // namespace
}  // namespace tenplex
