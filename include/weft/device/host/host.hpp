// The Host device: CPU memory through the tracking allocator. Its ops (GEMM through Eigen, and the
// reference kernels of later parts) are in their own headers, so code that only moves data does not
// pay for Eigen.
#pragma once

#include <concepts>
#include <cstdint>

#include "weft/device/host/allocator.hpp"

namespace weft {

struct Host {
  static constexpr const char* name = "host";
  HostAllocator allocator;

  Allocation allocate(std::int64_t bytes, Category c = Category::other) { return allocator.allocate(bytes, c); }
  const MemoryStats& memory() const { return allocator.stats(); }
};

// What a device provides to tensors: tracked allocation. (Kernels come through Ops<Device>.)
template <class D>
concept Device = requires(D& d, std::int64_t n, Category c) {
  { d.allocate(n, c) } -> std::same_as<Allocation>;
  { D::name } -> std::convertible_to<const char*>;
};

static_assert(Device<Host>);

}  // namespace weft
