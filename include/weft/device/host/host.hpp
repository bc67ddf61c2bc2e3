// The Host device: CPU memory through the tracking allocator. Its ops (GEMM through Eigen, and the
// reference kernels of later parts) are in their own headers, so code that only moves data does not
// pay for Eigen.
#pragma once

#include <concepts>
#include <cstdint>
#include <cstring>

#include "weft/device/host/allocator.hpp"

namespace weft {

struct Host {
  static constexpr const char* name = "host";
  static constexpr bool host_memory = true;  // the host can read its buffers directly
  HostAllocator allocator;

  Allocation allocate(std::int64_t bytes, Category c = Category::other) { return allocator.allocate(bytes, c); }
  const MemoryStats& memory() const { return allocator.stats(); }
  void reset_peak() { allocator.reset_peak(); }

  // Memory moves within the device's memory, and between it and the host's (the same here).
  void zero(void* p, std::size_t bytes) {
    if (bytes) std::memset(p, 0, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  // `rows` runs of `width` bytes, `spitch` apart in src and `dpitch` apart in dst.
  void copy_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
               std::size_t rows) {
    for (std::size_t r = 0; r < rows; ++r)
      copy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  }
  void to_host(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes); }
  void from_host(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes); }
  void synchronize() {}
};

// What a device provides to tensors, communicators and layers: tracked allocation and memory moves
// (kernels come through the ops, ops/op.hpp). to_host and from_host move between the device's memory and
// the host's; on a device with its own memory, to_host waits for the device's queued work first.
template <class D>
concept Device = requires(D& d, std::int64_t n, Category c, void* p, const void* q, std::size_t b) {
  { d.allocate(n, c) } -> std::same_as<Allocation>;
  { D::name } -> std::convertible_to<const char*>;
  d.zero(p, b);
  d.copy(p, q, b);
  d.copy_2d(p, b, q, b, b, b);
  d.to_host(p, q, b);
  d.from_host(p, q, b);
  d.synchronize();
};

static_assert(Device<Host>);

}  // namespace weft
