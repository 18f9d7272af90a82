// The precompiled header of every tenplex library and test (cmake/tenplex.cmake): the
// standard headers most files include and nlohmann/json, which alone takes ~2.5 s of
// g++ per file to parse. Nothing here may depend on a module's own macros; no file
// relies on it for an include (each still includes what it uses).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>
