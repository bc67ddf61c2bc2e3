// ops::Gemm: C (m, n) = alpha op(A) op(B) + beta C, accumulated in acc<T>.
//
// An op (ops/op.hpp; a user adds one the same way, in their own code): the primary template,
// the host's kernels and specialization and the Meta device's here, the Cuda device's in gemm.cuh.
// Layers call ops::Gemm<D>::run(dev, ...).
//
// defines: ops::Gemm (Host, Meta)
#pragma once

#include <cstdint>
#include <vector>

#include "weft/core/precision.hpp"
#include "weft/device/host/gemm.hpp"
#include "weft/device/host/host.hpp"
#include "weft/device/host/ops.hpp"
#include "weft/device/host/profile.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/device/meta/meta.hpp"
#include "weft/ops/op.hpp"

namespace weft::ops {

template <class D>
struct Gemm;

template <>
struct Gemm<Host> {
  // C (m, n) = alpha op(A) op(B) + beta C (see host::gemm): A and B in T, C in T or in acc<T> (the
  // parameter gradients of bf16 compute), accumulated in acc<T> and rounded once into C.
  template <class T, class C>
  static void run(Host&, Trans ta, Trans tb, index m, index n, index k, acc<T> alpha, const T* a, index lda, const T* b,
                  index ldb, acc<T> beta, C* c, index ldc) {
    static_assert(std::same_as<C, T> || std::same_as<C, acc<T>>, "ops::Gemm<Host>: C must be T or accumulate_t<T>");
    const host::Timed timed(host::Op::gemm);
    if constexpr (std::same_as<T, acc<T>>) {
      host::gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    } else {  // bf16 operands: widen, multiply in float, round once where C is bf16
      auto extent = [](index rows, index ld, index cols) { return rows > 0 && cols > 0 ? (rows - 1) * ld + cols : 0; };
      const std::vector<float> wa = widened(a, ta == Trans::yes ? extent(k, lda, m) : extent(m, lda, k));
      const std::vector<float> wb = widened(b, tb == Trans::yes ? extent(n, ldb, k) : extent(k, ldb, n));
      if constexpr (std::same_as<C, float>) {
        host::gemm<float>(ta, tb, m, n, k, alpha, wa.data(), lda, wb.data(), ldb, beta, c, ldc);
      } else {
        std::vector<float> wc = widened(c, beta == 0.0f ? 0 : extent(m, ldc, n));
        wc.resize(static_cast<std::size_t>(m * ldc));
        host::gemm<float>(ta, tb, m, n, k, alpha, wa.data(), lda, wb.data(), ldb, beta, wc.data(), ldc);
        for (index i = 0; i < m; ++i)
          for (index j = 0; j < n; ++j) c[i * ldc + j] = bf16(wc[static_cast<std::size_t>(i * ldc + j)]);
      }
    }
  }

 private:
  template <class T>
  static std::vector<float> widened(const T* p, index n) {
    std::vector<float> w(static_cast<std::size_t>(n));
    for (index i = 0; i < n; ++i) w[static_cast<std::size_t>(i)] = static_cast<float>(p[i]);
    return w;
  }
};

// The Meta device (cost/measure.hpp): the shape noted for the time model, nothing computed.
template <class D>
struct Gemm<Meta<D>> {
  template <class... A>
  static void run(Meta<D>& d, Trans ta, Trans tb, index m, index n, index k, A&&...) {
    d.work.gemm(m, n, k, ta == Trans::yes, tb == Trans::yes);
  }
};

}  // namespace weft::ops

// The Host kernels' instances, compiled once where WEFT_HOST_KERNELS_COMPILED=1 (device/host/ops.hpp).
#define WEFT_HOST_GEMM_OP_INSTANCES(EXTERN, T)                                                                \
  EXTERN template void weft::ops::Gemm<weft::Host>::run<T, T>(                                                \
      weft::Host&, weft::Trans, weft::Trans, std::int64_t, std::int64_t, std::int64_t, weft::accumulate_t<T>, \
      const T*, std::int64_t, const T*, std::int64_t, weft::accumulate_t<T>, T*, std::int64_t);
WEFT_HOST_KERNELS_EXTERN(WEFT_HOST_GEMM_OP_INSTANCES)
#define WEFT_HOST_GEMM_OP_PAIRS(EXTERN)                                                                          \
  EXTERN template void weft::ops::Gemm<weft::Host>::run<weft::bf16, float>(                                      \
      weft::Host&, weft::Trans, weft::Trans, std::int64_t, std::int64_t, std::int64_t, float, const weft::bf16*, \
      std::int64_t, const weft::bf16*, std::int64_t, float, float*, std::int64_t);
WEFT_HOST_KERNELS_EXTERN_ONCE(WEFT_HOST_GEMM_OP_PAIRS)
