// Each data-parallel rank's samples as files: the virtual file system of the Tenplex
// paper. For a dataset, seed, global batch B, dp and start position P (a multiple of
// B), rank r's file holds the records rank r consumes from step P / B to the end of
// that epoch, in consumption order: step by step, its slice of each global batch
// (order.h). Files are generated on demand and never held in full:
//
//   info.json                  the view's parameters and per-rank sizes
//   rank-00000/samples.jsonl   JSONL datasets: each record is its line plus "\n"
//   rank-00000/samples.bin     Megatron datasets: the rank's sequences' token bytes
//   rank-00000/samples.idx     ... and an MMIDIDX index of them (megatron.h), so that
//                              PREFIX=rank-00000/samples loads in Megatron-LM as is
//                              (one document per sequence).
//
// Reading at offset o: a per-rank table of the byte offset where each step's records
// start (steps + 1 entries, built once from the index's sizes, no data touched) is
// binary-searched for the step holding o; the step's records are then walked (at most
// B / dp of them) to the record holding o, and bytes are copied from the mapped source
// from there on. Memory: the epoch's permutation plus 8 bytes per rank and step.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tenplex/data/dataset.h"
#include "tenplex/data/order.h"
#include "tenplex/util/status.h"

namespace tenplex::data {

struct ViewSpec {
  uint64_t seed = 0;
  uint64_t global_batch = 0;
  uint64_t dp = 0;
  uint64_t start_sample = 0;
  std::vector<int> dp_weights;  // spec §9: dp weights of the slices; empty means equal
};

// A read-only file whose bytes are generated on demand. Thread-safe.
class ViewFile {
 public:
  virtual ~ViewFile() = default;
  virtual uint64_t size() const = 0;
  // Copies min(len, size - offset) bytes at `offset` into `out` and returns the count
  // (0 at or past the end). DataLoss when the source no longer matches its index.
  virtual Result<std::size_t> Read(uint64_t offset, std::size_t len, char* out) const = 0;
};

// Reads a whole ViewFile (tests, small files).
Result<std::string> ReadAll(const ViewFile& f);

// A read-only tree of ViewFiles, what FuseMount serves. Paths are relative, without a
// leading "/" ("" is the root). Thread-safe.
class FileTree {
 public:
  virtual ~FileTree() = default;
  // The file at `path`, or nullptr.
  virtual const ViewFile* File(std::string_view path) const = 0;
  // Whether `path` is a directory.
  virtual bool IsDir(std::string_view path) const = 0;
  // Names directly inside directory `path`; empty if it is not one.
  virtual std::vector<std::string> List(std::string_view path) const = 0;
};

class DatasetView : public FileTree {
 public:
  static Result<std::shared_ptr<const DatasetView>> Create(std::shared_ptr<const Dataset> dataset,
                                                           const ViewSpec& spec);

  const ViewSpec& spec() const { return spec_; }
  StepInfo first_step() const { return first_; }
  uint64_t steps() const { return steps_; }  // steps from P to the end of its epoch
  // Rank r's sample ids in file order (tests; O(records)).
  std::vector<uint64_t> RankSampleIds(uint64_t rank) const;

  // FileTree: "info.json", "rank-00000", "rank-00000/samples.jsonl", ...
  const ViewFile* File(std::string_view path) const override;
  bool IsDir(std::string_view path) const override;
  std::vector<std::string> List(std::string_view path) const override;

  // "rank-00042".
  static std::string RankDir(uint64_t rank);

  // Implementation detail shared by the file kinds (view.cc).
  struct RankRecords;

 private:
  DatasetView() = default;
  ViewSpec spec_;
  StepInfo first_;
  uint64_t steps_ = 0;
  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<const Permutation> perm_;
  std::map<std::string, std::unique_ptr<ViewFile>, std::less<>> files_;
  std::map<std::string, std::vector<std::string>, std::less<>> dirs_;
};

}  // namespace tenplex::data
