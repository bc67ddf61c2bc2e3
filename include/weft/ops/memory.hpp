// ops::Memory and ops::Init: buffers (zero, copy, convert (master weights rounded to the compute type), fill, add:
// out += x), and parameter initialization (normal draws keyed by each element's global index).
//
// An op family: the primary template is declared here and specialized per device, the host's
// below and the Cuda device's in memory.cuh beside this file (ops/family.hpp says how a family is
// written; a user adds one the same way, in their own code). Layers call
// ops::Memory<D>::copy(dev, ...).
#pragma once

#include <cstdint>
#include <cstring>

#include "weft/core/precision.hpp"
#include "weft/core/shape.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/ops/family.hpp"

namespace weft::ops {

static_assert(host::kElements % host::detail::kChunk == 0, "ops: a thread's part of an elementwise op starts on a chunk");

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

}  // namespace weft::ops
