// A job's incarnation and its closed mark (store.h, JobInfo): what data-plane
// capabilities are checked against (transport/capability.h, issue 35 finding 6).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "tenplex/store/store.h"
#include "tenplex/util/file.h"

namespace tenplex::store {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  std::string path = "/dev/shm/tenplex-inc-test-" + std::to_string(::getpid()) + "-" +
                     std::to_string(std::random_device()());
  ~TempDir() { fs::remove_all(path); }
};

void Load(Store& s, const std::string& job, uint64_t v) {
  const uint8_t b[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(s.BeginVersion(job, v).ok());
  ASSERT_TRUE(s.Put(TensorPathOf(job, v, 0, "w"), DType::kU8, {8}, b, 8).ok());
  ASSERT_TRUE(s.Commit(job, v).ok());
}

bool IsIncarnation(const std::string& s) {
  return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos &&
         s != std::string(16, '0');
}

TEST(StoreIncarnationTest, KeptAcrossRestartsNewWhenRecreated) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  TempDir dir;
  std::string a, b, other;
  {
    auto s = *Store::Open({.shm_dir = dir.path});
    Load(*s, "a", 1);
    Load(*s, "b", 1);
    a = s->Job("a")->incarnation;
    b = s->Job("b")->incarnation;
    EXPECT_TRUE(IsIncarnation(a)) << a;
    EXPECT_NE(a, b);
    // Its file in the job's directory.
    EXPECT_EQ(*ReadFile(dir.path + "/jobs/a/INCARNATION"), a + "\n");
    // A transform to 3 closed here; the aborted version 4 closes its own.
    EXPECT_EQ(s->Job("a")->closed, 0u);
    ASSERT_TRUE(s->CloseTransforms("a", 3).ok());
    ASSERT_TRUE(s->CloseTransforms("a", 2).ok());  // never falls
    EXPECT_EQ(s->Job("a")->closed, 3u);
    ASSERT_TRUE(s->BeginVersion("a", 4).ok());
    ASSERT_TRUE(s->DropVersion("a", 4).ok());
    EXPECT_EQ(s->Job("a")->closed, 4u);
    EXPECT_EQ(s->CloseTransforms("nope", 2).code(), StatusCode::kNotFound);
    // A directory of an older build: no INCARNATION file.
    Load(*s, "old", 1);
    other = s->Job("old")->incarnation;
  }
  fs::remove(dir.path + "/jobs/old/INCARNATION");
  {
    auto s = *Store::Open({.shm_dir = dir.path});
    EXPECT_EQ(s->Job("a")->incarnation, a);
    EXPECT_EQ(s->Job("b")->incarnation, b);
    EXPECT_EQ(s->Job("a")->closed, 4u);
    ASSERT_TRUE(s->Job("a")->current.has_value());  // the files are not taken for versions
    const std::string made = s->Job("old")->incarnation;
    EXPECT_TRUE(IsIncarnation(made)) << made;
    EXPECT_NE(made, other);
    EXPECT_EQ(*ReadFile(dir.path + "/jobs/old/INCARNATION"), made + "\n");
    // Deleted and created again: a new incarnation and no closed mark.
    ASSERT_TRUE(s->DeleteJob("a").ok());
    Load(*s, "a", 1);
    EXPECT_NE(s->Job("a")->incarnation, a);
    EXPECT_EQ(s->Job("a")->closed, 0u);
  }
}

}  // namespace
}  // namespace tenplex::store
