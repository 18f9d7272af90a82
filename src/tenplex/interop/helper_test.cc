// RunHelper against fake helper packages: exit codes pass through, a missing package
// or interpreter is a clear error, a helper killed by a signal is an error naming it.
#include "tenplex/interop/helper.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace tenplex::interop {
namespace {

namespace fs = std::filesystem;

class HelperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tenplex-helper-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ + "/tenplex/interop");
    std::ofstream(dir_ + "/tenplex/__init__.py") << "";
    std::ofstream(dir_ + "/tenplex/interop/__init__.py") << "";
    ::setenv("TENPLEX_PYTHON_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("TENPLEX_PYTHON_DIR");
    ::unsetenv("TENPLEX_PYTHON");
    fs::remove_all(dir_);
  }
  void Main(const std::string& body) {
    std::ofstream(dir_ + "/tenplex/interop/__main__.py") << body;
  }
  std::string dir_;
};

TEST_F(HelperTest, ExitCodesPassThroughWithArguments) {
  Main("import sys\nsys.exit(int(sys.argv[1]) if sys.argv[2] == 'two words' else 9)\n");
  auto rc = RunHelper({"0", "two words"});
  ASSERT_TRUE(rc.ok()) << rc.status().message();
  EXPECT_EQ(*rc, 0);
  rc = RunHelper({"2", "two words"});
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 2);
  rc = RunHelper({"2", "other"});
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 9);
}

TEST_F(HelperTest, MissingPackageNamesTheVariable) {
  auto rc = RunHelper({});
  ASSERT_FALSE(rc.ok());
  EXPECT_NE(rc.status().message().find("TENPLEX_PYTHON_DIR"), std::string::npos)
      << rc.status().message();
}

TEST_F(HelperTest, MissingInterpreterIsAnError) {
  Main("pass\n");
  ::setenv("TENPLEX_PYTHON", (dir_ + "/no-python").c_str(), 1);
  auto rc = RunHelper({});
  ASSERT_FALSE(rc.ok());
  EXPECT_NE(rc.status().message().find("no-python"), std::string::npos) << rc.status().message();
}

TEST_F(HelperTest, SignalDeathIsAnError) {
  Main("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n");
  auto rc = RunHelper({});
  ASSERT_FALSE(rc.ok());
  EXPECT_NE(rc.status().message().find("signal 9"), std::string::npos) << rc.status().message();
}

}  // namespace
}  // namespace tenplex::interop
