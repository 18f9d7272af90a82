// The UCX library check (ucx_version.h): which library releases serve which build, and
// that this process runs the UCX it was built with, one without UCX 1.13's wireup-purge
// assertion (docs/reliability.md, "The UCX abort").
#include "tenplex/transport/ucx_version.h"

#include <gtest/gtest.h>

namespace tenplex::transport::ucx {
namespace {

TEST(UcxVersion, OrderIsMajorMinorRelease) {
  EXPECT_TRUE((UcxRelease{1, 22, 0}).AtLeast({1, 14, 0}));
  EXPECT_TRUE((UcxRelease{1, 14, 0}).AtLeast({1, 14, 0}));
  EXPECT_TRUE((UcxRelease{2, 0, 0}).AtLeast({1, 99, 9}));
  EXPECT_TRUE((UcxRelease{1, 14, 2}).AtLeast({1, 14, 1}));
  EXPECT_FALSE((UcxRelease{1, 13, 1}).AtLeast({1, 14, 0}));
  EXPECT_FALSE((UcxRelease{1, 14, 0}).AtLeast({1, 14, 1}));
  EXPECT_FALSE((UcxRelease{0, 99, 0}).AtLeast({1, 0, 0}));
  EXPECT_EQ((UcxRelease{1, 13, 1}).ToString(), "1.13.1");
}

TEST(UcxVersion, AnOlderOrOtherMajorLibraryIsRefused) {
  const UcxRelease headers{1, 22, 0};
  EXPECT_TRUE(CheckUcxLibrary({1, 22, 0}, headers).ok());
  EXPECT_TRUE(CheckUcxLibrary({1, 22, 3}, headers).ok());
  EXPECT_TRUE(CheckUcxLibrary({1, 23, 0}, headers).ok());
  for (UcxRelease lib : {UcxRelease{1, 13, 1}, UcxRelease{1, 21, 9}, UcxRelease{2, 0, 0}}) {
    Status s = CheckUcxLibrary(lib, headers);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << lib.ToString();
    EXPECT_NE(s.message().find("release " + lib.ToString()), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("headers of 1.22"), std::string::npos) << s.message();
  }
}

TEST(UcxVersion, ThisProcessRunsTheUcxItWasBuiltWith) {
  const UcxRelease lib = UcxLibraryRelease();
  const UcxRelease headers = UcxHeaderRelease();
  EXPECT_TRUE(CheckUcxLibrary(lib, headers).ok()) << CheckUcxLibrary(lib, headers).message();
  EXPECT_EQ(lib.major, headers.major);
  EXPECT_EQ(lib.minor, headers.minor) << "library " << lib.ToString();
}

TEST(UcxVersion, TheUcxHasNoWireupPurgeAssertion) {
  const UcxRelease lib = UcxLibraryRelease();
  if (lib.AtLeast(kUcxNoPurgeAssertion)) return;
#ifdef TENPLEX_UCX_SYSTEM
  GTEST_SKIP() << "TENPLEX_UCX=system chose UCX " << lib.ToString()
               << ": a data-plane client that dies mid-wireup can abort the daemon";
#else
  FAIL() << "UCX " << lib.ToString() << " is older than " << kUcxNoPurgeAssertion.ToString()
         << ": the build fell back to the system's UCX (scripts/install-deps.sh installs the "
            "libucx wheel of requirements.lock; cmake/ucx.cmake)";
#endif
}

TEST(UcxSettings, TcpSegmentsUnlessTheEnvironmentSetsThem) {
  const auto none = [](const char*) -> const char* { return nullptr; };
  const std::vector<UcxSetting> segments{{"TCP_TX_SEG_SIZE", "256k"}, {"TCP_RX_SEG_SIZE", "256k"}};
  EXPECT_EQ(UcxSettings("", "", none), segments);
  std::vector<UcxSetting> all{{"TLS", "tcp"}, {"NET_DEVICES", "lo"}};
  all.insert(all.end(), segments.begin(), segments.end());
  EXPECT_EQ(UcxSettings("tcp", "lo", none), all);
  // A variable the user set, even to the default, is left to UCX; the other one is still set.
  const auto tx_set = [](const char* k) -> const char* {
    return std::string(k) == "UCX_TCP_TX_SEG_SIZE" ? "8k" : nullptr;
  };
  EXPECT_EQ(UcxSettings("", "", tx_set), (std::vector<UcxSetting>{{"TCP_RX_SEG_SIZE", "256k"}}));
  const auto both_set = [](const char* k) -> const char* {
    return std::string(k).starts_with("UCX_TCP_") ? "1m" : nullptr;
  };
  EXPECT_TRUE(UcxSettings("", "", both_set).empty());
}

}  // namespace
}  // namespace tenplex::transport::ucx
