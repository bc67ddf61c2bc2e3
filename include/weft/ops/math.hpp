// Per-element math shared by the host and CUDA back ends.
//
// Each function is written once, marked WEFT_HD (__host__ __device__ under
// nvcc), and called by the host reference ops and by the CUDA kernels alike, so
// the two back ends differ only in how work is spread over threads and in
// summation order, never in the formula.
//
// defines: math::gelu, math::gelu_grad, math::silu, math::silu_grad, math::AdamWParams, math::adamw_step, WEFT_HD
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define WEFT_HD __host__ __device__
#else
#define WEFT_HD
#endif

namespace weft::math {

// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
// x^3))).
template <class T> WEFT_HD inline T gelu(T x) {
  constexpr T k = T(0.7978845608028654);  // sqrt(2 / pi)
  constexpr T c = T(0.044715);
  using std::tanh;
  return T(0.5) * x * (T(1) + tanh(k * (x + c * x * x * x)));
}

// d gelu / dx for the same approximation.
template <class T> WEFT_HD inline T gelu_grad(T x) {
  constexpr T k = T(0.7978845608028654);
  constexpr T c = T(0.044715);
  using std::tanh;
  const T u = k * (x + c * x * x * x);
  const T t = tanh(u);
  const T du = k * (T(1) + T(3) * c * x * x);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
}

// SiLU (swish): x sigmoid(x), and its derivative sigmoid(x) (1 + x (1 - sigmoid(x))).
template <class T> WEFT_HD inline T silu(T x) {
  using std::exp;
  return x / (T(1) + exp(-x));
}
template <class T> WEFT_HD inline T silu_grad(T x) {
  using std::exp;
  const T s = T(1) / (T(1) + exp(-x));
  return s * (T(1) + x * (T(1) - s));
}

// One AdamW step for one element (decoupled weight decay, Loshchilov and
// Hutter; PyTorch's AdamW):
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p - lr (m / bc1 / (sqrt(v / bc2) + eps) + wd p)
// with the bias corrections bc1 = 1 - b1^t and bc2 = 1 - b2^t computed once per
// step by the caller. S is the type the state and the arithmetic use: float for
// training (f32 and bf16 parameters), double on the host's double-precision
// checking path.
template <class S> struct AdamWParams {
  S lr, beta1, beta2, eps, weight_decay, bc1, bc2;
};
using AdamW = AdamWParams<float>;

template <class P, class S>
WEFT_HD inline void adamw_step(P& p, S g, S& m, S& v, const AdamWParams<S>& a, bool decay) {
  using std::sqrt;
  m = a.beta1 * m + (S(1) - a.beta1) * g;
  v = a.beta2 * v + (S(1) - a.beta2) * g * g;
  const S update = (m / a.bc1) / (sqrt(v / a.bc2) + a.eps);
  const S ps = static_cast<S>(p);
  p = static_cast<P>(ps - a.lr * (update + (decay ? a.weight_decay * ps : S(0))));
}

}  // namespace weft::math
