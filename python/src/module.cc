#include "bindings.h"

PYBIND11_MODULE(_tenplex, m) {
  m.doc() = "tenplex native module (use the `tenplex` package)";
  tenplex::py::register_errors(m);
  tenplex::py::register_store(m);
  tenplex::py::register_ptc(m);
  tenplex::py::register_data(m);
  tenplex::py::register_device(m);
  tenplex::py::register_cluster(m);
}
