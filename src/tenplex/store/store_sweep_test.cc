// The sweep of private directories that killed stores left behind: only a directory
// whose process is gone, whose LOCK is free and that is over a minute old goes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include "tenplex/store/store.h"
#include "tenplex/store/store_internal.h"

namespace tenplex::store {
namespace {

namespace fs = std::filesystem;

// A pid that was a process of ours and is gone (reaped).
pid_t DeadPid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

class SweepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("tenplex-sweep-test-" + std::to_string(::getpid()) + "-" +
                                         std::to_string(std::random_device{}()));
    fs::create_directories(root_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  // A private store directory as Store::Open makes it: LOCK and a tensor file.
  fs::path MakeDir(const std::string& name, bool old = true) {
    fs::path d = root_ / name;
    fs::create_directories(d / "jobs");
    std::ofstream(d / "LOCK").put('\n');
    std::ofstream(d / "jobs" / "tensor") << std::string(4096, 'x');
    if (old) fs::last_write_time(d, fs::file_time_type::clock::now() - std::chrono::minutes(5));
    return d;
  }
  fs::path root_;
};

TEST_F(SweepTest, RemovesOnlyAbandonedDirectories) {
  const std::string dead = std::to_string(DeadPid());
  const fs::path abandoned = MakeDir("tenplex-" + dead + "-0badf00d");
  const fs::path alive = MakeDir("tenplex-" + std::to_string(::getpid()) + "-a11ce000");
  const fs::path young = MakeDir("tenplex-" + dead + "-00000001", /*old=*/false);
  const fs::path held = MakeDir("tenplex-" + dead + "-00000002");
  const fs::path no_lock = MakeDir("tenplex-" + dead + "-00000003");
  fs::remove(no_lock / "LOCK");
  const fs::path other = MakeDir("something-" + dead + "-00000004");
  const fs::path bad_name = MakeDir("tenplex-x" + dead + "-00000005");
  // Another store (in another PID namespace, say) holds this LOCK.
  const int fd = ::open((held / "LOCK").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);

  EXPECT_EQ(SweepAbandonedPrivateDirs(root_.string()), 1);
  EXPECT_FALSE(fs::exists(abandoned));
  for (const fs::path& kept : {alive, young, held, no_lock, other, bad_name})
    EXPECT_TRUE(fs::exists(kept / "jobs" / "tensor")) << kept;
  ::close(fd);
  // The lock released: now it goes too.
  EXPECT_EQ(SweepAbandonedPrivateDirs(root_.string()), 1);
  EXPECT_FALSE(fs::exists(held));
  EXPECT_EQ(SweepAbandonedPrivateDirs(root_.string()), 0);
}

TEST_F(SweepTest, MissingRootIsNoError) {
  EXPECT_EQ(SweepAbandonedPrivateDirs((root_ / "absent").string()), 0);
}

// A store opened without --shm-dir sweeps its root (/dev/shm) and still works, and a
// live store's private directory survives another store's sweep.
TEST(SweepStoreTest, LiveStoreSurvivesAnotherStoresOpen) {
  auto a = Store::Open();
  ASSERT_TRUE(a.ok()) << a.status().message();
  const std::string dir = (*a)->shm_dir();
  auto b = Store::Open();
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_TRUE(fs::exists(dir + "/LOCK"));
  EXPECT_NE((*b)->shm_dir(), dir);
}

}  // namespace
}  // namespace tenplex::store
