// IntervalVec: the dimensions of a Box, stored inline up to kInline intervals.
//
// A plan at 10,000 GPUs holds about a million copy ops of three boxes each; with a
// std::vector per box the planner spent a third of its time in malloc and in faulting
// in the allocator's pages. Tensors of a transformer have rank 1 or 2 (3 for a few
// imported ones), so IntervalVec keeps up to three intervals in the object itself and
// falls back to one heap block beyond that. It offers the subset of std::vector that
// boxes use (size, [], iteration, push_back, resize, reserve, comparisons) with the same
// meaning, so code written against std::vector<Interval> reads the same.
#pragma once

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace tenplex {

struct Interval {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  friend bool operator==(const Interval&, const Interval&) = default;
  friend auto operator<=>(const Interval&, const Interval&) = default;
};

class IntervalVec {
 public:
  static constexpr std::size_t kInline = 3;

  IntervalVec() = default;
  IntervalVec(std::initializer_list<Interval> l) { Assign(l.begin(), l.size()); }
  IntervalVec(const std::vector<Interval>& v) { Assign(v.data(), v.size()); }  // NOLINT
  IntervalVec(const IntervalVec& o) { Assign(o.data(), o.size()); }
  IntervalVec(IntervalVec&& o) noexcept { Take(o); }
  IntervalVec& operator=(const IntervalVec& o) {
    if (this != &o) {
      size_ = 0;
      Assign(o.data(), o.size());
    }
    return *this;
  }
  IntervalVec& operator=(IntervalVec&& o) noexcept {
    if (this != &o) {
      Free();
      Take(o);
    }
    return *this;
  }
  ~IntervalVec() { Free(); }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Interval* data() { return OnHeap() ? heap_ : inline_; }
  const Interval* data() const { return OnHeap() ? heap_ : inline_; }
  Interval& operator[](std::size_t i) { return data()[i]; }
  const Interval& operator[](std::size_t i) const { return data()[i]; }
  Interval* begin() { return data(); }
  Interval* end() { return data() + size_; }
  const Interval* begin() const { return data(); }
  const Interval* end() const { return data() + size_; }
  Interval& back() { return data()[size_ - 1]; }
  const Interval& back() const { return data()[size_ - 1]; }

  void reserve(std::size_t n) {
    if (n > cap_) Grow(n);
  }
  void push_back(const Interval& iv) {
    if (size_ == cap_) Grow(2 * cap_);
    data()[size_++] = iv;
  }
  // New elements are {0, 0}, as std::vector's value-initialisation.
  void resize(std::size_t n) {
    reserve(n);
    for (std::size_t i = size_; i < n; ++i) data()[i] = Interval{};
    size_ = static_cast<uint32_t>(n);
  }
  void clear() { size_ = 0; }

  friend bool operator==(const IntervalVec& a, const IntervalVec& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend std::strong_ordering operator<=>(const IntervalVec& a, const IntervalVec& b) {
    return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  bool OnHeap() const { return cap_ > kInline; }
  void Assign(const Interval* p, std::size_t n) {
    reserve(n);
    std::copy(p, p + n, data());
    size_ = static_cast<uint32_t>(n);
  }
  void Grow(std::size_t n) {
    Interval* fresh = new Interval[n];
    std::copy(begin(), end(), fresh);
    Free();
    heap_ = fresh;
    cap_ = static_cast<uint32_t>(n);
  }
  void Free() {
    if (OnHeap()) delete[] heap_;
    cap_ = kInline;
  }
  // Leaves o empty and inline.
  void Take(IntervalVec& o) {
    if (o.OnHeap()) {
      heap_ = o.heap_;
      cap_ = o.cap_;
      o.cap_ = kInline;
    } else {
      std::copy(o.begin(), o.end(), inline_);
      cap_ = kInline;
    }
    size_ = o.size_;
    o.size_ = 0;
  }

  union {
    Interval inline_[kInline] = {};
    Interval* heap_;
  };
  uint32_t size_ = 0;
  uint32_t cap_ = kInline;
};

}  // namespace tenplex
