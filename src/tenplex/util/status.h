// Errors as values. A `Status` is ok or carries a code and a message naming what is
// wrong; `Result<T>` holds either a value or a non-ok Status (like absl::StatusOr).
// Errors are converted to process exit codes, HTTP codes and Python exceptions in one
// place each; library code never throws and never exits.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tenplex {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad input from a user: malformed JSON, impossible config, ...
  kNotFound,
  kAlreadyExists,
  kOutOfRange,
  kFailedPrecondition,
  kResourceExhausted,  // memory limit
  kDataLoss,           // corrupt or truncated file
  kUnavailable,        // a peer does not answer
  kPermissionDenied,
  kUnauthenticated,
  kAborted,
  kInternal,
  kUnimplemented,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message".
  std::string ToString() const;
  // Returns a copy whose message is "context: message".
  Status WithContext(std::string_view context) const;

  static Status Ok() { return Status(); }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status InvalidArgument(std::string message);
Status NotFound(std::string message);
Status AlreadyExists(std::string message);
Status OutOfRange(std::string message);
Status FailedPrecondition(std::string message);
Status ResourceExhausted(std::string message);
Status DataLoss(std::string message);
Status Unavailable(std::string message);
Status PermissionDenied(std::string message);
Status Unauthenticated(std::string message);
Status Aborted(std::string message);
Status Internal(std::string message);
Status Unimplemented(std::string message);
// An error from errno: "what: strerror(errno)".
Status ErrnoError(std::string_view what, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tenplex

#define TP_CONCAT_INNER_(a, b) a##b
#define TP_CONCAT_(a, b) TP_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is not ok.
#define TP_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::tenplex::Status tp_status_ = (expr);   \
    if (!tp_status_.ok()) return tp_status_; \
  } while (0)

// `TP_ASSIGN_OR_RETURN(auto x, F())` declares x from a Result or returns its error.
#define TP_ASSIGN_OR_RETURN(lhs, expr) \
  TP_ASSIGN_OR_RETURN_IMPL_(TP_CONCAT_(tp_result_, __LINE__), lhs, expr)
#define TP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
