// A store directory with special files where the store expects its own (issue 35): a
// FIFO named CURRENT or MANIFEST.json hung the daemon at start (the restore opened them
// blocking, before it listened or handled SIGTERM); a job directory that is a symbolic
// link aliased two jobs; a tensor file that is a link read outside the store. Each such
// job is quarantined with the reason and the others are served. The store is opened in
// a child process, so that a hang fails the test instead of stopping it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "tenplex/store/store.h"

namespace tenplex::store {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  std::string path = "/tmp/tenplex-special-" + std::to_string(::getpid()) + "-" +
                     std::to_string(std::random_device()());
  ~TempDir() { fs::remove_all(path); }
};

// Opens the store at `dir` in a child; true when it opened and closed within `limit`.
bool OpensWithin(const std::string& dir, std::chrono::seconds limit) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    auto s = Store::Open({.shm_dir = dir});
    ::_exit(s.ok() ? 0 : 1);
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return false;
}

TEST(StoreSpecialFiles, AreQuarantinedNeverOpened) {
  TempDir dir;
  TempDir outside;
  const std::vector<uint8_t> a(64, 7);
  {
    auto store = Store::Open({.shm_dir = dir.path});
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    for (const char* job : {"good", "fifo-current", "fifo-manifest", "linked-tensor", "src"}) {
      ASSERT_TRUE((*store)->BeginVersion(job).ok());
      ASSERT_TRUE(
          (*store)
              ->Put(std::string("jobs/") + job + "/1/rank-00000/a", DType::kF32, {16}, a.data(), 64)
              .ok());
      ASSERT_TRUE((*store)->Commit(job, 1).ok());
    }
  }
  const std::string jobs = dir.path + "/jobs/";
  fs::remove(jobs + "fifo-current/CURRENT");
  ASSERT_EQ(::mkfifo((jobs + "fifo-current/CURRENT").c_str(), 0600), 0);
  fs::remove(jobs + "fifo-manifest/1/MANIFEST.json");
  ASSERT_EQ(::mkfifo((jobs + "fifo-manifest/1/MANIFEST.json").c_str(), 0600), 0);
  // a tensor file replaced by a link to a file of the same size outside the store
  fs::create_directories(outside.path);
  fs::copy_file(jobs + "linked-tensor/1/rank-00000/a", outside.path + "/a");
  fs::remove(jobs + "linked-tensor/1/rank-00000/a");
  fs::create_symlink(outside.path + "/a", jobs + "linked-tensor/1/rank-00000/a");
  // a job directory that is a link to another job's
  fs::create_directory_symlink(jobs + "src", jobs + "alias");

  ASSERT_TRUE(OpensWithin(dir.path, std::chrono::seconds(20)))
      << "the store did not open within 20 s (blocked on a FIFO?)";
  auto store = Store::Open({.shm_dir = dir.path});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->Jobs(), (std::vector<std::string>{"good", "src"}));
  std::map<std::string, std::string> why;
  for (const auto& q : (*store)->QuarantinedJobs()) why[q.job] = q.reason;
  ASSERT_EQ(why.size(), 4u);
  EXPECT_NE(why["fifo-current"].find("CURRENT is a FIFO"), std::string::npos)
      << why["fifo-current"];
  EXPECT_NE(why["fifo-manifest"].find("MANIFEST.json is a FIFO"), std::string::npos)
      << why["fifo-manifest"];
  EXPECT_NE(why["linked-tensor"].find("not a regular file"), std::string::npos)
      << why["linked-tensor"];
  EXPECT_NE(why["alias"].find("symbolic link"), std::string::npos) << why["alias"];
  EXPECT_TRUE(fs::exists(outside.path + "/a"));   // the link's target is untouched
  EXPECT_TRUE(fs::is_directory(jobs + "src/1"));  // so is the aliased job
  // the aliased name is free for a job of its own, which does not write into "src"
  ASSERT_TRUE((*store)->DeleteJob("alias").ok());
  ASSERT_TRUE((*store)->BeginVersion("alias").ok());
  ASSERT_TRUE((*store)->Put("jobs/alias/1/rank-00000/b", DType::kF32, {16}, a.data(), 64).ok());
  ASSERT_TRUE((*store)->Commit("alias", 1).ok());
  EXPECT_FALSE(fs::exists(jobs + "src/1/rank-00000/b"));
}

}  // namespace
}  // namespace tenplex::store
