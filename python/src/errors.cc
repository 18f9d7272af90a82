// Status -> Python exception, in one place. tenplex.Error is the base class; bad input
// also derives from ValueError, missing things from KeyError/LookupError.
#include "bindings.h"

namespace tenplex::py {

namespace {
pyb::object* g_error = nullptr;
pyb::object* g_invalid = nullptr;
pyb::object* g_not_found = nullptr;
pyb::object* g_unavailable = nullptr;
pyb::object* g_exhausted = nullptr;
}  // namespace

void register_errors(pyb::module_& m) {
  static pyb::exception<std::runtime_error> error(m, "Error");
  g_error = new pyb::object(error);
  pyb::object builtins = pyb::module_::import("builtins");
  auto sub = [&](const char* name, pyb::object extra) {
    pyb::object cls = builtins.attr("type")(name, pyb::make_tuple(*g_error, extra), pyb::dict());
    cls.attr("__module__") = "tenplex";
    m.attr(name) = cls;
    return new pyb::object(cls);
  };
  g_invalid = sub("InvalidArgumentError", builtins.attr("ValueError"));
  g_not_found = sub("NotFoundError", builtins.attr("LookupError"));
  g_unavailable = sub("UnavailableError", builtins.attr("ConnectionError"));
  g_exhausted = sub("ResourceExhaustedError", builtins.attr("MemoryError"));
}

void Check(const Status& s) {
  if (s.ok()) return;
  pyb::object* cls = g_error;
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kDataLoss:
      cls = g_invalid;
      break;
    case StatusCode::kNotFound:
      cls = g_not_found;
      break;
    case StatusCode::kUnavailable:
      cls = g_unavailable;
      break;
    case StatusCode::kResourceExhausted:
      cls = g_exhausted;
      break;
    default:
      break;
  }
  PyErr_SetString(cls->ptr(), s.message().c_str());
  throw pyb::error_already_set();
}

}  // namespace tenplex::py
