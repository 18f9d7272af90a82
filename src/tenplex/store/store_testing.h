// Shared by the store's tests of one process (store_test.cc) and of restarts
// (store_restart_test.cc): random bytes, a tensor's bytes, a store that must open, and a
// fresh directory for a persistent store.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tenplex/store/store.h"

namespace tenplex::store::testing {

inline std::vector<uint8_t> RandomBytes(std::size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

inline std::vector<uint8_t> Bytes(const TensorRef& r) {
  return std::vector<uint8_t>(r.data(), r.data() + r.size());
}

inline std::unique_ptr<Store> OpenStore(StoreOptions o = {}) {
  auto s = Store::Open(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

// A fresh directory for a persistent store, removed at the end of the test.
struct TempDir {
  std::string path;
  TempDir() {
    path = "/dev/shm/tenplex-test-" + std::to_string(::getpid()) + "-" +
           std::to_string(std::random_device()());
    if (!std::filesystem::is_directory("/dev/shm")) {
      path = std::filesystem::temp_directory_path().string() + path.substr(8);
    }
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace tenplex::store::testing
