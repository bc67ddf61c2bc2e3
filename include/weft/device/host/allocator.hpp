// The host allocator: 64-byte aligned blocks with current and peak bytes per category.
//
// One allocator per rank (each thread rank owns its Host device), so the numbers are per rank and
// need no atomics. Categories let later parts assert memory formulas per kind of buffer (ZeRO-1's
// optimizer state at about 1/d, say) instead of one total.
//
// Released blocks of kCacheFrom bytes and more are kept, by size, and handed out again for a
// request of the same rounded size: a training step asks for the same sizes every step, and the C
// library would give them back to the kernel and fault them in again page by page, every step.
// The cache never makes the allocator hold more than the most it has had in use at once (in use +
// cached <= that high-water mark): a miss that would pass it frees cached blocks first. The statistics count blocks in
// use only; cached() tells the rest, empty_cache() frees it. Under AddressSanitizer cached blocks are poisoned, so a
// use after release still reports.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <unordered_map>
#include <vector>

#include "weft/core/sanitizer.hpp"
#if WEFT_ASAN
#include <sanitizer/asan_interface.h>
#endif

#include "weft/core/error.hpp"
#include "weft/device/allocation.hpp"

namespace weft {

class HostAllocator final : public Releaser {
 public:
  static constexpr std::size_t alignment = 64;
  static constexpr std::size_t kCacheFrom = std::size_t{64} << 10;  // 64 KiB: below, malloc's own heap is fast

  HostAllocator() = default;
  HostAllocator(const HostAllocator&) = delete;
  HostAllocator& operator=(const HostAllocator&) = delete;
  ~HostAllocator() { empty_cache(); }

  Allocation allocate(std::int64_t bytes, Category c = Category::other) {
    if (bytes < 0) throw Error("HostAllocator", cat("requested ", bytes, " bytes"), "request a size >= 0");
    const auto rounded = round_up(bytes);
    void* p = rounded >= kCacheFrom ? from_cache(rounded) : nullptr;
    if (!p && rounded > 0) {
      if (in_use_ + rounded + cached_ > std::max(high_water_, in_use_ + rounded)) trim(in_use_ + rounded);
      p = ::operator new(rounded, std::align_val_t{alignment}, std::nothrow);
      if (!p && cached_ > 0) {  // what the cache holds may be what is missing
        empty_cache();
        p = ::operator new(rounded, std::align_val_t{alignment}, std::nothrow);
      }
      if (!p)
        throw Error("HostAllocator",
                    cat("out of memory allocating ", bytes, " bytes of ", name(c), " with ", stats_.total_current,
                        " bytes in use"),
                    "reduce the batch or model size, or use more ranks");
    }
    in_use_ += rounded;
    high_water_ = std::max(high_water_, in_use_);
    stats_.on_allocate(bytes, c);
    return Allocation(this, p, bytes, c);
  }

  const MemoryStats& stats() const { return stats_; }
  // Starts a new peak measurement from the current usage.
  void reset_peak() { stats_.reset_peak(); }

  // Bytes held in released blocks kept for reuse (not in the statistics).
  std::int64_t cached() const { return static_cast<std::int64_t>(cached_); }
  // Frees every cached block.
  void empty_cache() noexcept { trim(0); }

 private:
  // A request's size in whole alignment units: what it holds in use and what the cache files it under.
  static std::size_t round_up(std::int64_t bytes) noexcept {
    return (static_cast<std::size_t>(bytes) + alignment - 1) / alignment * alignment;
  }
  // Marks a cached block unusable (usable = false) or usable again for AddressSanitizer; nothing
  // without it.
  static void mark(void* p, std::size_t n, bool usable) noexcept {
#if WEFT_ASAN
    if (usable) ASAN_UNPOISON_MEMORY_REGION(p, n);
    else ASAN_POISON_MEMORY_REGION(p, n);
#else
    (void)p, (void)n, (void)usable;
#endif
  }

  void* from_cache(std::size_t rounded) {
    const auto it = cache_.find(rounded);
    if (it == cache_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_ -= rounded;
    mark(p, rounded, true);
    return p;
  }
  // Frees cached blocks until in_use (after a request) + cached <= max(high water, in_use), or
  // the cache is empty (in_use = 0 frees all).
  void trim(std::size_t in_use) noexcept {
    for (auto& [size, blocks] : cache_)
      while (!blocks.empty() && (in_use == 0 || in_use + cached_ > std::max(high_water_, in_use))) {
        mark(blocks.back(), size, true);
        ::operator delete(blocks.back(), std::align_val_t{alignment});
        blocks.pop_back();
        cached_ -= size;
      }
  }
  void release(void* p, std::int64_t bytes, Category c) noexcept override {
    const auto rounded = round_up(bytes);
    in_use_ -= rounded;
    stats_.on_release(bytes, c);
    if (!p) return;
    if (rounded >= kCacheFrom) {
      try {
        cache_[rounded].push_back(p);
        cached_ += rounded;
        mark(p, rounded, false);
        return;
      } catch (...) {  // no memory for the list: free the block instead
      }
    }
    ::operator delete(p, std::align_val_t{alignment});
  }

  MemoryStats stats_;
  std::unordered_map<std::size_t, std::vector<void*>> cache_;  // rounded size -> released blocks
  std::size_t cached_ = 0, in_use_ = 0, high_water_ = 0;       // rounded bytes
};

}  // namespace weft
