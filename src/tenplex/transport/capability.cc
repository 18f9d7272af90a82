#include "tenplex/transport/capability.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <charconv>
#include <chrono>
#include <vector>

#include "tenplex/transport/transport.h"

namespace tenplex::transport {
namespace {

constexpr std::string_view kPrefix = "tpc2";

std::string Mac(std::string_view key, const CapabilityGrant& g) {
  return HmacSha256Hex(key, "tenplex-fetch-v2\n" + g.job + "\n" + g.incarnation + "\n" +
                                std::to_string(g.from_version) + "\n" +
                                std::to_string(g.to_version) + "\n" + std::to_string(g.expires));
}

template <typename T>
bool ParseNumber(std::string_view s, T* out) {
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string HmacSha256Hex(std::string_view key, std::string_view msg) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  static const char kEmpty = 0;
  HMAC(EVP_sha256(), key.empty() ? &kEmpty : key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    hex += kHex[out[i] >> 4];
    hex += kHex[out[i] & 15];
  }
  return hex;
}

std::string_view CapabilityRefusalName(CapabilityRefusal r) {
  switch (r) {
    case CapabilityRefusal::kNone:
      return "none";
    case CapabilityRefusal::kMissing:
      return "missing";
    case CapabilityRefusal::kWrong:
      return "wrong";
    case CapabilityRefusal::kExpired:
      return "expired";
    case CapabilityRefusal::kScope:
      return "scope";
  }
  return "?";
}

std::string MintCapability(std::string_view key, const CapabilityGrant& g) {
  return std::string(kPrefix) + ":" + std::to_string(g.from_version) + ":" +
         std::to_string(g.to_version) + ":" + std::to_string(g.expires) + ":" + g.incarnation +
         ":" + Mac(key, g) + ":" + g.job;
}

CapabilityCheck CheckCapability(std::string_view key, std::string_view capability, int64_t now) {
  CapabilityCheck c;
  if (capability.empty()) {
    c.refusal = CapabilityRefusal::kMissing;
    c.why = "this fetch carries no capability (the data plane serves transforms only)";
    return c;
  }
  // Six fields, then the job (which may not contain ':' anyway).
  std::vector<std::string_view> f;
  std::string_view rest = capability;
  for (int i = 0; i < 6; ++i) {
    const std::size_t colon = rest.find(':');
    if (colon == std::string_view::npos) break;
    f.push_back(rest.substr(0, colon));
    rest.remove_prefix(colon + 1);
  }
  c.refusal = CapabilityRefusal::kWrong;
  c.why = "the fetch's capability is not valid for this daemon";
  if (!f.empty() && f[0] == "tpc1") {
    c.why = "the fetch's capability is of format tpc1 (no job incarnation), refused since tpc2";
    return c;
  }
  if (f.size() != 6 || f[0] != kPrefix || rest.empty() || f[5].size() != 64 || f[4].size() != 16 ||
      f[4].find_first_not_of("0123456789abcdef") != std::string::npos) {
    return c;
  }
  CapabilityGrant g;
  g.job = std::string(rest);
  g.incarnation = std::string(f[4]);
  if (!ParseNumber(f[1], &g.from_version) || !ParseNumber(f[2], &g.to_version) ||
      !ParseNumber(f[3], &g.expires)) {
    return c;
  }
  const std::string want = Mac(key, g);
  if (want.size() != f[5].size() || CRYPTO_memcmp(want.data(), f[5].data(), want.size()) != 0) {
    return c;
  }
  c.grant = g;
  if (now >= g.expires) {
    c.refusal = CapabilityRefusal::kExpired;
    c.why = "the fetch's capability expired " + std::to_string(now - g.expires) + " s ago";
    return c;
  }
  if (g.expires - now > kMaxCapabilityLifetimeSeconds) {
    c.refusal = CapabilityRefusal::kWrong;
    c.why = "the fetch's capability claims to live " + std::to_string(g.expires - now) +
            " s more, longer than any daemon mints (" +
            std::to_string(kMaxCapabilityLifetimeSeconds) + " s)";
    return c;
  }
  c.refusal = CapabilityRefusal::kNone;
  c.why.clear();
  return c;
}

std::string MintProbeCapability(std::string_view key, int64_t lifetime_seconds) {
  return MintCapability(key, {std::string(kProbeRegion), 0, 0, UnixSeconds() + lifetime_seconds});
}

Status CheckProbeCapability(std::string_view key, std::string_view capability,
                            RefusalCounter* refused) {
  CapabilityCheck c = CheckCapability(key, capability, UnixSeconds());
  if (c.refusal == CapabilityRefusal::kNone &&
      (c.grant.job != kProbeRegion || c.grant.from_version != 0 || c.grant.to_version != 0 ||
       c.grant.incarnation != kNoIncarnation)) {
    c.refusal = CapabilityRefusal::kScope;
    c.why = "the fetch's capability is not a probe capability";
  }
  if (c.refusal == CapabilityRefusal::kNone) return Status::Ok();
  if (refused != nullptr) refused->Add(c.refusal);
  return PermissionDenied("probe region: " + c.why);
}

}  // namespace tenplex::transport
