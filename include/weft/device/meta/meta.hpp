// weft::Meta<D>: a device that allocates nothing and computes nothing, and counts every block the
// code asks of it as D's allocator counts it (MemoryStats, by category). The plan for any model
// (cost/measure.hpp) runs a real training step of the real model on it, so what it reports is what
// the model's code allocates, whatever its layers are, without the memory or the arithmetic.
//
// Blocks have addresses that are never dereferenced (distinct, in a range nothing maps), so a layer
// that touches device memory directly instead of through an op faults at once rather than counting
// wrong. Ops reach it through each op's Meta specialization (in its file, ops/<op>.hpp, for
// weft's; a user's op adds its own in three lines, docs/layers.md). Copies to the host write
// zeros: a loss or a norm read back on Meta is 0.
//
// host_memory is D's, so code that branches on it (token ids copied to a GPU) takes D's path. The
// ops' own workspaces are D's and not counted here (the CUDA back end's cuBLASLt and attention
// scratch: footprint::cuda_workspace estimates them).
//
// This header is plain C++20.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/device/allocation.hpp"

namespace weft {

class MetaAllocator final : public Releaser {
 public:
  MetaAllocator() = default;
  MetaAllocator(const MetaAllocator&) = delete;
  MetaAllocator& operator=(const MetaAllocator&) = delete;

  Allocation allocate(std::int64_t bytes, Category c = Category::other) {
    if (bytes < 0) throw Error("MetaAllocator", cat("requested ", bytes, " bytes"), "request a size >= 0");
    stats_.on_allocate(bytes, c);
    return Allocation::adopt(this, bytes > 0 ? address(bytes) : nullptr, bytes, c);
  }
  const MemoryStats& stats() const { return stats_; }
  void reset_peak() { stats_.reset_peak(); }

 private:
  // A fake address of its own for each block (64-byte aligned, a gap between blocks, reused only
  // after 2^45 bytes), so code that compares addresses sees distinct buffers as on D; nothing
  // reads or writes through it. [2^45, 2^46): above AddressSanitizer's shadow, below where
  // Linux maps executables and libraries.
  void* address(std::int64_t bytes) {
    const std::uintptr_t at = (std::uintptr_t{1} << 45) + next_;
    next_ = (next_ + (static_cast<std::uintptr_t>(bytes) + 127) / 64 * 64) % (std::uintptr_t{1} << 45);
    return reinterpret_cast<void*>(at);
  }
  void release(void*, std::int64_t bytes, Category c) noexcept override { stats_.on_release(bytes, c); }
  MemoryStats stats_;
  std::uintptr_t next_ = 0;
};

// What the ops were asked for, for the time model (estimate::work_of, cost/measure_time.hpp): each
// GEMM shape and how often, the causal attention core's FLOPs, and the elements through the ops the
// time model prices per element (forward and backward together count one element, so each counts
// half; a recomputed forward counts its half again).
struct MetaWork {
  struct Gemm {
    std::int64_t m = 0, n = 0, k = 0;
    bool ta = false, tb = false;
    std::int64_t count = 0;
    bool fp8 = false;  // on float8 casts (ops::ScaledGemm)
  };
  std::vector<Gemm> gemms;  // distinct shapes, in the order first asked
  double attention_flops = 0;
  double gelu = 0, layernorm = 0, cross_entropy = 0, adamw = 0;
  double fp8_cast = 0;  // elements cast to float8: an FP8 GEMM's (m + n) k

  void gemm(std::int64_t m, std::int64_t n, std::int64_t k, bool ta, bool tb, bool fp8 = false) {
    if (fp8) fp8_cast += static_cast<double>((m + n) * k);
    for (Gemm& g : gemms)
      if (g.m == m && g.n == n && g.k == k && g.ta == ta && g.tb == tb && g.fp8 == fp8) {
        ++g.count;
        return;
      }
    gemms.push_back({m, n, k, ta, tb, 1, fp8});
  }
};

template <class D>
struct Meta {
  static constexpr const char* name = "meta";
  static constexpr bool host_memory = D::host_memory;  // take D's paths
  using stands_for = D;
  MetaAllocator allocator;
  MetaWork work;  // what weft's ops were asked (their Meta specializations, ops/<op>.hpp); a user's op adds nothing

  Allocation allocate(std::int64_t bytes, Category c = Category::other) { return allocator.allocate(bytes, c); }
  const MemoryStats& memory() const { return allocator.stats(); }
  void reset_peak() { allocator.reset_peak(); }

  void zero(void*, std::size_t) {}
  void copy(void*, const void*, std::size_t) {}
  void copy_2d(void*, std::size_t, const void*, std::size_t, std::size_t, std::size_t) {}
  void to_host(void* dst, const void*, std::size_t bytes) {
    if (bytes) std::memset(dst, 0, bytes);  // dst is host memory
  }
  void from_host(void*, const void*, std::size_t) {}
  void synchronize() {}
};

template <class D>
inline constexpr bool is_meta = false;
template <class D>
inline constexpr bool is_meta<Meta<D>> = true;

}  // namespace weft
