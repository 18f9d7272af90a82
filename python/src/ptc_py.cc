// Layouts and configs from the C++ implementation (the Python package also has a pure
// Python re-implementation, tenplex.layout, tested against this one).
#include <pybind11/stl.h>

#include "bindings.h"
#include "tenplex/model/model.h"
#include "tenplex/ptc/layout.h"

namespace tenplex::py {

void register_ptc(pyb::module_& m) {
  m.def("parse_config", [](const std::string& c) { return Take(ParseConfig(c)).ToString(); },
        "Canonical form of a parallel config string");
  m.def(
      "layout_json",
      [](const std::string& model, const std::string& config) {
        Model md = model.find('{') != std::string::npos ? Take(ModelFromJson(model)) : Take(LoadModel(model));
        return LayoutToJson(Take(MakeLayout(md, Take(ParseConfig(config)))));
      },
      pyb::arg("model"), pyb::arg("config"),
      "Spec §6 JSON of a layout; model is a JSON text, a file or a preset name");
}

}  // namespace tenplex::py
