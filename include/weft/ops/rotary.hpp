// ops::Rotary: rotary position embeddings (Su et al., 2021) in the convention of Hugging Face's
// LlamaForCausalLM, applied in place to the queries and keys of a fused qkv activation.
//
//   qkv (B, T, G, g + 2, hd)   G local key-value groups, each g queries, a key and a value (the
//                              layout of ops::Attention); the g queries and the key are rotated
//   position p of row t: pos.at(t) (ops::Positions: pos0 + t, or a context rank's two chunks);
//   frequency i < hd/2: f_i (rope_inv_freq below); a = p f_i
//   forward:   (x_i, x_{i+hd/2}) -> (x_i cos a - x_{i+hd/2} sin a, x_{i+hd/2} cos a + x_i sin a)
//   backward:  the transpose, a rotation by -a, on the gradient in place
//
// The angles and their sines are computed in double and used in acc<T> (f32 under bf16 mixed
// precision, double in a double model). An op (ops/op.hpp): the host's here, the Meta
// device's below, the Cuda device's in rotary.cuh.
//
// defines: ops::Rope, ops::rope_inv_freq, ops::Rotary (Host, Meta)
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "weft/core/precision.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/device/meta/meta.hpp"
#include "weft/ops/meta.hpp"
#include "weft/ops/op.hpp"
#include "weft/ops/positions.hpp"

namespace weft::ops {

// The rotary frequencies: f_i = theta^(-2i/hd), and with Llama 3.1's "llama3" scaling (factor > 0)
// the long wavelengths (beyond original_max / low_freq_factor) divided by factor, the short ones
// (below original_max / high_freq_factor) kept, and those between interpolated smoothly, as
// transformers' _compute_llama3_parameters does.
struct Rope {
  double theta = 10000.0;
  double factor = 0;  // 0: no scaling
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_positions = 8192;
};

inline double rope_inv_freq(index i, index hd, const Rope& r) {
  const double f = 1.0 / std::pow(r.theta, static_cast<double>(2 * i) / static_cast<double>(hd));
  if (r.factor <= 0) return f;
  const double wavelen = 2 * std::numbers::pi / f;
  const double low = r.original_max_positions / r.low_freq_factor, high = r.original_max_positions / r.high_freq_factor;
  if (wavelen > low) return f / r.factor;
  if (wavelen < high) return f;
  const double smooth =
      (r.original_max_positions / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  return (1 - smooth) * f / r.factor + smooth * f;
}

template <class D>
struct Rotary;

template <>
struct Rotary<Host> {
  template <class T>
  static void forward(Host&, T* qkv, index B, index Tn, index G, index g, index hd, const Rope& r, Positions pos = {}) {
    rotate(qkv, B, Tn, G, g, hd, r, pos, 1.0);
  }
  template <class T>
  static void backward(Host&, T* dqkv, index B, index Tn, index G, index g, index hd, const Rope& r,
                       Positions pos = {}) {
    rotate(dqkv, B, Tn, G, g, hd, r, pos, -1.0);
  }

 private:
  // The angles' cosines and sines for the positions of rows 0 .. Tn - 1, (Tn, hd/2) each, computed in
  // double and rounded to S once; kept by the calling thread until it asks for other positions,
  // sizes or frequencies (a run asks for the same ones every layer and step).
  template <class S>
  struct Table {
    index Tn = -1, hd = -1;
    Positions pos{-1};
    Rope rope{};
    std::vector<S> cos, sin;
  };
  template <class S>
  static const Table<S>& table(index Tn, index hd, const Rope& r, Positions pos) {
    thread_local Table<S> t;
    const auto same = [&](const Rope& o) {
      return o.theta == r.theta && o.factor == r.factor && o.low_freq_factor == r.low_freq_factor &&
             o.high_freq_factor == r.high_freq_factor && o.original_max_positions == r.original_max_positions;
    };
    if (t.Tn == Tn && t.hd == hd && t.pos == pos && same(t.rope)) return t;
    const index half = hd / 2;
    t.cos.assign(static_cast<std::size_t>(Tn * half), S(0));
    t.sin.assign(static_cast<std::size_t>(Tn * half), S(0));
    for (index i = 0; i < half; ++i) {
      const double f = rope_inv_freq(i, hd, r);
      for (index p = 0; p < Tn; ++p) {
        const double a = static_cast<double>(pos.at(p)) * f;
        t.cos[static_cast<std::size_t>(p * half + i)] = static_cast<S>(std::cos(a));
        t.sin[static_cast<std::size_t>(p * half + i)] = static_cast<S>(std::sin(a));
      }
    }
    t.Tn = Tn, t.hd = hd, t.pos = pos, t.rope = r;
    return t;
  }

  template <class T>
  static void rotate(T* qkv, index B, index Tn, index G, index g, index hd, const Rope& r, Positions pos, double sign) {
    using S = acc<T>;
    const host::Timed timed(host::Op::rotary);
    const index half = hd / 2, row = G * (g + 2) * hd;
    const Table<S>& tab = table<S>(Tn, hd, r, pos);
    const S sg = static_cast<S>(sign);  // the backward rotates by -a: sin(-a) = -sin(a), exactly
    host::split(B * Tn, host::kRows, [&](index lo, index hi) {
      for (index n = lo; n < hi; ++n) {
        const S* __restrict co = tab.cos.data() + (n % Tn) * half;
        const S* __restrict si = tab.sin.data() + (n % Tn) * half;
        for (index grp = 0; grp < G; ++grp)
          for (index h = 0; h <= g; ++h) {                                // the g queries and the key
            T* __restrict x0 = qkv + n * row + (grp * (g + 2) + h) * hd;  // the first half
            T* __restrict x1 = x0 + half;                                 // the second
            for (index i = 0; i < half; ++i) {
              const S a = widen(x0[i]), b = widen(x1[i]), s = sg * si[i];
              x0[i] = narrow<T>(a * co[i] - b * s);
              x1[i] = narrow<T>(b * co[i] + a * s);
            }
          }
      }
    });
  }
};

template <class D>
struct Rotary<Meta<D>> : MetaPass<D> {};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_ROTARY_INSTANCES(EXTERN, T)                                                                   \
  EXTERN template void weft::ops::Rotary<weft::Host>::forward<T>(weft::Host&, T*, std::int64_t, std::int64_t,   \
                                                                 std::int64_t, std::int64_t, std::int64_t,      \
                                                                 const weft::ops::Rope&, weft::ops::Positions); \
  EXTERN template void weft::ops::Rotary<weft::Host>::backward<T>(weft::Host&, T*, std::int64_t, std::int64_t,  \
                                                                  std::int64_t, std::int64_t, std::int64_t,     \
                                                                  const weft::ops::Rope&, weft::ops::Positions);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_ROTARY_INSTANCES)
