// The native module: one register_<area>(m) per area, errors translated in errors.cc.
#pragma once

#include <pybind11/pybind11.h>

#include "tenplex/util/status.h"

namespace tenplex::py {

namespace pyb = pybind11;

// Throws the Python exception for a non-ok status (the only place that converts).
void Check(const Status& status);
template <typename T>
T Take(Result<T> r) {
  Check(r.status());
  return std::move(r).value();
}

// Runs f without the GIL and returns its result: a request to a daemon waits on the
// network while other Python threads (a training loop, a test's in-process proxy) go on.
template <typename F>
auto NoGil(F&& f) {
  pyb::gil_scoped_release release;
  return f();
}

void register_errors(pyb::module_& m);
void register_store(pyb::module_& m);
void register_ptc(pyb::module_& m);
void register_data(pyb::module_& m);
void register_device(pyb::module_& m);
void register_cluster(pyb::module_& m);

}  // namespace tenplex::py
