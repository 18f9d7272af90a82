#include "tenplex/util/status.h"

#include <cstring>

namespace tenplex {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case StatusCode::kUnauthenticated:
      return "UNAUTHENTICATED";
    case StatusCode::kAborted:
      return "ABORTED";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

#define TP_DEFINE_ERROR_(Name, Code) \
  Status Name(std::string message) { return Status(StatusCode::Code, std::move(message)); }
TP_DEFINE_ERROR_(InvalidArgument, kInvalidArgument)
TP_DEFINE_ERROR_(NotFound, kNotFound)
TP_DEFINE_ERROR_(AlreadyExists, kAlreadyExists)
TP_DEFINE_ERROR_(OutOfRange, kOutOfRange)
TP_DEFINE_ERROR_(FailedPrecondition, kFailedPrecondition)
TP_DEFINE_ERROR_(ResourceExhausted, kResourceExhausted)
TP_DEFINE_ERROR_(DataLoss, kDataLoss)
TP_DEFINE_ERROR_(Unavailable, kUnavailable)
TP_DEFINE_ERROR_(PermissionDenied, kPermissionDenied)
TP_DEFINE_ERROR_(Unauthenticated, kUnauthenticated)
TP_DEFINE_ERROR_(Aborted, kAborted)
TP_DEFINE_ERROR_(Internal, kInternal)
TP_DEFINE_ERROR_(Unimplemented, kUnimplemented)
#undef TP_DEFINE_ERROR_

Status ErrnoError(std::string_view what, int err) {
  StatusCode code = StatusCode::kInternal;
  if (err == ENOENT) code = StatusCode::kNotFound;
  if (err == EEXIST) code = StatusCode::kAlreadyExists;
  if (err == EACCES || err == EPERM) code = StatusCode::kPermissionDenied;
  if (err == ENOMEM || err == ENOSPC) code = StatusCode::kResourceExhausted;
  return Status(code, std::string(what) + ": " + std::strerror(err));
}

}  // namespace tenplex
