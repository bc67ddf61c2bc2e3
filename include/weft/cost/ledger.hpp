// weft::footprint::Ledger: bytes by category, running and peak, counted as the allocators count
// them (MemoryStats); and StepPeak, what a replayed step reports. The step's replay (step.hpp)
// adds and removes every tensor on a Ledger in the order the code allocates and frees them.
// Plain C++20, constexpr.
#pragma once

#include <cstdint>

#include "weft/cost/memory.hpp"

namespace weft::footprint {

// Running and peak bytes per category and in total, as MemoryStats counts them.
class Ledger {
 public:
  constexpr explicit Ledger(const Memory& start) : current_(start) {
    peak_ = start;
    total_ = start.total();
    total_peak_ = total_;
  }
  constexpr void add(Category c, std::int64_t bytes) {
    const auto i = static_cast<std::size_t>(c);
    current_.bytes[i] += bytes;
    allocated_.bytes[i] += bytes;
    if (bytes > 0) ++allocations_;
    if (current_.bytes[i] > peak_.bytes[i]) peak_.bytes[i] = current_.bytes[i];
    total_ += bytes;
    if (total_ > total_peak_) total_peak_ = total_;
  }
  constexpr void sub(Category c, std::int64_t bytes) {
    current_.bytes[static_cast<std::size_t>(c)] -= bytes;
    total_ -= bytes;
  }
  constexpr const Memory& current() const { return current_; }
  constexpr const Memory& peak() const { return peak_; }
  constexpr std::int64_t total_peak() const { return total_peak_; }
  constexpr const Memory& allocated() const { return allocated_; }     // every byte allocated, summed
  constexpr std::int64_t allocations() const { return allocations_; }  // and every non-empty block

 private:
  Memory current_, peak_, allocated_;
  std::int64_t total_ = 0, total_peak_ = 0, allocations_ = 0;
};

// A step's plan: the peak of each category (each at its own moment), the peak of their sum, what
// is held after the step (the persistent state again, when every transient was freed), and the
// bytes allocated during the step (each buffer written once: the time model's memory traffic)
// and how many blocks (tests/models/gpt2/replay.cpp holds the allocator's counts to both).
struct StepPeak {
  Memory peak;
  std::int64_t total = 0;
  Memory after;
  Memory allocated;
  std::int64_t allocations = 0;
};

}  // namespace weft::footprint
