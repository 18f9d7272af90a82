#include "tenplex/data/order.h"

#include <algorithm>
#include <limits>
#include <string>

#include "tenplex/util/apportion.h"

namespace tenplex::data {

Result<Slice> RankSlice(uint64_t global_batch, uint64_t dp, uint64_t rank) {
  if (global_batch == 0) return InvalidArgument("global batch must be positive");
  if (dp == 0) return InvalidArgument("dp must be positive");
  if (dp > global_batch) {
    return InvalidArgument("dp " + std::to_string(dp) + " is larger than the global batch " +
                           std::to_string(global_batch) + ": some ranks would get no samples");
  }
  if (rank >= dp) {
    return InvalidArgument("rank " + std::to_string(rank) + " is not below dp " +
                           std::to_string(dp));
  }
  const uint64_t q = global_batch / dp, m = global_batch % dp;
  auto begin = [&](uint64_t r) { return r * q + std::min(r, m); };
  return Slice{begin(rank), begin(rank + 1)};
}

Result<Slice> WeightedRankSlice(uint64_t global_batch, uint64_t dp, const std::vector<int>& weights,
                                uint64_t rank) {
  if (weights.empty()) return RankSlice(global_batch, dp, rank);
  if (weights.size() != dp) {
    return InvalidArgument("dp weights " + JoinWeights(weights) + " list " +
                           std::to_string(weights.size()) + " ranks but dp is " +
                           std::to_string(dp));
  }
  if (global_batch == 0) return InvalidArgument("global batch must be positive");
  if (global_batch > (uint64_t{1} << 62)) return InvalidArgument("global batch is too large");
  if (rank >= dp) {
    return InvalidArgument("rank " + std::to_string(rank) + " is not below dp " +
                           std::to_string(dp));
  }
  const std::vector<int64_t> n = Apportion(static_cast<int64_t>(global_batch), weights);
  for (std::size_t j = 0; j < n.size(); ++j) {
    if (n[j] == 0) {
      return InvalidArgument("dp_weights=" + JoinWeights(weights) + " gives dp rank " +
                             std::to_string(j) + " no samples of the global batch of " +
                             std::to_string(global_batch) + "; every rank needs at least one");
    }
  }
  Slice s;
  for (uint64_t j = 0; j < rank; ++j) s.begin += n[j];
  s.end = s.begin + n[rank];
  return s;
}

Result<GlobalOrder> GlobalOrder::Create(const OrderSpec& spec) {
  if (spec.global_batch == 0) return InvalidArgument("global batch must be positive");
  if (spec.num_samples < spec.global_batch) {
    return InvalidArgument("the dataset has " + std::to_string(spec.num_samples) +
                           " samples, fewer than one global batch of " +
                           std::to_string(spec.global_batch));
  }
  GlobalOrder o;
  o.spec_ = spec;
  o.batches_per_epoch_ = spec.num_samples / spec.global_batch;
  return o;
}

Result<StepInfo> GlobalOrder::Locate(uint64_t position) const {
  if (position % spec_.global_batch != 0) {
    return InvalidArgument(
        "start sample " + std::to_string(position) + " is not a multiple of the global batch " +
        std::to_string(spec_.global_batch) + " (positions lie on step boundaries)");
  }
  return LocateStep(position / spec_.global_batch);
}

StepInfo GlobalOrder::LocateStep(uint64_t step) const {
  return StepInfo{step, step / batches_per_epoch_, step % batches_per_epoch_};
}

const Permutation& GlobalOrder::Epoch(uint64_t epoch) {
  if (!cached_ || cached_epoch_ != epoch) {
    cached_ = std::make_shared<const Permutation>(
        Permutation::ForEpoch(spec_.num_samples, spec_.seed, epoch));
    cached_epoch_ = epoch;
  }
  return *cached_;
}

void GlobalOrder::AppendBatch(uint64_t step, Slice slice, std::vector<uint64_t>* out) {
  StepInfo s = LocateStep(step);
  const Permutation& p = Epoch(s.epoch);
  const uint64_t base = s.batch_in_epoch * spec_.global_batch;
  for (uint64_t i = slice.begin; i < slice.end; ++i) out->push_back(p[base + i]);
}

}  // namespace tenplex::data
