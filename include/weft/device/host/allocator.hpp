// The host allocator: 64-byte aligned blocks with current and peak bytes per category.
//
// One allocator per rank (each thread rank owns its Host device), so the numbers are per rank and
// need no atomics. Categories let later parts assert memory formulas per kind of buffer (ZeRO-1's
// optimizer state at about 1/d, say) instead of one total.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>

#include "weft/core/error.hpp"
#include "weft/device/allocation.hpp"

namespace weft {

class HostAllocator final : public Releaser {
 public:
  static constexpr std::size_t alignment = 64;

  HostAllocator() = default;
  HostAllocator(const HostAllocator&) = delete;
  HostAllocator& operator=(const HostAllocator&) = delete;

  Allocation allocate(std::int64_t bytes, Category c = Category::other) {
    if (bytes < 0) throw Error("HostAllocator", cat("requested ", bytes, " bytes"), "request a size >= 0");
    const auto rounded = static_cast<std::size_t>((bytes + alignment - 1) / alignment * alignment);
    void* p = nullptr;
    if (rounded > 0) {
      p = ::operator new(rounded, std::align_val_t{alignment}, std::nothrow);
      if (!p)
        throw Error("HostAllocator",
                    cat("out of memory allocating ", bytes, " bytes of ", name(c), " with ", stats_.total_current,
                        " bytes in use"),
                    "reduce the batch or model size, or use more ranks");
    }
    stats_.on_allocate(bytes, c);
    return Allocation(this, p, bytes, c);
  }

  const MemoryStats& stats() const { return stats_; }
  // Starts a new peak measurement from the current usage.
  void reset_peak() { stats_.reset_peak(); }

 private:
  void release(void* p, std::int64_t bytes, Category c) noexcept override {
    if (p) ::operator delete(p, std::align_val_t{alignment});
    stats_.on_release(bytes, c);
  }
  MemoryStats stats_;
};

}  // namespace weft
