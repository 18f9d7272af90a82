#include "tenplex/transport/transport.h"

namespace tenplex::transport {

Result<std::unique_ptr<Transport>> NewTransport(std::string_view kind, RegionLookup lookup,
                                                const TransportOptions& options) {
  if (kind == "inproc") return NewInProcessTransport(std::move(lookup), options);
  if (kind == "ucx") return NewUcxTransport(std::move(lookup), options);
  return InvalidArgument("unknown transport '" + std::string(kind) + "' (inproc, ucx)");
}

}  // namespace tenplex::transport
