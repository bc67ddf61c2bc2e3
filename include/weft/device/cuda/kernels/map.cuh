// CUDA kernels: an elementwise map over one or two buffers, the loop the elementwise ops share
// (ops/gelu.cuh, ops/memory.cuh; the conventions and determinism notes are in common.cuh).
//
// Include only from .cu translation units.
#pragma once

#include "weft/device/cuda/kernels/common.cuh"

namespace weft::cuda {

// out[i] = f(a[i], b[i]) over n elements: 16-byte packs, then the tail; a scalar kernel where the
// buffers are not 16-byte aligned.
template <class T, class F>
__global__ void map2_vec_kernel(T* out, const T* a, const T* b, index n, F f) {
  constexpr int W = detail::Pack<T>::W;
  const index packs = n / W, stride = static_cast<index>(gridDim.x) * blockDim.x;
  const index tid = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x;
  for (index p = tid; p < packs; p += stride) {
    const detail::Pack<T> x = detail::load_pack(a + p * W);
    detail::Pack<T> y = x;
    if (b) y = detail::load_pack(b + p * W);
    detail::Pack<T> r;
#pragma unroll
    for (int k = 0; k < W; ++k) r.v[k] = detail::from_f<T>(f(detail::to_f(x.v[k]), b ? detail::to_f(y.v[k]) : 0.0f));
    detail::store_pack(out + p * W, r);
  }
  for (index i = packs * W + tid; i < n; i += stride)
    out[i] = detail::from_f<T>(f(detail::to_f(a[i]), b ? detail::to_f(b[i]) : 0.0f));
}

template <class T, class F>
__global__ void map2_kernel(T* out, const T* a, const T* b, index n, F f) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x)
    out[i] = detail::from_f<T>(f(detail::to_f(a[i]), b ? detail::to_f(b[i]) : 0.0f));
}

template <class T, class F>
void map2(Cuda& d, T* out, const T* a, const T* b, index n, F f, const char* op) {
  constexpr unsigned threads = 256;
  if (n == 0) return;
  if (detail::all_aligned16(out, a) && (!b || detail::aligned16(b)))
    map2_vec_kernel<<<detail::blocks_for(n / (16 / sizeof(T)) + 1, threads, 132 * 16), threads, 0, d.stream()>>>(
        detail::dev(out), detail::dev(a), detail::dev(b), n, f);
  else
    map2_kernel<<<detail::blocks_for(n, threads), threads, 0, d.stream()>>>(detail::dev(out), detail::dev(a),
                                                                            detail::dev(b), n, f);
  check_launch(op);
}

}  // namespace weft::cuda
