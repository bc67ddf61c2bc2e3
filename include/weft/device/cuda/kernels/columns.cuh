// CUDA kernels: column sums in a fixed order (the bias and position gradients).
//
// Kernels and their launchers (the conventions and determinism notes are in common.cuh); the op
// families in include/weft/ops/*.cuh call them. Include only from .cu translation units.
#pragma once

#include "weft/device/cuda/kernels/common.cuh"

namespace weft::cuda {

// Column sums, pass 1: block (32 columns, a chunk of rows) sums its rows in order into
// partial[chunk][c]; pass 2 adds the chunks in order into out[c].
template <class T>
__global__ void column_partial_kernel(float* partial, const T* in, index N, index C, index ld, index rows_per_chunk) {
  __shared__ float s[8][33];
  const index c = blockIdx.x * 32 + threadIdx.x;
  const index r0 = blockIdx.y * rows_per_chunk, r1 = (r0 + rows_per_chunk < N) ? r0 + rows_per_chunk : N;
  float acc = 0;
  if (c < C)
    for (index r = r0 + threadIdx.y; r < r1; r += 8) acc += detail::to_f(in[r * ld + c]);
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0;
    for (int k = 0; k < 8; ++k) t += s[k][threadIdx.x];
    partial[blockIdx.y * C + c] = t;
  }
}

template <class G>
__global__ void column_finish_kernel(G* out, const float* partial, index chunks, index C) {
  const index c = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float t = 0;
  for (index k = 0; k < chunks; ++k) t += partial[k * C + c];
  out[c] = detail::from_f<G>(detail::to_f(out[c]) + t);
}

// out (C) += the sum over the N rows of in (N, C), its rows ld elements apart (ld >= C).
template <Activation G, Activation T>
void column_sum_add(Cuda& d, G* out, const T* in, index N, index C, const char* op, index ld = -1) {
  if (ld < 0) ld = C;
  if (N * C == 0) return;
  constexpr index rows_per_chunk = 256;
  const index chunks = (N + rows_per_chunk - 1) / rows_per_chunk;
  Allocation partial = d.allocate(chunks * C * static_cast<index>(sizeof(float)), Category::communication);
  column_partial_kernel<<<dim3(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks)), dim3(32, 8), 0,
                          d.stream()>>>(static_cast<float*>(partial.data()), detail::dev(in), N, C, ld, rows_per_chunk);
  check_launch(op);
  column_finish_kernel<<<detail::blocks_for(C, 256), 256, 0, d.stream()>>>(
      detail::dev(out), static_cast<const float*>(partial.data()), chunks, C);
  check_launch(op);
}

}  // namespace weft::cuda
