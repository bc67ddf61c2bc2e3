// The Meta device's specialization of every weft op family (ops/family.hpp): each function takes
// the arguments D's does and computes nothing; those that return a value (a loss, a sum of squares)
// return 0. The ops the time model prices note what they were asked in the device's MetaWork (GEMM
// shapes; the attention core's FLOPs; elements through GELU, LayerNorm, the cross-entropy and
// AdamW). A user's op family gets its own the same way, beside its host one:
//
//   template <class D> struct RmsNorm<weft::Meta<D>> : weft::ops::MetaPass<D> {};
//
// (MetaPass: a forward and a backward that take anything and do nothing; a family with other
// functions names them the same way, as Memory's and CrossEntropy's below.)
//
// Plain C++20; it includes the host's families, whose primary templates it specializes.
#pragma once

#include "weft/device/dispatch.hpp"
#include "weft/device/meta/meta.hpp"

namespace weft::ops {

// A forward and a backward that do nothing: the Meta specialization of an op family with those two.
template <class D>
struct MetaPass {
  template <class... A> static void forward(Meta<D>&, A&&...) {}
  template <class... A> static void backward(Meta<D>&, A&&...) {}
};

template <class D>
struct Gemm<Meta<D>> {
  template <class... A>
  static void run(Meta<D>& d, Trans ta, Trans tb, index m, index n, index k, A&&...) {
    d.work.gemm(m, n, k, ta == Trans::yes, tb == Trans::yes);
  }
};
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
template <class D>
struct Gelu<Meta<D>> {
  template <class T> static void forward(Meta<D>& d, T*, const T*, index n) { d.work.gelu += 0.5 * static_cast<double>(n); }
  template <class T> static void backward(Meta<D>& d, T*, const T*, const T*, index n) {
    d.work.gelu += 0.5 * static_cast<double>(n);
  }
};
template <class D>
struct Bias<Meta<D>> {
  template <class... A> static void add(Meta<D>&, A&&...) {}
  template <class... A> static void backward(Meta<D>&, A&&...) {}
};
template <class D>
struct LayerNorm<Meta<D>> {
  template <class A0, class A1, class A2, class A3, class A4, class A5, class... A>
  static void forward(Meta<D>& d, A0, A1, A2, A3, A4, A5, index N, index C, A&&...) {
    d.work.layernorm += 0.5 * static_cast<double>(N) * static_cast<double>(C);
  }
  template <class A0, class A1, class A2, class A3, class A4, class A5, class A6, class A7, class... A>
  static void backward(Meta<D>& d, A0, A1, A2, A3, A4, A5, A6, A7, index N, index C, A&&...) {
    d.work.layernorm += 0.5 * static_cast<double>(N) * static_cast<double>(C);
  }
};
// The causal core: QK^T and PV over the lower triangle, 2 B H T (T + 1) hd FLOPs forward, twice
// that backward.
template <class D>
struct Attention<Meta<D>> {
  template <class T>
  static void forward(Meta<D>& d, T*, T*, const T*, index B, index Tn, index H, index hd, index = 1) {
    d.work.attention_flops += core(B, Tn, H, hd);
  }
  template <class T>
  static void backward(Meta<D>& d, T*, const T*, const T*, const T*, index B, index Tn, index H, index hd, index = 1) {
    d.work.attention_flops += 2 * core(B, Tn, H, hd);
  }
  static double core(index B, index Tn, index H, index hd) {
    return 2.0 * static_cast<double>(B) * static_cast<double>(H) * static_cast<double>(Tn) * static_cast<double>(Tn + 1) *
           static_cast<double>(hd);
  }
};
template <class D>
struct Embedding<Meta<D>> : MetaPass<D> {};
template <class D>
struct Position<Meta<D>> : MetaPass<D> {};
template <class D>
struct CrossEntropy<Meta<D>> {
  template <class S, class T>
  static void row_max(Meta<D>& d, S*, const T*, index N, index V, index) {
    d.work.cross_entropy += 0.5 * static_cast<double>(N) * static_cast<double>(V);
  }
  template <class... A> static void row_stats(Meta<D>&, A&&...) {}
  template <class... A> static double loss(Meta<D>&, A&&...) { return 0; }
  template <class T, class S, class... A>
  static void backward(Meta<D>& d, T*, const T*, const S*, const S*, const std::int32_t*, index N, index V, A&&...) {
    d.work.cross_entropy += 0.5 * static_cast<double>(N) * static_cast<double>(V);
  }
};
template <class D>
struct Update<Meta<D>> {
  template <class P, class G, class S, class... A>
  static void adamw(Meta<D>& d, P*, const G*, S*, S*, index n, A&&...) {
    d.work.adamw += static_cast<double>(n);
  }
  template <class... A> static void sgd(Meta<D>&, A&&...) {}
  template <class Pieces, class... A>
  static void adamw_many(Meta<D>& d, const Pieces& pieces, A&&...) {
    for (const auto& x : pieces) d.work.adamw += static_cast<double>(x.n);
  }
};
template <class D>
struct Norm<Meta<D>> {
  template <class... A> static double sum_squares(Meta<D>&, A&&...) { return 0; }
  template <class... A> static double sum_squares_many(Meta<D>&, A&&...) { return 0; }
};

}  // namespace weft::ops
