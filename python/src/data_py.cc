// The dataset order of tenplex.data (C++): a rank's sample ids per step.
#include <pybind11/stl.h>

#include "bindings.h"
#include "tenplex/data/dataset.h"
#include "tenplex/data/order.h"

namespace tenplex::py {

void register_data(pyb::module_& m) {
  m.def(
      "batches",
      [](const std::string& index_dir, uint64_t seed, uint64_t global_batch, uint64_t dp, uint64_t rank,
         uint64_t start_sample, uint64_t steps) {
        auto ds = Take(data::Dataset::Open(index_dir));
        data::GlobalOrder order = Take(data::GlobalOrder::Create({ds->num_samples(), seed, global_batch}));
        data::Slice slice = Take(data::RankSlice(global_batch, dp, rank));
        data::StepInfo first = Take(order.Locate(start_sample));
        std::vector<std::vector<uint64_t>> out;
        for (uint64_t s = 0; s < steps; ++s) {
          std::vector<uint64_t> ids;
          order.AppendBatch(first.step + s, slice, &ids);
          out.push_back(std::move(ids));
        }
        return out;
      },
      pyb::arg("index_dir"), pyb::arg("seed"), pyb::arg("global_batch"), pyb::arg("dp"), pyb::arg("rank"),
      pyb::arg("start_sample"), pyb::arg("steps"), "Sample ids of a data-parallel rank for `steps` steps");
  m.def(
      "sample",
      [](const std::string& index_dir, uint64_t id) {
        auto ds = Take(data::Dataset::Open(index_dir));
        return pyb::bytes(Take(ds->SampleText(id)));
      },
      pyb::arg("index_dir"), pyb::arg("id"), "A sample's bytes (a JSONL line, or a JSON token list)");
}

}  // namespace tenplex::py
