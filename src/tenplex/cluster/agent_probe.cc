#include "tenplex/cluster/agent_probe.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "tenplex/cluster/agent_common.h"
#include "tenplex/cluster/control_replies.h"
#include "tenplex/store/mapping.h"
#include "tenplex/transport/bandwidth.h"
#include "tenplex/transport/capability.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::cluster {

using nlohmann::json;

Result<transport::Region> AgentProber::Scratch(std::string_view capability,
                                               transport::RefusalCounter* refused) {
  TP_RETURN_IF_ERROR(transport::CheckProbeCapability(capability_key_, capability, refused));
  std::lock_guard<std::mutex> lock(mu_);
  if (!scratch_)
    return NotFound("this daemon has no probe scratch region yet (it makes one when probed)");
  return transport::Region{scratch_->data(), scratch_->size(), scratch_};
}

// Makes the scratch region (on the prober's thread and the pool, never on the
// transport's thread, which must stay responsive).
void AgentProber::EnsureScratch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (scratch_) return;
  }
  auto s = std::make_shared<std::vector<uint8_t>>(kScratchBytes);
  constexpr uint64_t kChunk = 8ull << 20;
  // Within a 4 KiB block (its start a multiple of 4096) ProbeByte repeats every 256 bytes
  // (i * 131 mod 256 has period 256, i >> 12 is the block's): one period per block, copied
  // 16 times. A byte at a time took ~60 s for 512 MiB unoptimized under the sanitizers,
  // longer than a peer probed at the same moment waits for this region (15 s).
  ThreadPool::Default().ParallelFor(kScratchBytes / kChunk, [&](std::size_t c) {
    uint8_t* out = s->data();
    uint8_t period[256];
    for (uint64_t block = c * kChunk; block < (c + 1) * kChunk; block += 4096) {
      for (uint64_t k = 0; k < 256; ++k) period[k] = transport::ProbeByte(block + k);
      for (uint64_t k = 0; k < 4096; k += 256) std::memcpy(out + block + k, period, 256);
    }
  });
  std::lock_guard<std::mutex> lock(mu_);
  if (!scratch_) scratch_ = std::move(s);
}

void AgentProber::Release() {
  std::lock_guard<std::mutex> lock(mu_);
  scratch_.reset();
  scratch_reservation_.reset();
}

// Fetches `large` bytes of the peer's scratch region into dest, 4 times, checking the
// bytes: the best rate of the last 3 in GB/s (first: the first one's, which also makes
// the peer allocate the region). Distinct memory on both sides.
Result<double> AgentProber::FetchScratchInto(transport::PeerId peer, uint64_t large, uint8_t* dest,
                                             double* first) {
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    transport::ReadRequest req{
        std::string(kScratchRegion), {}, transport::MintProbeCapability(capability_key_)};
    for (uint64_t at = 0; at < large; at += 16ull << 20) {
      req.runs.push_back({at, std::min<uint64_t>(16ull << 20, large - at), dest + at});
    }
    auto t0 = std::chrono::steady_clock::now();
    Status st = transport_->Fetch(peer, {req});
    // A peer probed at the same moment may still be making its scratch region.
    for (int wait = 0; st.code() == StatusCode::kNotFound && wait < 150; ++wait) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      t0 = std::chrono::steady_clock::now();
      st = transport_->Fetch(peer, {req});
    }
    TP_RETURN_IF_ERROR(st);
    const double s = SecondsSince(t0);
    // Every 4099th byte (prime: every offset within the pattern's 256-byte period and
    // 4 KiB block is sampled).
    for (uint64_t at = 0; at < large; at += 4099) {
      if (dest[at] != transport::ProbeByte(at))
        return DataLoss("probe: wrong byte at offset " + std::to_string(at));
    }
    if (rep > 0) best = std::max(best, static_cast<double>(large) / s / 1e9);
    if (rep == 0 && first != nullptr) *first = static_cast<double>(large) / s / 1e9;
  }
  return best;
}

// Writing fresh shared memory, as a transform does: allocate a new tmpfs file, map it
// and copy a warm buffer of `bytes` into it (best of 3, GB/s).
Result<double> AgentProber::FreshWriteGbps(uint64_t bytes) {
  std::vector<uint8_t> warm(bytes, 0x5a);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    std::random_device rd;
    const std::string file =
        store_.shm_dir() + "/tmp/probe-" + std::to_string(getpid()) + "-" + std::to_string(rd());
    auto t0 = std::chrono::steady_clock::now();
    Result<store::ShmMapping> m = store::ShmMapping::Create(file, bytes);
    if (!m.ok()) return m.status();
    std::memcpy(m->data(), warm.data(), bytes);
    const double s = SecondsSince(t0);
    ::unlink(file.c_str());
    best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  return best;
}

Result<std::string> AgentProber::Probe(const std::string& body) {
  TP_ASSIGN_OR_RETURN(json j, ParseRequestBody(body));
  if (!j.contains("address") || !j["address"].is_string())
    return InvalidArgument("'address' must be a string");
  const std::string address = j["address"].get<std::string>();
  uint64_t bytes = 256ull << 20;
  if (j.contains("bytes")) {
    if (!j["bytes"].is_number_unsigned())
      return InvalidArgument("'bytes' must be a non-negative integer");
    bytes = j["bytes"].get<uint64_t>();
  }
  if (bytes < (1ull << 20) || bytes > (4ull << 30))
    return InvalidArgument("'bytes' must be in [1 MiB, 4 GiB]");
  // Everything the probe allocates counts against --memory-limit while it runs (its
  // buffers: `large` private and shared, `bytes` warm and fresh shared memory), and the
  // scratch region it keeps for peers until the daemon's next transform.
  const uint64_t large = std::min<uint64_t>(bytes, kScratchBytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!scratch_reservation_) {
      TP_ASSIGN_OR_RETURN(scratch_reservation_,
                          store_.Reserve(kScratchBytes, "the probe's scratch region"));
    }
  }
  TP_ASSIGN_OR_RETURN(
      std::shared_ptr<void> reservation,
      store_.Reserve(2 * large + 2 * bytes, "a probe of " + std::to_string(bytes) + " bytes"));
  EnsureScratch();
  TP_ASSIGN_OR_RETURN(transport::PeerId peer, transport_->Connect(address));
  transport::FetchBandwidthOptions fo;
  fo.bytes = bytes;
  fo.capability = transport::MintProbeCapability(capability_key_);
  TP_ASSIGN_OR_RETURN(double fetch_gbps, transport::MeasureFetchBandwidth(*transport_, peer, fo));
  // The same from the peer's large scratch region into a large local buffer.
  std::vector<uint8_t> dest(large, 0);
  TP_ASSIGN_OR_RETURN(double large_gbps, FetchScratchInto(peer, large, dest.data()));
  // And into a shared-memory tensor file, where a transform writes.
  std::random_device rd;
  const std::string shm_file =
      store_.shm_dir() + "/tmp/probe-" + std::to_string(getpid()) + "-" + std::to_string(rd());
  Result<store::ShmMapping> shm = store::ShmMapping::Create(shm_file, large);
  ::unlink(shm_file.c_str());
  if (!shm.ok()) return shm.status();
  shm->Prefault();
  double shm_first_gbps = 0;
  TP_ASSIGN_OR_RETURN(double shm_gbps, FetchScratchInto(peer, large, shm->data(), &shm_first_gbps));
  TP_ASSIGN_OR_RETURN(double fresh_gbps, FreshWriteGbps(bytes));
  ProbeReply reply;
  reply.bytes = bytes;
  reply.fetch_gbps = fetch_gbps;
  reply.fetch_large_gbps = large_gbps;
  reply.fetch_into_shm_gbps = shm_gbps;
  reply.fetch_into_shm_first_gbps = shm_first_gbps;
  reply.fresh_write_gbps = fresh_gbps;
  reply.memcpy_gbps = transport::MeasureMemcpyBandwidth(bytes);
  return EncodeProbeReply(reply);
}

}  // namespace tenplex::cluster
