// ops::Memory and ops::Init on the Cuda device (see memory.hpp for the family and the host's).
//
// Include only from .cu translation units (device/cuda/dispatch.cuh includes every family).
#pragma once

#include <cstdint>
#include <vector>

#include "weft/device/cuda/kernels/elementwise.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/memory.hpp"

namespace weft::ops {

template <>
struct Memory<Cuda> {
  template <class T>
  static void zero(Cuda& d, T* out, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    if (n > 0) d.zero(out, static_cast<std::size_t>(n) * sizeof(T));
  }

  template <class T>
  static void copy(Cuda& d, T* out, const T* in, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    if (n > 0) d.copy(out, in, static_cast<std::size_t>(n) * sizeof(T));
  }

  template <class To, class From>
  static void convert(Cuda& d, To* out, const From* in, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    if constexpr (std::same_as<To, From>)
      copy(d, out, in, n);
    else
      cuda::convert(d, out, in, n);
  }

  template <class T>
  static void fill(Cuda& d, T* out, index n, T v) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::fill(d, out, n, static_cast<float>(v));
  }

  template <class T>
  static void add(Cuda& d, T* out, const T* x, index n) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::add_inplace(d, out, x, n);
  }
};

template <>
struct Init<Cuda> {
  // The host's draws (bitwise the same weights on every device), uploaded.
  template <class T>
  static void normal(Cuda& d, T* out, const Shape& global, const Shape& local, const Shape& offset, std::uint64_t seed,
                     std::uint64_t id, double std) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    std::vector<T> h(static_cast<std::size_t>(local.numel()));
    host::init_normal(h.data(), global, local, offset, seed, id, std);
    d.from_host(out, h.data(), h.size() * sizeof(T));
  }
};

}  // namespace weft::ops
