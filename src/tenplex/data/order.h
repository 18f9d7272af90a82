// The global sample order and each data-parallel rank's part of it.
//
// A job's dataset state is one number, the position P: the count of samples consumed
// since the start of training, across epochs. With N samples and global batch B, an
// epoch holds K = floor(N / B) global batches; the last N - K*B samples of each epoch's
// permutation are dropped (never a partial global batch). Global step g (g = P / B)
// is batch j = g mod K of epoch e = g / K, and holds the samples
//   perm_e[j*B], ..., perm_e[j*B + B - 1]
// where perm_e is the permutation of epoch e (prng.h). Positions are therefore always
// multiples of B: a job changes its parallelism only between steps.
//
// Rank r of dp ranks reads a contiguous slice of every global batch: with q = B / dp
// and m = B mod dp, the first m ranks take q + 1 samples and the others q, so
//   begin(r) = r*q + min(r, m),   end(r) = begin(r + 1),
// sizes differ by at most one, and concatenating the slices of ranks 0..dp-1 gives the
// global batch whatever dp is. With dp weights (spec §9, for devices of different speed)
// the slice sizes are the largest-remainder apportionment of B by the weights instead. Because the
// global sequence does not depend on dp, a job that stops after step g-1 with one dp and resumes at
// P = g*B with another reads every sample exactly once per epoch, as if nothing had changed.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tenplex/data/prng.h"
#include "tenplex/util/status.h"

namespace tenplex::data {

struct Slice {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
};

// Rank `rank`'s slice of a global batch of `global_batch` samples split over `dp`
// ranks. Errors: global_batch or dp zero, dp > global_batch (a rank would get nothing),
// rank >= dp.
Result<Slice> RankSlice(uint64_t global_batch, uint64_t dp, uint64_t rank);

// Spec §9 (dp_weights): dp = weights.size() ranks, rank j reads the contiguous slice of
// n_j = Apportion(global_batch, weights)_j samples at offset sum_{k<j} n_k
// (util/apportion.h); equal weights give RankSlice above. Empty weights mean equal.
// Errors as above, a weights count other than dp, and a rank with 0 samples (naming it).
Result<Slice> WeightedRankSlice(uint64_t global_batch, uint64_t dp, const std::vector<int>& weights,
                                uint64_t rank);

struct OrderSpec {
  uint64_t num_samples = 0;
  uint64_t seed = 0;
  uint64_t global_batch = 0;
};

// Where a position lies: global step, epoch and batch within the epoch.
struct StepInfo {
  uint64_t step = 0;
  uint64_t epoch = 0;
  uint64_t batch_in_epoch = 0;
};

// The global order of a dataset. Caches the permutation of the last epoch asked for.
// Thread-compatible (not thread-safe): use one per thread, or share the immutable
// Permutation of an epoch.
class GlobalOrder {
 public:
  // Errors: global_batch zero, or fewer samples than one global batch.
  static Result<GlobalOrder> Create(const OrderSpec& spec);

  const OrderSpec& spec() const { return spec_; }
  uint64_t batches_per_epoch() const { return batches_per_epoch_; }
  uint64_t samples_per_epoch() const { return batches_per_epoch_ * spec_.global_batch; }

  // The step at position P. Error when P is not a multiple of the global batch.
  Result<StepInfo> Locate(uint64_t position) const;
  StepInfo LocateStep(uint64_t step) const;

  // The permutation of an epoch (computed once, then cached until another epoch is
  // asked for). The reference stays valid until the next call.
  const Permutation& Epoch(uint64_t epoch);

  // Appends the ids of `slice` of global step `step` to *out.
  void AppendBatch(uint64_t step, Slice slice, std::vector<uint64_t>* out);

 private:
  OrderSpec spec_;
  uint64_t batches_per_epoch_ = 0;
  uint64_t cached_epoch_ = 0;
  std::shared_ptr<const Permutation> cached_;
};

}  // namespace tenplex::data
