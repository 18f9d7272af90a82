// The dataset order and index readers of tenplex.data (C++): the one implementation
// of the global sample order (docs/data.md) that the Python package and examples/gpt use.
#include <pybind11/stl.h>

#include "bindings.h"
#include "tenplex/data/dataset.h"
#include "tenplex/data/order.h"

namespace tenplex::py {

namespace {

std::vector<uint64_t> Batch(data::GlobalOrder& order, uint64_t step, uint64_t begin,
                            std::optional<uint64_t> end) {
  const uint64_t b = order.spec().global_batch;
  const uint64_t e = end.value_or(b);
  if (begin > e || e > b) {
    Check(InvalidArgument("slice [" + std::to_string(begin) + ", " + std::to_string(e) +
                          ") is not within a global batch of " + std::to_string(b)));
  }
  std::vector<uint64_t> ids;
  order.AppendBatch(step, {begin, e}, &ids);
  return ids;
}

}  // namespace

void register_data(pyb::module_& m) {
  m.def(
      "rank_slice",
      [](uint64_t global_batch, uint64_t dp, uint64_t rank, const std::vector<int>& dp_weights) {
        data::Slice s = Take(data::WeightedRankSlice(global_batch, dp, dp_weights, rank));
        return std::make_pair(s.begin, s.end);
      },
      pyb::arg("global_batch"), pyb::arg("dp"), pyb::arg("rank"),
      pyb::arg("dp_weights") = std::vector<int>{},
      "[begin, end) of a data-parallel rank's part of a global batch (the first B mod dp ranks "
      "take one more; with dp_weights, spec §9: shares proportional to the weights)");
  pyb::class_<data::GlobalOrder>(m, "Order",
                                 "The global sample order; caches the last epoch's permutation")
      .def(pyb::init([](uint64_t num_samples, uint64_t seed, uint64_t global_batch) {
             return Take(data::GlobalOrder::Create({num_samples, seed, global_batch}));
           }),
           pyb::arg("num_samples"), pyb::arg("seed"), pyb::arg("global_batch"))
      .def_property_readonly("num_samples",
                             [](const data::GlobalOrder& o) { return o.spec().num_samples; })
      .def_property_readonly("seed", [](const data::GlobalOrder& o) { return o.spec().seed; })
      .def_property_readonly("global_batch",
                             [](const data::GlobalOrder& o) { return o.spec().global_batch; })
      .def_property_readonly("batches_per_epoch", &data::GlobalOrder::batches_per_epoch)
      .def(
          "step_of",
          [](const data::GlobalOrder& o, uint64_t position) {
            return Take(o.Locate(position)).step;
          },
          pyb::arg("position"),
          "Global step at a position (samples consumed, a multiple of the global batch)")
      .def("batch", &Batch, pyb::arg("step"), pyb::arg("begin") = 0, pyb::arg("end") = pyb::none(),
           "Sample ids of global step `step`, or of its slice [begin, end)");
  pyb::class_<data::Dataset, std::shared_ptr<data::Dataset>>(
      m, "Dataset", "An index directory (tenplex data index)")
      .def(pyb::init([](const std::string& index_dir) {
             return std::const_pointer_cast<data::Dataset>(Take(data::Dataset::Open(index_dir)));
           }),
           pyb::arg("index_dir"))
      .def("__len__", &data::Dataset::num_samples)
      .def_property_readonly(
          "format",
          [](const data::Dataset& d) { return std::string(data::DataFormatName(d.format())); })
      .def(
          "sample",
          [](const data::Dataset& d, uint64_t id) { return pyb::bytes(Take(d.SampleText(id))); },
          pyb::arg("id"),
          "A sample's bytes: a JSONL line without its newline, or a JSON list of token ids");
  m.def(
      "batches",
      [](const std::string& index_dir, uint64_t seed, uint64_t global_batch, uint64_t dp,
         uint64_t rank, uint64_t start_sample, uint64_t steps, const std::vector<int>& dp_weights) {
        auto ds = Take(data::Dataset::Open(index_dir));
        data::GlobalOrder order =
            Take(data::GlobalOrder::Create({ds->num_samples(), seed, global_batch}));
        data::Slice slice = Take(data::WeightedRankSlice(global_batch, dp, dp_weights, rank));
        data::StepInfo first = Take(order.Locate(start_sample));
        std::vector<std::vector<uint64_t>> out;
        for (uint64_t s = 0; s < steps; ++s) {
          std::vector<uint64_t> ids;
          order.AppendBatch(first.step + s, slice, &ids);
          out.push_back(std::move(ids));
        }
        return out;
      },
      pyb::arg("index_dir"), pyb::arg("seed"), pyb::arg("global_batch"), pyb::arg("dp"),
      pyb::arg("rank"), pyb::arg("start_sample"), pyb::arg("steps"),
      pyb::arg("dp_weights") = std::vector<int>{},
      "Sample ids of a data-parallel rank for `steps` steps");
  m.def(
      "sample",
      [](const std::string& index_dir, uint64_t id) {
        auto ds = Take(data::Dataset::Open(index_dir));
        return pyb::bytes(Take(ds->SampleText(id)));
      },
      pyb::arg("index_dir"), pyb::arg("id"),
      "A sample's bytes (a JSONL line, or a JSON token list)");
}

}  // namespace tenplex::py
