// The UCX transport, server side: answering fetch requests (ucx_internal.h).
#include "tenplex/transport/ucx_internal.h"

namespace tenplex::transport::ucx {

Status UcxTransport::CheckServeBounds(ucp_ep_h ep, uint64_t total) {
  if (total > options_.max_request_bytes) {
    return InvalidArgument("a fetch request for " + std::to_string(total) +
                           " bytes; this peer serves at most " +
                           std::to_string(options_.max_request_bytes) + " per request");
  }
  auto it = served_inflight_.find(ep);
  const uint64_t inflight = it == served_inflight_.end() ? 0 : it->second;
  const uint64_t window = kServedWindowFactor * options_.max_inflight_bytes;
  if (inflight + total > window) {
    return ResourceExhausted("this connection has " + std::to_string(inflight) +
                             " bytes of answers in flight; a request for " + std::to_string(total) +
                             " more exceeds the limit of " + std::to_string(window));
  }
  return Status::Ok();
}

void UcxTransport::SendStatus(ucp_ep_h ep, uint64_t request_id, const Status& s) {
  Op* op = new Op(Op::kServeStatus, this);
  op->status_header = EncodeStatusHeader(request_id, s);
  op->text = s.message().substr(0, kMaxStatusText);
  Track(op);
  ucp_request_param_t params = SendParams(op);
  params.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_AM_SEND_FLAG_EAGER;
  Posted(op, ucp_am_send_nbx(ep, kFetchStatus, &op->status_header, sizeof(op->status_header),
                             op->text.data(), op->text.size(), &params));
}

ucs_status_t UcxTransport::OnRequest(const void* header, size_t header_length, void* data,
                                     size_t length, const ucp_am_recv_param_t* param) {
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == nullptr) {
    return UCS_OK;  // nobody to answer
  }
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    return UCS_ERR_UNSUPPORTED;  // requests are always eager; fails the sender's send
  }
  ucp_ep_h ep = param->reply_ep;
  uint64_t request_id = 0;
  if (header_length >= sizeof(RequestHeader)) {
    std::memcpy(&request_id, static_cast<const char*>(header) + 8, sizeof(request_id));
  }
  Result<DecodedRequest> req = DecodeRequest(header, header_length, data, length);
  if (!req.ok()) {
    SendStatus(ep, request_id, req.status());
    return UCS_OK;
  }
  const std::vector<uint64_t> starts = StreamStarts(req->runs.data(), req->runs.size());
  const uint64_t total = starts.back();
  if (Status bound = CheckServeBounds(ep, total); !bound.ok()) {  // before any other work
    ++requests_refused_;
    SendStatus(ep, request_id, bound);
    return UCS_OK;
  }
  Result<Region> region =
      FindRegion(lookup_, req->region, req->capability, options_.probe_key, &probe_refused_);
  Status s = region.ok() ? CheckRuns(req->region, region->size, req->runs.data(), req->runs.size())
                         : region.status();
  if (!s.ok()) {
    SendStatus(ep, request_id, s);
    return UCS_OK;
  }
  if (total == 0) {
    SendStatus(ep, request_id, Status::Ok());
    return UCS_OK;
  }
  auto shared = std::make_shared<const Region>(std::move(region).value());
  const char* base = static_cast<const char*>(shared->data);
  for (auto [begin, end] :
       PlanMessages(starts, options_.max_message_bytes, kPackedBytes, kDirectBytes)) {
    Op* op = new Op(Op::kServeData, this);
    op->region = shared;
    op->length = end - begin;
    op->data_header = DataHeader{kProtocolVersion, 0, request_id, begin};
    ForEachPiece(starts, begin, end, [&](std::size_t i, uint64_t off, uint64_t len) {
      op->iov.push_back({const_cast<char*>(base + req->runs[i].offset + off), len});
    });
    op->served_ep = ep;
    served_inflight_[ep] += op->length;
    const void* buffer = op->iov[0].buffer;
    std::size_t count = op->length;
    ucp_request_param_t params = SendParams(op);
    params.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    params.memory_type = UCS_MEMORY_TYPE_HOST;
    if (op->iov.size() > 1 && staged_bytes_ + kPackedBytes <= options_.max_staged_bytes) {
      op->staging = TakeBuffer(op->length);
      op->staged = true;
      staged_bytes_ += op->staging.size;
      peak_staged_bytes_ = std::max<uint64_t>(peak_staged_bytes_, staged_bytes_);
      char* at = op->staging.data.get();
      for (const ucp_dt_iov_t& piece : op->iov) {
        std::memcpy(at, piece.buffer, piece.length);
        at += piece.length;
      }
      buffer = op->staging.data.get();
    } else if (op->iov.size() > 1) {  // staging is full: the pieces in place, no memory
      buffer = op->iov.data();
      count = op->iov.size();
      params.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
      params.datatype = ucp_dt_make_iov();
    }
    Track(op);
    if (!Posted(op, ucp_am_send_nbx(ep, kFetchData, &op->data_header, sizeof(op->data_header),
                                    buffer, count, &params))) {
      break;  // the connection failed; the client sees it too
    }
  }
  return UCS_OK;
}

}  // namespace tenplex::transport::ucx
