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

// Where the CLI finds the package (issue 34: an installed CLI found its helper through the
// source path compiled in; it must use the package installed beside it, and a CLI that
// is not in the build tree must never fall back to the source tree).
class PythonDirTest : public HelperTest {
 protected:
  void SetUp() override {
    HelperTest::SetUp();
    ::unsetenv("TENPLEX_PYTHON_DIR");
  }
  // A fake package under root/rel, and root/bin (the CLI's folder).
  std::string Layout(const std::string& root, const std::string& rel) {
    fs::create_directories(dir_ + "/" + root + "/bin");
    fs::create_directories(dir_ + "/" + root + "/" + rel + "/tenplex/interop");
    std::ofstream(dir_ + "/" + root + "/" + rel + "/tenplex/interop/__main__.py") << "";
    return fs::canonical(dir_ + "/" + root + "/" + rel).string();
  }
};

TEST_F(PythonDirTest, InstalledLayoutsRelativeToTheExecutable) {
  std::string want = Layout("prefix", "lib/python3.11/dist-packages");  // cmake --install
  auto got = PythonDirFor(dir_ + "/prefix/bin");
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, want);
  want = Layout("venv", "lib/python3.11/site-packages");  // pip install into a venv
  got = PythonDirFor(dir_ + "/venv/bin");
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, want);
  want = Layout("target", ".");  // pip install --target DIR
  got = PythonDirFor(dir_ + "/target/bin");
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, want);
}

TEST_F(PythonDirTest, NoSourceTreeFallbackOutsideTheBuildTree) {
  fs::create_directories(dir_ + "/empty/bin");
  auto got = PythonDirFor(dir_ + "/empty/bin");
  ASSERT_FALSE(got.ok()) << "found " << *got;
  EXPECT_NE(got.status().message().find("looked in " + dir_ + "/empty/bin/.."), std::string::npos)
      << got.status().message();
  EXPECT_NE(got.status().message().find("TENPLEX_PYTHON_DIR"), std::string::npos);
  // This test binary lies in the build tree: it does use the source tree's python/.
  got = PythonDir();
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_TRUE(fs::exists(*got + "/tenplex/interop/__main__.py")) << *got;
}

TEST_F(PythonDirTest, EnvironmentOverrides) {
  std::string want = Layout("other", "pkg");
  ::setenv("TENPLEX_PYTHON_DIR", want.c_str(), 1);
  auto got = PythonDirFor(dir_ + "/empty/bin");
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, want);
  ::setenv("TENPLEX_PYTHON_DIR", (dir_ + "/nowhere").c_str(), 1);
  EXPECT_FALSE(PythonDirFor(dir_ + "/prefix/bin").ok());
}

}  // namespace
}  // namespace tenplex::interop
