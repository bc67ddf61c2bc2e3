// Ops<Cuda>: the Cuda device's operations behind the dispatch point (device/ops.hpp), with the
// signatures of Ops<Host> (device/host/dispatch.hpp): T is the compute type (float or bf16) and
// acc<T> = float the type of parameter gradients, statistics and master weights. Every layer, the
// data-parallel protocol and the trainer reach the GPU through here and nothing else.
//
// GEMMs go through cuBLASLt (gemm.cuh) with one handle and workspace per device, made on first use;
// everything else through the kernels of ops.cuh, ops_train.cuh and attention.cuh. Calls are queued
// on the device's stream; the ones that return a number to the host (the loss sum, the sum of
// squares) wait for it.
//
// Include only from .cu translation units; a host-only build never sees this header.
#pragma once

#include "weft/device/cuda/attention.cuh"
#include "weft/device/cuda/gemm.cuh"
#include "weft/device/cuda/ops_train.cuh"
#include "weft/device/cuda/profile.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/ops.hpp"

namespace weft {

template <>
struct Ops<Cuda> {
  using index = std::int64_t;
  template <class T> using acc = accumulate_t<T>;

  // C (m, n) = alpha op(A) op(B) + beta C; A, B in T, C in T or float; f32 accumulation.
  template <class T, class C>
  static void gemm(Cuda& d, Trans ta, Trans tb, index m, index n, index k, float alpha, const T* a, index lda,
                   const T* b, index ldb, float beta, C* c, index ldc) {
    const Timed timed(d, cuda::OpKind::gemm);
    static_assert(cuda::Activation<T>, "Ops<Cuda>::gemm: operands must be float or bf16 (f64 is the host's)");
    if (m == 0 || n == 0) return;
    if (k == 0) {  // C = beta C
      if (beta == 0.0f) {
        for (index i = 0; i < m; ++i) d.zero(c + i * ldc, static_cast<std::size_t>(n) * sizeof(C));
        return;
      }
      if (beta == 1.0f) return;
      throw Error("Ops<Cuda>::gemm", cat("k 0 with beta ", beta), "pass beta 0 or 1 for an empty product");
    }
    blas(d).gemm<T, C>(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, alpha, beta);
  }

  template <class T>
  static void zero(Cuda& d, T* out, index n) {
    const Timed timed(d, cuda::OpKind::other);
    if (n > 0) d.zero(out, static_cast<std::size_t>(n) * sizeof(T));
  }
  template <class T>
  static void copy(Cuda& d, T* out, const T* in, index n) {
    const Timed timed(d, cuda::OpKind::other);
    if (n > 0) d.copy(out, in, static_cast<std::size_t>(n) * sizeof(T));
  }
  template <class To, class From>
  static void convert(Cuda& d, To* out, const From* in, index n) {
    const Timed timed(d, cuda::OpKind::other);
    if constexpr (std::same_as<To, From>) copy(d, out, in, n);
    else cuda::convert(d, out, in, n);
  }

  template <class T>
  static void fill(Cuda& d, T* out, index n, T v) {
    const Timed timed(d, cuda::OpKind::other);
    cuda::fill(d, out, n, static_cast<float>(v));
  }
  // The host's draws (bitwise the same weights on every device), uploaded.
  template <class T>
  static void init_normal(Cuda& d, T* out, const Shape& global, const Shape& local, const Shape& offset,
                          std::uint64_t seed, std::uint64_t id, double std) {
    const Timed timed(d, cuda::OpKind::other);
    std::vector<T> h(static_cast<std::size_t>(local.numel()));
    host::init_normal(h.data(), global, local, offset, seed, id, std);
    d.from_host(out, h.data(), h.size() * sizeof(T));
  }

  template <class T>
  static void add_inplace(Cuda& d, T* out, const T* x, index n) {
    const Timed timed(d, cuda::OpKind::other);
    cuda::add_inplace(d, out, x, n);
  }
  template <class T>
  static void gelu_forward(Cuda& d, T* out, const T* x, index n) {
    const Timed timed(d, cuda::OpKind::other);
    cuda::gelu_forward(d, out, x, n);
  }
  template <class T>
  static void gelu_backward(Cuda& d, T* dx, const T* x, const T* dout, index n) {
    const Timed timed(d, cuda::OpKind::other);
    cuda::gelu_backward(d, dx, x, dout, n);
  }
  template <class T>
  static void bias_add(Cuda& d, T* y, const T* b, index N, index C) {
    const Timed timed(d, cuda::OpKind::other);
    cuda::bias_add(d, y, b, N, C);
  }
  template <class T>
  static void bias_backward(Cuda& d, acc<T>* db, const T* dy, index N, index C) {
    const Timed timed(d, cuda::OpKind::other);
    cuda::bias_backward(d, db, dy, N, C);
  }

  template <class T>
  static void layernorm_forward(Cuda& d, T* out, acc<T>* mean, acc<T>* rstd, const T* x, const T* w, const T* b, index N,
                                index C, acc<T> eps) {
    const Timed timed(d, cuda::OpKind::other);
    cuda::layernorm_forward(d, out, mean, rstd, x, w, b, N, C, eps);
  }
  template <class T>
  static void layernorm_backward(Cuda& d, T* dx, acc<T>* dw, acc<T>* db, const T* dout, const T* x, const T* w,
                                 const acc<T>* mean, const acc<T>* rstd, index N, index C, const T* dresid = nullptr) {
    const Timed timed(d, cuda::OpKind::other);
    cuda::layernorm_backward(d, dx, dw, db, dout, x, w, mean, rstd, N, C, dresid);
  }

  template <class T>
  static void attention_forward(Cuda& d, T* out, T* probs, const T* qkv, index B, index Tn, index H, index hd) {
    const Timed timed(d, cuda::OpKind::attention);
    cuda::attention_forward(d, out, probs, qkv, B, Tn, H, hd);
  }
  template <class T>
  static void attention_backward(Cuda& d, T* dqkv, const T* dout, const T* qkv, const T* probs, index B, index Tn,
                                 index H, index hd) {
    const Timed timed(d, cuda::OpKind::attention);
    cuda::attention_backward(d, dqkv, dout, qkv, probs, B, Tn, H, hd);
  }

  template <class T>
  static void embedding_forward(Cuda& d, T* out, const std::int32_t* tokens, const T* table, index N, index C,
                                index begin, index end) {
    const Timed timed(d, cuda::OpKind::other);
    cuda::embedding_forward(d, out, tokens, table, N, C, begin, end);
  }
  template <class T>
  static void embedding_backward(Cuda& d, acc<T>* dtable, const T* dout, const std::int32_t* tokens, index N, index C,
                                 index begin, index end) {
    const Timed timed(d, cuda::OpKind::other);
    cuda::embedding_backward(d, dtable, dout, tokens, N, C, begin, end);
  }
  template <class T>
  static void position_forward(Cuda& d, T* x, const T* table, index B, index Tl, index C, index t0) {
    const Timed timed(d, cuda::OpKind::other);
    cuda::position_forward(d, x, table, B, Tl, C, t0);
  }
  template <class T>
  static void position_backward(Cuda& d, acc<T>* dtable, const T* dy, index B, index Tl, index C, index t0) {
    const Timed timed(d, cuda::OpKind::other);
    cuda::position_backward(d, dtable, dy, B, Tl, C, t0);
  }

  template <class T>
  static void ce_row_max(Cuda& d, acc<T>* rowmax, const T* logits, index N, index V, index valid) {
    const Timed timed(d, cuda::OpKind::other);
    cuda::ce_row_max(d, rowmax, logits, N, V, valid);
  }
  template <class T>
  static void ce_row_stats(Cuda& d, acc<T>* stats, const T* logits, const acc<T>* rowmax, const std::int32_t* targets,
                           index N, index V, index valid, index begin) {
    const Timed timed(d, cuda::OpKind::other);
    cuda::ce_row_stats(d, stats, logits, rowmax, targets, N, V, valid, begin);
  }
  static double ce_loss(Cuda& d, float* sumexp, const float* stats, const float* rowmax, index N) {
    const Timed timed(d, cuda::OpKind::other);
    return cuda::ce_loss(d, sumexp, stats, rowmax, N);
  }
  template <class T>
  static void ce_backward(Cuda& d, T* dlogits, const T* logits, const acc<T>* rowmax, const acc<T>* sumexp,
                          const std::int32_t* targets, index N, index V, index valid, index begin, acc<T> scale) {
    const Timed timed(d, cuda::OpKind::other);
    if (dlogits != logits)
      throw Error("Ops<Cuda>::ce_backward", "the gradient must overwrite the logits", "pass the logits buffer twice");
    cuda::ce_backward(d, dlogits, rowmax, sumexp, targets, N, V, valid, begin, scale, 1);
  }

  template <class P, class S>
  static void adamw(Cuda& d, P* p, const P* g, S* m, S* v, index n, const math::AdamWParams<S>& a, bool decay,
                    double grad_scale) {
    const Timed timed(d, cuda::OpKind::other);
    static_assert(std::same_as<P, float> && std::same_as<S, float>,
                  "Ops<Cuda>::adamw: the GPU updates f32 parameters (master weights under bf16)");
    cuda::adamw_range(d, p, g, m, v, n, a, decay, grad_scale);
  }
  template <class P, class S>
  static void sgd(Cuda& d, P* p, const P* g, S* buf, index n, double lr, double momentum, double weight_decay,
                  bool decay, double grad_scale) {
    const Timed timed(d, cuda::OpKind::other);
    static_assert(std::same_as<P, float> && std::same_as<S, float>, "Ops<Cuda>::sgd: the GPU updates f32 parameters");
    cuda::sgd_range(d, p, g, buf, n, lr, momentum, weight_decay, decay, grad_scale);
  }
  static double sum_squares_many(Cuda& d, std::span<const std::pair<const float*, index>> pieces) {
    const Timed timed(d, cuda::OpKind::other);
    std::vector<cuda::TensorRef> refs;
    for (const auto& [p, n] : pieces) refs.push_back({.p = const_cast<float*>(p), .n = n});
    return cuda::sum_squares(d, refs);
  }
  // AdamW over every range of a step in one launch (Piece: p, g, state {m, v}, n, decay).
  template <class Pieces>
  static void adamw_many(Cuda& d, const Pieces& pieces, const math::AdamW& a, double grad_scale) {
    const Timed timed(d, cuda::OpKind::other);
    std::vector<cuda::TensorRef> refs;
    for (const auto& x : pieces) refs.push_back({x.p, x.g, x.state[0], x.state[1], x.n, x.decay ? 1 : 0});
    cuda::adamw(d, refs, a, static_cast<float>(grad_scale));
  }
  static double sum_squares(Cuda& d, const float* x, index n) {
    const Timed timed(d, cuda::OpKind::other);
    const cuda::TensorRef r{.p = const_cast<float*>(x), .n = n};
    return cuda::sum_squares(d, std::span<const cuda::TensorRef>(&r, 1));
  }

 private:
  // Times the op where a benchmark attached a Profile to the device.
  struct Timed {
    Cuda& d;
    Timed(Cuda& dev, cuda::OpKind k) : d(dev) {
      if (d.profile) d.profile->begin(k);
    }
    ~Timed() {
      if (d.profile) d.profile->end();
    }
  };
  static cuda::Blas& blas(Cuda& d) {
    if (!d.handles) d.handles = std::make_shared<cuda::Blas>(d);
    return *static_cast<cuda::Blas*>(d.handles.get());
  }
};

}  // namespace weft
