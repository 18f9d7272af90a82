#include <algorithm>
#include <memory>

#include "tenplex/geometry/copy.h"
#include "tenplex/store/server_internal.h"
#include "tenplex/util/format.h"
#include "tenplex/util/json_depth.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::store {

Status Server::Impl::Tensors(const httplib::Request& req, Body& body, const Target& t,
                             const std::string& path, httplib::Response& res) {
  if (req.method == "GET") return GetTensor(t, path, res);
  if (req.method == "PUT") return PutTensor(req, body, t, path, res);
  if (req.method == "DELETE") {
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    TP_RETURN_IF_ERROR(store.Delete(path));
    res.status = 204;
    return Status::Ok();
  }
  SendError(res, 405, req.method + " is not allowed on tensors (GET, PUT, DELETE)",
            "INVALID_ARGUMENT");
  return Status::Ok();
}

Status Server::Impl::GetTensor(const Target& t, const std::string& path, httplib::Response& res) {
  TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {"range"}));
  auto r = t.query.find("range");
  TP_ASSIGN_OR_RETURN(std::vector<RangeItem> items,
                      ParseRange(r == t.query.end() ? "" : r->second));
  TP_ASSIGN_OR_RETURN(TensorRef ref, store.Get(path));
  const TensorInfo info = ref.info();  // a copy: ref is moved into the stream below
  TP_ASSIGN_OR_RETURN(Box box, ResolveRange(items, info.shape));
  const std::size_t elem = DTypeSize(info.dtype);
  const Shape extents = box.extents();
  const uint64_t bytes = static_cast<uint64_t>(Volume(box)) * elem;
  res.status = 200;
  res.set_header("X-Tensor-Dtype", std::string(DTypeName(info.dtype)));
  res.set_header("X-Tensor-Shape", ShapeToString(extents));
  res.set_header("X-Tensor-Path", info.path);
  if (bytes == 0) {
    res.set_content("", "application/octet-stream");
    return Status::Ok();
  }
  // A contiguous box streams straight from the shared memory; any other box is
  // gathered by the strided copy, a slab of whole dim-0 rows (about kStreamChunk
  // bytes) per provider call into one reused buffer.
  auto holder = std::make_shared<TensorRef>(std::move(ref));
  if (IsContiguous(info.shape, box)) {
    const uint8_t* base =
        holder->data() + static_cast<uint64_t>(FlatOffset(info.shape, box)) * elem;
    res.set_content_provider(
        bytes, "application/octet-stream",
        [holder, base, bytes](std::size_t offset, std::size_t length, httplib::DataSink& sink) {
          if (offset >= bytes) return false;
          std::size_t n = std::min<std::size_t>({length, kStreamChunk, bytes - offset});
          return sink.write(reinterpret_cast<const char*>(base + offset), n);
        });
    return Status::Ok();
  }
  const uint64_t row_bytes =
      bytes / static_cast<uint64_t>(extents[0]);  // a non-contiguous box has rank >= 2
  const int64_t rows_per = static_cast<int64_t>(std::max<uint64_t>(1, kStreamChunk / row_bytes));
  const uint64_t slab_bytes = static_cast<uint64_t>(rows_per) * row_bytes;
  auto buffer = std::make_shared<std::vector<uint8_t>>();
  res.set_content_provider(
      bytes, "application/octet-stream",
      [holder, buffer, box, extents, elem, rows_per, slab_bytes, row_bytes](
          std::size_t offset, std::size_t, httplib::DataSink& sink) {
        if (offset % slab_bytes != 0) return false;  // every call writes one whole slab
        const int64_t r0 = static_cast<int64_t>(offset / slab_bytes) * rows_per;
        const int64_t r1 = std::min(extents[0], r0 + rows_per);
        if (r0 >= r1) return false;
        Box sub = box;
        sub[0] = Interval{box[0].begin + r0, box[0].begin + r1};
        const Shape sub_ext = sub.extents();
        const std::size_t n = static_cast<std::size_t>(r1 - r0) * row_bytes;
        if (buffer->size() < n) buffer->resize(n);
        Status s = CopyBox(ConstRegion{holder->data(), holder->info().shape, sub},
                           MutRegion{buffer->data(), sub_ext, BoxOf(sub_ext)}, elem,
                           &ThreadPool::Default());
        return s.ok() && sink.write(reinterpret_cast<const char*>(buffer->data()), n);
      });
  return Status::Ok();
}

Status Server::Impl::PutTensor(const httplib::Request& req, Body& body, const Target& t,
                               const std::string& path, httplib::Response& res) {
  TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {"dtype", "shape"}));
  auto dtype_text = ParamOrHeader(t, req, "dtype", "X-Tensor-Dtype");
  if (!dtype_text.ok()) {
    if (dtype_text.status().code() != StatusCode::kNotFound) return dtype_text.status();
    return InvalidArgument("PUT needs ?dtype= (or X-Tensor-Dtype)");
  }
  auto shape_text = ParamOrHeader(t, req, "shape", "X-Tensor-Shape");
  if (!shape_text.ok()) {
    if (shape_text.status().code() != StatusCode::kNotFound) return shape_text.status();
    return InvalidArgument("PUT needs ?shape= (or X-Tensor-Shape; empty for a scalar)");
  }
  TP_ASSIGN_OR_RETURN(DType dtype, ParseDType(*dtype_text));
  TP_ASSIGN_OR_RETURN(Shape shape, ParseShape(*shape_text, dtype));
  const uint64_t want = static_cast<uint64_t>(Volume(shape)) * DTypeSize(dtype);
  if (want > options.max_body_bytes) {
    SendError(res, 413,
              "a tensor of " + std::to_string(want) +
                  " bytes is larger than the store's body limit of " +
                  std::to_string(options.max_body_bytes) +
                  " bytes (--max-body); local clients use shared memory",
              "INVALID_ARGUMENT");
    return Status::Ok();
  }
  if (req.has_header("Content-Length")) {
    const std::string len = req.get_header_value("Content-Length");
    if (len != std::to_string(want)) {
      return InvalidArgument("body has " + len + " bytes but dtype " +
                             std::string(DTypeName(dtype)) + " x shape [" + ShapeToString(shape) +
                             "] needs " + std::to_string(want));
    }
  }
  // The body goes from the socket into the new tensor's file in large writes; the
  // tensor is published only when every byte arrived.
  auto fill = [&](TensorSink& sink) -> Status {
    std::string buf;
    buf.reserve(static_cast<std::size_t>(std::min<uint64_t>(want, kStreamChunk)));
    Status st;
    bool ok = body.Stream([&](const char* data, std::size_t n) {
      if (n > want - sink.written() - buf.size()) {
        st = InvalidArgument("body is longer than the " + std::to_string(want) +
                             " bytes dtype x shape needs");
        return false;
      }
      buf.append(data, n);
      if (buf.size() >= kStreamChunk) {
        st = sink.Write(buf.data(), buf.size());
        buf.clear();
      }
      return st.ok();
    });
    if (st.ok() && !buf.empty()) st = sink.Write(buf.data(), buf.size());
    if (st.ok() && !ok)
      st = InvalidArgument(
          "the request body ended early or could not be read (or passed --max-body)");
    return st;
  };
  TP_ASSIGN_OR_RETURN(TensorInfo info, store.PutFrom(path, dtype, shape, fill));
  SendJson(res, 201, TensorJson(info, false));
  return Status::Ok();
}

Status Server::Impl::Alloc(const httplib::Request& req, Body& request_body, const Target& t,
                           httplib::Response& res) {
  TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
  TP_RETURN_IF_ERROR(RequireLocal(req));
  TP_ASSIGN_OR_RETURN(std::string text, request_body.Text());
  TP_RETURN_IF_ERROR(CheckJsonDepth(text, "POST /v1/alloc body"));
  json body = json::parse(text, nullptr, false);
  if (body.is_discarded() || !body.is_object() || !body.contains("tensors") ||
      !body["tensors"].is_array()) {
    return InvalidArgument(
        "POST /v1/alloc needs a JSON body {\"tensors\": [{\"path\", \"dtype\", \"shape\"}, ...]}");
  }
  std::vector<Store::AllocRequest> reqs;
  for (const json& e : body["tensors"]) {
    if (!e.is_object() || !e.contains("path") || !e["path"].is_string() || !e.contains("dtype") ||
        !e["dtype"].is_string() || !e.contains("shape") || !e["shape"].is_array()) {
      return InvalidArgument("each tensor of /v1/alloc needs path, dtype and shape");
    }
    Store::AllocRequest r;
    r.path = e["path"].get<std::string>();
    TP_ASSIGN_OR_RETURN(r.dtype, ParseDType(e["dtype"].get<std::string>()));
    if (e["shape"].size() > kMaxRank) return InvalidArgument(r.path + ": too many dimensions");
    for (const json& d : e["shape"]) {
      if (!d.is_number_integer())
        return InvalidArgument(r.path + ": shape entries must be integers");
      r.shape.push_back(d.get<int64_t>());
    }
    reqs.push_back(std::move(r));
  }
  bool zero_fill = true;
  if (body.contains("fill")) {
    if (!body["fill"].is_string() || (body["fill"] != "zero" && body["fill"] != "none")) {
      return InvalidArgument(
          "/v1/alloc: \"fill\" is \"zero\" (default) or \"none\" (sparse; write every byte)");
    }
    zero_fill = body["fill"] == "zero";
  }
  TP_ASSIGN_OR_RETURN(std::vector<TensorInfo> infos, store.AllocateMany(reqs, zero_fill));
  json out = json::array();
  for (const TensorInfo& i : infos) out.push_back(TensorJson(i, true));
  SendJson(res, 201, {{"store_id", store.id()}, {"tensors", out}});
  return Status::Ok();
}

}  // namespace tenplex::store
