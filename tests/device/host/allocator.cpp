#include <doctest/doctest.h>

#include <cstdint>

#include "weft/device/host/host.hpp"

using namespace weft;

TEST_CASE("host allocations are 64-byte aligned and counted per category current and peak") {
  Host h;
  {
    Allocation a = h.allocate(100, Category::parameters);
    Allocation b = h.allocate(1000, Category::activations);
    CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 64 == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 64 == 0);
    CHECK(h.memory().current_of(Category::parameters) == 100);
    CHECK(h.memory().current_of(Category::activations) == 1000);
    CHECK(h.memory().total_current == 1100);
    {
      Allocation c = h.allocate(500, Category::activations);
      CHECK(h.memory().peak_of(Category::activations) == 1500);
    }
    CHECK(h.memory().current_of(Category::activations) == 1000);
    CHECK(h.memory().peak_of(Category::activations) == 1500);
    CHECK(h.memory().total_peak == 1600);
    // Moving keeps one owner: the bytes are released once.
    Allocation moved = std::move(b);
    CHECK(b.data() == nullptr);
    CHECK(h.memory().total_current == 1100);
  }
  CHECK(h.memory().total_current == 0);
  h.allocator.reset_peak();
  CHECK(h.memory().total_peak == 0);
}

TEST_CASE("bad sizes raise Error") {
  Host h;
  CHECK_THROWS_WITH_AS(h.allocate(-5), "HostAllocator: requested -5 bytes; request a size >= 0", Error);
  CHECK_THROWS_WITH_AS(h.allocate(std::int64_t{1} << 62), doctest::Contains("out of memory allocating"), Error);
  Allocation empty = h.allocate(0);
  CHECK(empty.bytes() == 0);
}

TEST_CASE("released large blocks are reused for the same size, never holding more than the high-water mark") {
  Host h;
  const std::int64_t big = 1 << 20;  // cached: at least HostAllocator::kCacheFrom
  void* first = nullptr;
  {
    Allocation a = h.allocate(big, Category::activations);
    first = a.data();
  }
  CHECK(h.memory().total_current == 0);  // the statistics count blocks in use only
  CHECK(h.allocator.cached() == big);
  {
    Allocation again = h.allocate(big - 10, Category::gradients);  // the same rounded size: the same block
    CHECK(again.data() == first);
    CHECK(h.allocator.cached() == 0);
    CHECK(h.memory().current_of(Category::gradients) == big - 10);
  }
  // A different size that would take in use + cached past the high water (1 MiB) frees the cache first.
  {
    Allocation other = h.allocate(big / 2, Category::activations);
    CHECK(h.allocator.cached() == 0);
  }
  CHECK(h.allocator.cached() == big / 2);
  {  // within the high water: both kept
    Allocation x = h.allocate(big / 4, Category::activations);
    CHECK(h.allocator.cached() == big / 2);
  }
  CHECK(h.allocator.cached() == big / 2 + big / 4);
  // Small blocks are not cached.
  { Allocation small = h.allocate(1000); }
  CHECK(h.allocator.cached() == big / 2 + big / 4);
  h.allocator.empty_cache();
  CHECK(h.allocator.cached() == 0);
  CHECK(h.memory().total_peak == big);
}
