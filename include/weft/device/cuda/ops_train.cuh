// CUDA ops, part 3: what the layers need beyond ops.cuh and ops_loss_optim.cuh, with the host op
// set's signatures (device/host/ops.hpp): conversion and fill, the residual and bias adds, column
// sums (bias and position gradients), learned positions, the loss sum, and the single-range
// optimizer updates and norm the data-parallel protocol calls. G is the gradient type (float under
// mixed precision, else T). No float atomics: column sums go through per-chunk partial sums added
// in chunk order; the loss and the norm sum partials in a fixed order.
//
// Include only from .cu translation units (through dispatch.cuh).
#pragma once

#include "weft/device/cuda/ops.cuh"

namespace weft::cuda {

template <class To, class From>
__global__ void convert_kernel(To* out, const From* in, index n) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x)
    out[i] = detail::from_f<To>(detail::to_f(in[i]));
}

// out (n) = in, rounded (float -> bf16) or widened; float -> float copies.
template <Activation To, Activation From>
void convert(Cuda& d, To* out, const From* in, index n) {
  if (n <= 0) return;
  convert_kernel<<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(detail::dev(out), detail::dev(in), n);
  check_launch("convert");
}

template <class T>
__global__ void fill_kernel(T* out, index n, float v) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x)
    out[i] = detail::from_f<T>(v);
}

template <Activation T>
void fill(Cuda& d, T* out, index n, float v) {
  if (n <= 0) return;
  fill_kernel<<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(detail::dev(out), n, v);
  check_launch("fill");
}

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// out += x over n elements (the residual add; also f32 gradient slices).
template <Activation T>
void add_inplace(Cuda& d, T* out, const T* x, index n) {
  map2(d, out, static_cast<const T*>(out), x, n, Add{}, "add_inplace");
}

template <class T>
__global__ void bias_add_kernel(T* y, const T* b, index N, index C) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < N * C;
       i += static_cast<index>(gridDim.x) * blockDim.x)
    y[i] = detail::from_f<T>(detail::to_f(y[i]) + detail::to_f(b[i % C]));
}

// y (N, C) += b (C) on every row.
template <Activation T>
void bias_add(Cuda& d, T* y, const T* b, index N, index C) {
  if (N * C == 0) return;
  bias_add_kernel<<<detail::blocks_for(N * C, 256), 256, 0, d.stream()>>>(detail::dev(y), detail::dev(b), N, C);
  check_launch("bias_add");
}

// Column sums, pass 1: block (32 columns, a chunk of rows) sums its rows in order into
// partial[chunk][c]; pass 2 adds the chunks in order into out[c].
template <class T>
__global__ void column_partial_kernel(float* partial, const T* in, index N, index C, index rows_per_chunk) {
  __shared__ float s[8][33];
  const index c = blockIdx.x * 32 + threadIdx.x;
  const index r0 = blockIdx.y * rows_per_chunk, r1 = (r0 + rows_per_chunk < N) ? r0 + rows_per_chunk : N;
  float acc = 0;
  if (c < C)
    for (index r = r0 + threadIdx.y; r < r1; r += 8) acc += detail::to_f(in[r * C + c]);
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

// out (C) += the sum over the N rows of in (N, C).
template <Activation G, Activation T>
void column_sum_add(Cuda& d, G* out, const T* in, index N, index C, const char* op) {
  if (N * C == 0) return;
  constexpr index rows_per_chunk = 256;
  const index chunks = (N + rows_per_chunk - 1) / rows_per_chunk;
  Allocation partial = d.allocate(chunks * C * static_cast<index>(sizeof(float)), Category::communication);
  column_partial_kernel<<<dim3(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks)), dim3(32, 8), 0,
                          d.stream()>>>(static_cast<float*>(partial.data()), detail::dev(in), N, C, rows_per_chunk);
  check_launch(op);
  column_finish_kernel<<<detail::blocks_for(C, 256), 256, 0, d.stream()>>>(
      detail::dev(out), static_cast<const float*>(partial.data()), chunks, C);
  check_launch(op);
}

// db (C) += the sum over rows of dy (N, C).
template <Activation T, Activation G>
void bias_backward(Cuda& d, G* db, const T* dy, index N, index C) {
  column_sum_add(d, db, dy, N, C, "bias_backward");
}

template <class T>
__global__ void position_forward_kernel(T* x, const T* table, index B, index Tl, index C, index t0) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < B * Tl * C;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    const index tc = i % (Tl * C);
    x[i] = detail::from_f<T>(detail::to_f(x[i]) + detail::to_f(table[t0 * C + tc]));
  }
}

// x (B, Tl, C) += table rows t0 .. t0 + Tl - 1.
template <Activation T>
void position_forward(Cuda& d, T* x, const T* table, index B, index Tl, index C, index t0) {
  if (B * Tl * C == 0) return;
  position_forward_kernel<<<detail::blocks_for(B * Tl * C, 256), 256, 0, d.stream()>>>(detail::dev(x), detail::dev(table),
                                                                                        B, Tl, C, t0);
  check_launch("position_forward");
}

// dtable rows t0 .. t0 + Tl - 1 += dy (B, Tl, C) summed over the batch: a column sum of B rows of
// Tl C.
template <Activation T, Activation G>
void position_backward(Cuda& d, G* dtable, const T* dy, index B, index Tl, index C, index t0) {
  column_sum_add(d, dtable + t0 * C, dy, B, Tl * C, "position_backward");
}

template <int = 0>
__global__ void ce_loss_kernel(double* loss, float* sumexp, const float* stats, const float* rowmax, index N) {
  for (index n = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; n < N;
       n += static_cast<index>(gridDim.x) * blockDim.x) {
    sumexp[n] = stats[2 * n];
    loss[n] = static_cast<double>(logf(stats[2 * n]) + rowmax[n] - stats[2 * n + 1]);
  }
}

template <int = 0>
__global__ void sum_in_order_kernel(double* out, const double* x, index n) {
  double s = 0;
  for (index i = 0; i < n; ++i) s += x[i];
  *out = s;
}

// sumexp (N) = stats[., 0]; returns sum_n log(sumexp_n) + max_n - target_n on the host.
inline double ce_loss(Cuda& d, float* sumexp, const float* stats, const float* rowmax, index N) {
  if (N == 0) return 0.0;
  Allocation rows = d.allocate((N + 1) * static_cast<index>(sizeof(double)), Category::communication);
  auto* l = static_cast<double*>(rows.data());
  ce_loss_kernel<><<<detail::blocks_for(N, 256), 256, 0, d.stream()>>>(l, sumexp, stats, rowmax, N);
  check_launch("ce_loss");
  sum_in_order_kernel<><<<1, 1, 0, d.stream()>>>(l + N, l, N);
  check_launch("ce_loss (sum)");
  double r = 0;
  d.to_host(&r, l + N, sizeof(double));
  return r;
}

template <int = 0>
__global__ void adamw_range_kernel(float* p, const float* g, float* m, float* v, index n, math::AdamW a, bool decay,
                                   float grad_scale) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x)
    math::adamw_step(p[i], g[i] * grad_scale, m[i], v[i], a, decay);
}

// AdamW over one range of f32 parameters (the master weights under mixed precision).
inline void adamw_range(Cuda& d, float* p, const float* g, float* m, float* v, index n, const math::AdamW& a, bool decay,
                        double grad_scale) {
  if (n <= 0) return;
  adamw_range_kernel<><<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(p, g, m, v, n, a, decay,
                                                                          static_cast<float>(grad_scale));
  check_launch("adamw");
}

template <int = 0>
__global__ void sgd_range_kernel(float* p, const float* g, float* buf, index n, float lr, float momentum, float wd,
                                 bool decay, float grad_scale) {
  for (index i = blockIdx.x * static_cast<index>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index>(gridDim.x) * blockDim.x) {
    float dd = g[i] * grad_scale;
    if (decay) dd += wd * p[i];
    buf[i] = momentum * buf[i] + dd;
    p[i] -= lr * buf[i];
  }
}

inline void sgd_range(Cuda& d, float* p, const float* g, float* buf, index n, double lr, double momentum,
                      double weight_decay, bool decay, double grad_scale) {
  if (n <= 0) return;
  sgd_range_kernel<><<<detail::blocks_for(n, 256), 256, 0, d.stream()>>>(
      p, g, buf, n, static_cast<float>(lr), static_cast<float>(momentum), static_cast<float>(weight_decay), decay,
      static_cast<float>(grad_scale));
  check_launch("sgd");
}

}  // namespace weft::cuda
