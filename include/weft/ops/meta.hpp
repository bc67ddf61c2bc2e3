// The Meta device's side of an op (device/meta/meta.hpp; cost/measure.hpp runs a model's step
// on it): each function takes the arguments the host's does and computes nothing; those that return
// a value (a loss, a sum of squares) return 0. weft's ops write theirs in their own file,
// ops/<op>.hpp, noting in the device's MetaWork what the time model prices (GEMM shapes, the
// attention core's FLOPs, elements through GELU, LayerNorm, the cross-entropy and AdamW). A user's
// op gets its own the same way, beside its host one:
//
//   template <class D> struct RmsNorm<weft::Meta<D>> : weft::ops::MetaPass<D> {};
//
// (MetaPass: a forward and a backward that take anything and do nothing; an op with other
// functions names them the same way, as ops::Memory's and ops::CrossEntropy's do.)
//
// defines: ops::MetaPass
#pragma once

#include "weft/device/meta/meta.hpp"

namespace weft::ops {

// A forward and a backward that do nothing: the Meta specialization of an op with those two.
template <class D>
struct MetaPass {
  template <class... A> static void forward(Meta<D>&, A&&...) {}
  template <class... A> static void backward(Meta<D>&, A&&...) {}
};

}  // namespace weft::ops
