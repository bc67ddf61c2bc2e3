// ops::ContextBlock on the Cuda device (see context_block.hpp for the family and the host's): float
// and bf16 activations, the sums, the output being merged, the log-sum-exp and the gradients in
// float (S = accumulate_t<T> = float for both).
//
// Include only from .cu translation units (device/cuda/dispatch.cuh includes every family).
#pragma once

#include <limits>

#include "weft/device/cuda/kernels/context.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/ops/context_block.hpp"
#include "weft/ops/memory.cuh"

namespace weft::ops {

template <>
struct ContextBlock<Cuda> {
  template <class T>
  static void pack_kv(Cuda& d, T* kv, const T* qkv, index B, index Tl, index H, index hd, index g) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::context_pack_kv(d, kv, qkv, B, Tl, H, hd, g);
  }
  static void start(Cuda& d, float* o, float* lse, index B, index Tl, index H, index hd) {
    Memory<Cuda>::zero(d, o, B * Tl * H * hd);
    Memory<Cuda>::fill(d, lse, B * H * Tl, -std::numeric_limits<float>::infinity());
  }
  template <class T>
  static void forward(Cuda& d, float* o, float* lse, const T* qkv, const T* kv, index B, index Tl, index H, index hd, index g,
                      Positions qpos, Positions kpos) {
    const cuda::Timed timed(d, cuda::OpKind::attention);
    cuda::context_forward(d, o, lse, qkv, kv, B, Tl, H, hd, g, qpos, kpos);
  }
  template <class T>
  static void finish(Cuda& d, T* out, const float* o, index n) {
    Memory<Cuda>::convert(d, out, o, n);
  }
  template <class T>
  static void row_dots(Cuda& d, float* D, const T* dout, const T* out, index B, index Tl, index H, index hd) {
    const cuda::Timed timed(d, cuda::OpKind::attention);
    cuda::context_row_dots(d, D, dout, out, B, Tl, H, hd);
  }
  template <class T>
  static void backward(Cuda& d, float* dq, float* dkv, const T* qkv, const T* kv, const T* dout, const float* D,
                       const float* lse, index B, index Tl, index H, index hd, index g, Positions qpos, Positions kpos) {
    const cuda::Timed timed(d, cuda::OpKind::attention);
    cuda::context_backward(d, dq, dkv, qkv, kv, dout, D, lse, B, Tl, H, hd, g, qpos, kpos);
  }
  template <class T>
  static void write_dqkv(Cuda& d, T* dqkv, const float* dq, const float* dkv, index B, index Tl, index H, index hd, index g) {
    const cuda::Timed timed(d, cuda::OpKind::other);
    cuda::context_write_dqkv(d, dqkv, dq, dkv, B, Tl, H, hd, g);
  }
};

}  // namespace weft::ops
