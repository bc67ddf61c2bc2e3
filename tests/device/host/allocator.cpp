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
