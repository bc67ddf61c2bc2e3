// The Meta device's specialization of every weft op family (ops/family.hpp): each function takes
// the arguments D's does and does nothing; those that return a value (a loss, a sum of squares)
// return 0. A user's op family gets its own the same way, beside its host one:
//
//   template <class D> struct RmsNorm<weft::Meta<D>> {
//     template <class... A> static void forward(weft::Meta<D>&, A&&...) {}
//     template <class... A> static void backward(weft::Meta<D>&, A&&...) {}
//   };
//
// Plain C++20; it includes the host's families, whose primary templates it specializes.
#pragma once

#include "weft/device/dispatch.hpp"
#include "weft/device/meta/meta.hpp"

namespace weft::ops {

template <class D>
struct Gemm<Meta<D>> {
  template <class... A> static void run(Meta<D>&, A&&...) {}
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
  template <class... A> static void forward(Meta<D>&, A&&...) {}
  template <class... A> static void backward(Meta<D>&, A&&...) {}
};
template <class D>
struct Bias<Meta<D>> {
  template <class... A> static void add(Meta<D>&, A&&...) {}
  template <class... A> static void backward(Meta<D>&, A&&...) {}
};
template <class D>
struct LayerNorm<Meta<D>> {
  template <class... A> static void forward(Meta<D>&, A&&...) {}
  template <class... A> static void backward(Meta<D>&, A&&...) {}
};
template <class D>
struct Attention<Meta<D>> {
  template <class... A> static void forward(Meta<D>&, A&&...) {}
  template <class... A> static void backward(Meta<D>&, A&&...) {}
};
template <class D>
struct Embedding<Meta<D>> {
  template <class... A> static void forward(Meta<D>&, A&&...) {}
  template <class... A> static void backward(Meta<D>&, A&&...) {}
};
template <class D>
struct Position<Meta<D>> {
  template <class... A> static void forward(Meta<D>&, A&&...) {}
  template <class... A> static void backward(Meta<D>&, A&&...) {}
};
template <class D>
struct CrossEntropy<Meta<D>> {
  template <class... A> static void row_max(Meta<D>&, A&&...) {}
  template <class... A> static void row_stats(Meta<D>&, A&&...) {}
  template <class... A> static double loss(Meta<D>&, A&&...) { return 0; }
  template <class... A> static void backward(Meta<D>&, A&&...) {}
};
template <class D>
struct Update<Meta<D>> {
  template <class... A> static void adamw(Meta<D>&, A&&...) {}
  template <class... A> static void sgd(Meta<D>&, A&&...) {}
  template <class... A> static void adamw_many(Meta<D>&, A&&...) {}
};
template <class D>
struct Norm<Meta<D>> {
  template <class... A> static double sum_squares(Meta<D>&, A&&...) { return 0; }
  template <class... A> static double sum_squares_many(Meta<D>&, A&&...) { return 0; }
};

}  // namespace weft::ops
