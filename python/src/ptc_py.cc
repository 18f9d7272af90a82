// Layouts and configs from the C++ implementation: the one implementation the Python
// package (tenplex.layout) and examples/gpt use. tests/reference/layout_ref.py keeps
// an independent pure-Python copy that the tests compare with this one.
#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include <algorithm>

#include "bindings.h"
#include "tenplex/model/model.h"
#include "tenplex/ptc/config.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/util/apportion.h"

namespace tenplex::py {

namespace {

// A model given as JSON text, a file or a preset name.
Model LoadModelArg(const std::string& model) {
  return model.find('{') != std::string::npos ? Take(ModelFromJson(model)) : Take(LoadModel(model));
}

pyb::list BoxList(const Box& b) {
  pyb::list out;
  for (const Interval& iv : b.dims) out.append(pyb::make_tuple(iv.begin, iv.end));
  return out;
}

pyb::list Pieces(const LocalTensor& t) {
  pyb::list out;
  for (const Piece& p : t.pieces) out.append(pyb::make_tuple(BoxList(p.global), BoxList(p.local)));
  return out;
}

}  // namespace

void register_ptc(pyb::module_& m) {
  pyb::class_<ParallelConfig>(m, "Config",
                              "A parallel configuration tp=2,pp=2,dp=2[,zero=1][,layers=a+b]")
      .def_static(
          "parse", [](const std::string& text) { return Take(ParseConfig(text)); },
          pyb::arg("text"))
      .def_readonly("tp", &ParallelConfig::tp)
      .def_readonly("pp", &ParallelConfig::pp)
      .def_readonly("dp", &ParallelConfig::dp)
      .def_readonly("zero", &ParallelConfig::zero)
      .def_readonly("layers", &ParallelConfig::layers)
      .def_readonly("tp_weights", &ParallelConfig::tp_weights,
                    "Spec §9 weights of the tp ranks as given ([] when none)")
      .def_readonly("dp_weights", &ParallelConfig::dp_weights,
                    "Spec §9 weights of the dp ranks as given ([] when none)")
      .def_property_readonly("world_size", &ParallelConfig::world_size)
      .def("tp_rank", &ParallelConfig::TpRank)
      .def("dp_rank", &ParallelConfig::DpRank)
      .def("pp_rank", &ParallelConfig::PpRank)
      .def("rank_of", &ParallelConfig::RankOf, pyb::arg("tp_rank"), pyb::arg("dp_rank"),
           pyb::arg("pp_rank"))
      .def(pyb::self == pyb::self)
      .def("__hash__",
           [](const ParallelConfig& c) { return std::hash<std::string>()(c.ToString()); })
      .def("__str__", &ParallelConfig::ToString)
      .def("__repr__", [](const ParallelConfig& c) { return "Config('" + c.ToString() + "')"; });
  m.def(
      "parse_config", [](const std::string& c) { return Take(ParseConfig(c)).ToString(); },
      "Canonical form of a parallel config string");
  m.def(
      "apportion",
      [](int64_t units, const std::vector<int>& weights) {
        if (units < 0 || weights.empty() ||
            std::any_of(weights.begin(), weights.end(), [](int w) { return w < 1; })) {
          Check(InvalidArgument("apportion: need units >= 0 and positive weights"));
        }
        return Apportion(units, weights);
      },
      pyb::arg("units"), pyb::arg("weights"),
      "Spec §9 largest-remainder apportionment: units per rank in proportion to weights");
  m.def(
      "canonical_config",
      [](const std::string& model, const ParallelConfig& config) {
        return CanonicalConfig(LoadModelArg(model), config).ToString();
      },
      pyb::arg("model"), pyb::arg("config"),
      "Spec §9 canonical config string: weights dropped where they change nothing");
  m.def(
      "layout_json",
      [](const std::string& model, const std::string& config) {
        return LayoutToJson(Take(MakeLayout(LoadModelArg(model), Take(ParseConfig(config)))));
      },
      pyb::arg("model"), pyb::arg("config"),
      "Spec §6 JSON of a layout; model is a JSON text, a file or a preset name");
  m.def(
      "stage_bounds",
      [](const std::string& model, const ParallelConfig& config) {
        return Take(StageBounds(LoadModelArg(model), config));
      },
      pyb::arg("model"), pyb::arg("config"),
      "First layer of each pipeline stage, plus the number of layers");
  m.def(
      "validate",
      [](const std::string& model, const ParallelConfig& config) {
        Check(ValidateConfig(LoadModelArg(model), config));
      },
      pyb::arg("model"), pyb::arg("config"),
      "Raises InvalidArgumentError naming the rule config breaks");
  m.def(
      "zero_flat_range",
      [](int64_t total, int dp, int dp_rank) {
        if (dp < 1 || dp_rank < 0 || dp_rank >= dp || total < 0) {
          Check(InvalidArgument("zero_flat_range: need total >= 0 and 0 <= dp_rank < dp"));
        }
        FlatRange r = ZeroFlatRange(total, dp, dp_rank);
        return pyb::make_tuple(r.begin, r.end, r.padded);
      },
      pyb::arg("total"), pyb::arg("dp"), pyb::arg("dp_rank"),
      "ZeRO-1: (begin, end, padded total) of a dp rank's range of `total` flat elements");
  m.def(
      "rank_params",
      [](const std::string& model_arg, const ParallelConfig& config, int pp_rank, int tp_rank) {
        Model model = LoadModelArg(model_arg);
        Layout layout = Take(MakeLayout(model, config));
        if (pp_rank < 0 || pp_rank >= config.pp || tp_rank < 0 || tp_rank >= config.tp) {
          Check(InvalidArgument("rank_params: no stage " + std::to_string(pp_rank) + ", tp rank " +
                                std::to_string(tp_rank) + " in " + config.ToString()));
        }
        const RankLayout& r = layout.ranks[config.RankOf(tp_rank, 0, pp_rank)];
        const int first = layout.stage_bounds[pp_rank];
        pyb::list out;
        for (const LocalTensor& t : *r.tensors) {
          if (t.param.empty() || t.name.rfind("optimizer.", 0) == 0) continue;  // optimizer state
          pyb::dict d;
          d["name"] = t.name;
          d["path"] = t.param;
          d["dtype"] = std::string(DTypeName(t.dtype));
          d["shape"] = t.shape;
          d["pieces"] = Pieces(t);
          d["alias"] = t.name != LocalName(model, t.param, first);
          out.append(d);
        }
        return out;
      },
      pyb::arg("model"), pyb::arg("config"), pyb::arg("pp_rank"), pyb::arg("tp_rank"),
      "The local parameters of (stage, tp rank) in spec order, alias replicas last: dicts with "
      "name, path "
      "(global parameter), dtype, shape, pieces [(global box, local box)], alias");
  m.def(
      "rank_tensors",
      [](const std::string& model, const ParallelConfig& config, int rank) {
        Layout layout = Take(MakeLayout(LoadModelArg(model), config));
        if (rank < 0 || rank >= layout.world_size()) Check(InvalidArgument("rank out of range"));
        std::vector<std::tuple<std::string, std::string, Shape>> out;
        for (const LocalTensor& t : *layout.ranks[rank].tensors) {
          out.emplace_back(t.name, std::string(DTypeName(t.dtype)), t.shape);
        }
        return out;
      },
      pyb::arg("model"), pyb::arg("config"), pyb::arg("rank"),
      "[(local name, dtype, shape)] of everything a rank holds, in file order");
}

}  // namespace tenplex::py
