// ops::Memory and ops::Init: buffers (zero, copy, convert (master weights rounded to the compute type), fill, add:
// out += x), and parameter initialization (normal draws keyed by each element's global index).
//
// An op (ops/op.hpp; a user adds one the same way, in their own code): the primary template,
// the host's kernels and specialization and the Meta device's here, the Cuda device's in memory.cuh.
// Layers call ops::Memory<D>::copy(dev, ...).
//
// defines: ops::Init (Host, Meta), ops::Memory (Host, Meta), host::add_inplace, host::fill, host::convert
#pragma once

#include <cstdint>
#include <cstring>

#include "weft/core/precision.hpp"
#include "weft/core/shape.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/init.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/device/meta/meta.hpp"
#include "weft/ops/meta.hpp"
#include "weft/ops/op.hpp"

namespace weft::host {

// out += x (the residual add; n elements).
template <class T>
void add_inplace(T* out, const T* x, index n) {
  for (index i = 0; i < n; ++i) out[i] = narrow<T>(widen(out[i]) + widen(x[i]));
}

// out (n) = v.
template <class T>
void fill(T* out, index n, T v) {
  for (index i = 0; i < n; ++i) out[i] = v;
}

// out (n) = in rounded to T (the master weights to the compute copy), or widened.
template <class To, class From>
void convert(To* out, const From* in, index n) {
  for (index i = 0; i < n; ++i) out[i] = static_cast<To>(static_cast<float>(in[i]));
}
template <class T>
void convert(T* out, const T* in, index n) {
  std::copy(in, in + n, out);
}

}  // namespace weft::host

namespace weft::ops {

static_assert(host::kElements % host::detail::kChunk == 0,
              "ops: a thread's part of an elementwise op starts on a chunk");

template <class D>
struct Memory;

template <class D>
struct Init;

template <>
struct Memory<Host> {
  // Memory: n elements set to zero; n elements copied (the ranges do not overlap); n elements
  // converted (master weights rounded to the compute type).
  template <class T>
  static void zero(Host&, T* out, index n) {
    const host::Timed timed(host::Op::memory);
    if (n > 0) std::memset(static_cast<void*>(out), 0, static_cast<std::size_t>(n) * sizeof(T));
  }

  template <class T>
  static void copy(Host&, T* out, const T* in, index n) {
    const host::Timed timed(host::Op::memory);
    if (n > 0) std::memcpy(static_cast<void*>(out), in, static_cast<std::size_t>(n) * sizeof(T));
  }

  template <class To, class From>
  static void convert(Host&, To* out, const From* in, index n) {
    const host::Timed timed(host::Op::memory);
    host::convert(out, in, n);
  }

  // n elements set to v (a constant initialization).
  template <class T>
  static void fill(Host&, T* out, index n, T v) {
    const host::Timed timed(host::Op::memory);
    host::fill(out, n, v);
  }

  // out += x over n elements (the residual adds).
  template <class T>
  static void add(Host&, T* out, const T* x, index n) {
    const host::Timed timed(host::Op::elementwise);
    host::split(n, host::kElements, [&](index lo, index hi) { host::add_inplace(out + lo, x + lo, hi - lo); });
  }
};

template <>
struct Init<Host> {
  // Normal draws (see host::init_normal) keyed by each element's global index in the rank's box
  // (offset) of the global tensor: the same weights on every mesh.
  template <class T>
  static void normal(Host&, T* out, const Shape& global, const Shape& local, const Shape& offset, std::uint64_t seed,
                     std::uint64_t id, double std) {
    const host::Timed timed(host::Op::memory);
    host::init_normal(out, global, local, offset, seed, id, std);
  }
};

// The Meta device (cost/measure.hpp): nothing computed, the work the time model prices noted.
template <class D>
struct Memory<Meta<D>> {
  template <class... A> static void zero(Meta<D>&, A&&...) {}
  template <class... A> static void copy(Meta<D>&, A&&...) {}
  template <class To, class From, class... A> static void convert(Meta<D>&, To*, const From*, A&&...) {}
  template <class... A> static void fill(Meta<D>&, A&&...) {}
  template <class... A> static void add(Meta<D>&, A&&...) {}
};

template <class D>
struct Init<Meta<D>> {
  template <class... A> static void normal(Meta<D>&, A&&...) {}
};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_MEMORY_INSTANCES(EXTERN, T)                                                                          \
  EXTERN template void weft::ops::Memory<weft::Host>::zero<T>(weft::Host&, T*, std::int64_t);                          \
  EXTERN template void weft::ops::Memory<weft::Host>::copy<T>(weft::Host&, T*, const T*, std::int64_t);                \
  EXTERN template void weft::ops::Memory<weft::Host>::convert<T, T>(weft::Host&, T*, const T*, std::int64_t);          \
  EXTERN template void weft::ops::Memory<weft::Host>::fill<T>(weft::Host&, T*, std::int64_t, T);                       \
  EXTERN template void weft::ops::Memory<weft::Host>::add<T>(weft::Host&, T*, const T*, std::int64_t);                 \
  EXTERN template void weft::ops::Init<weft::Host>::normal<T>(weft::Host&, T*, const weft::Shape&, const weft::Shape&, \
                                                              const weft::Shape&, std::uint64_t, std::uint64_t,        \
                                                              double);                                                 \
  EXTERN template void weft::host::add_inplace<T>(T*, const T*, std::int64_t);                                         \
  EXTERN template void weft::host::fill<T>(T*, std::int64_t, T);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_MEMORY_INSTANCES)
#define WEFT_HOST_MEMORY_PAIRS(EXTERN)                                                                              \
  EXTERN template void weft::ops::Memory<weft::Host>::convert<float, double>(weft::Host&, float*, const double*,    \
                                                                             std::int64_t);                         \
  EXTERN template void weft::ops::Memory<weft::Host>::convert<double, float>(weft::Host&, double*, const float*,    \
                                                                             std::int64_t);                         \
  EXTERN template void weft::ops::Memory<weft::Host>::convert<float, weft::bf16>(weft::Host&, float*,               \
                                                                                 const weft::bf16*, std::int64_t);  \
  EXTERN template void weft::ops::Memory<weft::Host>::convert<weft::bf16, float>(weft::Host&, weft::bf16*,          \
                                                                                 const float*, std::int64_t);       \
  EXTERN template void weft::ops::Memory<weft::Host>::convert<double, weft::bf16>(weft::Host&, double*,             \
                                                                                  const weft::bf16*, std::int64_t); \
  EXTERN template void weft::ops::Memory<weft::Host>::convert<weft::bf16, double>(weft::Host&, weft::bf16*,         \
                                                                                  const double*, std::int64_t);
WEFT_HOST_KERNELS_EXTERN_ONCE(WEFT_HOST_MEMORY_PAIRS)
