// Mounts a view through the kernel (needs /dev/fuse and the right to mount: CI runs as
// root with /dev/fuse). Without them the test fails, it never skips.
#include "tenplex/data/fuse_mount.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "tenplex/data/test_util.h"
#include "tenplex/util/file.h"

namespace tenplex::data {
namespace {

namespace fs = std::filesystem;

bool Mounted(const std::string& mp) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(" " + mp + " ") != std::string::npos) return true;
  }
  return false;
}

std::shared_ptr<const DatasetView> MakeView(const std::string& dir, uint64_t dp) {
  std::string src;
  for (int i = 0; i < 300; ++i)
    src += "{\"i\": " + std::to_string(i) + ", \"s\": \"" + std::string(i % 50, 'q') + "\"}\n";
  EXPECT_TRUE(WriteFileAtomic(dir + "/d.jsonl", src).ok());
  EXPECT_TRUE(BuildIndex(dir + "/d.jsonl", DataFormat::kJsonl, dir + "/idx").ok());
  auto d = Dataset::Open(dir + "/idx");
  EXPECT_TRUE(d.ok());
  auto v = DatasetView::Create(*d, {4, 16, dp, 32, {}});
  EXPECT_TRUE(v.ok());
  return *v;
}

TEST(FuseMountTest, ServesTheViewAndStops) {
  ASSERT_EQ(::access("/dev/fuse", R_OK | W_OK), 0)
      << "/dev/fuse is missing or not usable: the FUSE view cannot be tested here";
  const std::string dir = testing::TempDir("fuse");
  const std::string mp = dir + "/mnt";
  fs::create_directories(mp);
  auto view = MakeView(dir, 3);
  auto m = FuseMount::Start(view, mp);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(Mounted(mp));
  std::set<std::string> names;
  for (auto& e : fs::directory_iterator(mp)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"info.json", "rank-00000", "rank-00001", "rank-00002"}));
  for (uint64_t r = 0; r < 3; ++r) {
    const std::string rel = DatasetView::RankDir(r) + "/samples.jsonl";
    const std::string want = *ReadAll(*view->File(rel));
    EXPECT_EQ(fs::file_size(mp + "/" + rel), want.size());
    auto got = ReadFile(mp + "/" + rel);  // 64 KiB reads through the kernel
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, want);
    // pread at odd offsets.
    int fd = ::open((mp + "/" + rel).c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    char buf[100];
    for (uint64_t off : {uint64_t{0}, uint64_t{1}, uint64_t{777}, want.size() - 3}) {
      ssize_t n = ::pread(fd, buf, sizeof buf, static_cast<off_t>(off));
      ASSERT_GE(n, 0);
      EXPECT_EQ(std::string(buf, n), want.substr(off, sizeof buf));
    }
    ::close(fd);
  }
  // Read-only.
  EXPECT_LT(::open((mp + "/info.json").c_str(), O_WRONLY), 0);
  EXPECT_LT(::open((mp + "/new").c_str(), O_WRONLY | O_CREAT, 0644), 0);
  struct stat st;
  EXPECT_NE(::stat((mp + "/rank-00009").c_str(), &st), 0);
  (*m)->Stop();
  EXPECT_FALSE(Mounted(mp));
  (*m)->Stop();  // idempotent
}

TEST(FuseMountTest, ExternalUnmountEndsWait) {
  ASSERT_EQ(::access("/dev/fuse", R_OK | W_OK), 0) << "/dev/fuse is missing or not usable";
  const std::string dir = testing::TempDir("fuse-umount");
  const std::string mp = dir + "/mnt";
  fs::create_directories(mp);
  auto m = FuseMount::Start(MakeView(dir, 2), mp);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_TRUE(fs::exists(mp + "/rank-00001/samples.jsonl"));
  std::thread t([&] { EXPECT_EQ(std::system(("fusermount3 -u " + mp).c_str()), 0); });
  EXPECT_TRUE((*m)->Wait().ok());
  t.join();
  EXPECT_FALSE(Mounted(mp));
}

TEST(FuseMountTest, StopWhileAFileIsOpen) {
  ASSERT_EQ(::access("/dev/fuse", R_OK | W_OK), 0) << "/dev/fuse is missing or not usable";
  const std::string dir = testing::TempDir("fuse-busy");
  const std::string mp = dir + "/mnt";
  fs::create_directories(mp);
  auto m = FuseMount::Start(MakeView(dir, 1), mp);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  int fd = ::open((mp + "/rank-00000/samples.jsonl").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char c;
  ASSERT_EQ(::read(fd, &c, 1), 1);
  (*m)->Stop();  // must not hang on the open file
  EXPECT_FALSE(Mounted(mp));
  ::close(fd);
  EXPECT_LT(::open((mp + "/rank-00000/samples.jsonl").c_str(), O_RDONLY), 0);
}

}  // namespace
}  // namespace tenplex::data
