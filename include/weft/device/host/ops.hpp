// The host kernels' shared helpers: fixed-order sums in lanes, Eigen's packets over chunks, row sums,
// exponentials of a row. Each op's own host kernels are in its file, ops/<op>.hpp, in namespace
// weft::host beside the op that calls them (ops/op.hpp).
//
// The host kernels are the reference the CUDA ops are tested against, and the compute of the host back end,
// for T = double (finite-difference checks exact to 1e-6 and better), float, and bf16 storage. Each
// op reads T, computes in S = accumulate_t<T> (float for bf16; T otherwise) and writes a T output
// once (one rounding, where the GPU rounds); parameter gradients, statistics and the optimizer's
// buffers are in S (core/precision.hpp). For float and double, widen and narrow are the identity.
// Conventions, as in llm.c: activation gradients are written (=), parameter gradients accumulate
// (+=) so micro-batches add up; sizes are element counts.
//
// double runs plain serial loops: the oracle. Float (and bf16, computed in float) takes faster
// paths with the same maths, checked against double in tests/device/host/ops.cpp: Eigen's
// vectorized exp (GELU, softmax, cross-entropy), row sums in 16 lanes (detail::lane_sum), the
// attention core on GEMMs. Every reduction's order is fixed by the sizes alone, so results are
// bitwise repeatable run to run and rank to rank.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <Eigen/Core>

#include "weft/core/dtype.hpp"
#include "weft/core/philox.hpp"
#include "weft/core/shape.hpp"
#include "weft/device/host/gemm.hpp"
#include "weft/device/host/init.hpp"

namespace weft::host {

using index = std::int64_t;

namespace detail {

// sum over i < n of f(i) in kLanes partial sums (lane j takes i = j, j + kLanes, ...), added at the
// end in a fixed tree: the compiler vectorizes it without reordering anything, and the order
// depends on n only, so the bits are the same in every run and on every rank. A is the sum's type.
inline constexpr index kLanes = 16;
template <class A, class F>
A lane_sum(index n, F f) {
  A lane[kLanes] = {};
  index i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (index j = 0; j < kLanes; ++j) lane[j] += f(i + j);
  for (index j = 0; i + j < n; ++j) lane[j] += f(i + j);
  for (index w = kLanes / 2; w > 0; w /= 2)
    for (index j = 0; j < w; ++j) lane[j] += lane[j + w];
  return lane[0];
}

// max over x[0, n) (n >= 1) in kLanes lanes: exact in any order, and vectorized.
inline float lane_max(index n, const float* x) {
  float lane[kLanes];
  std::fill(lane, lane + kLanes, -std::numeric_limits<float>::infinity());
  index i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (index j = 0; j < kLanes; ++j) lane[j] = lane[j] > x[i + j] ? lane[j] : x[i + j];
  for (index j = 0; i + j < n; ++j) lane[j] = lane[j] > x[i + j] ? lane[j] : x[i + j];
  float m = lane[0];
  for (index j = 1; j < kLanes; ++j) m = m > lane[j] ? m : lane[j];
  return m;
}

// Elementwise float math on Eigen's packets (its vectorized tanh and exp), in chunks of kChunk
// elements copied (widened) into aligned buffers, the last chunk padded: every element takes the
// packet path whatever its address or position, so the same input gives the same bits on every
// rank and in every run.
inline constexpr index kChunk = 256;
using Chunk = Eigen::Array<float, kChunk, 1>;
using ChunkMap = Eigen::Map<Chunk, Eigen::Aligned64>;

// out[i] = f(a[i], b[i]) (b may be null) for i < n; f takes and returns chunks.
template <class T, class F>
void chunked(T* out, const T* a, const T* b, index n, F f) {
  alignas(64) float ab[kChunk], bb[kChunk], ob[kChunk];
  for (index at = 0; at < n; at += kChunk) {
    const index len = std::min(kChunk, n - at);
    for (index i = 0; i < len; ++i) ab[i] = static_cast<float>(widen(a[at + i]));
    std::fill(ab + len, ab + kChunk, 0.0f);
    if (b) {
      for (index i = 0; i < len; ++i) bb[i] = static_cast<float>(widen(b[at + i]));
      std::fill(bb + len, bb + kChunk, 0.0f);
    }
    ChunkMap o(ob);
    o = f(ChunkMap(ab), ChunkMap(bb));
    for (index i = 0; i < len; ++i) out[at + i] = narrow<T>(ob[i]);
  }
}

}  // namespace detail

// Row sums: serial in double (the oracle), detail::lane_sum in float.
template <class S, class F>
S row_sum(index n, F f) {
  if constexpr (std::same_as<S, double>) {
    S s = 0;
    for (index i = 0; i < n; ++i) s += f(i);
    return s;
  } else {
    return detail::lane_sum<S>(n, f);
  }
}

namespace detail {

// buf[0, n) = exp(x[i] - shift) in float for x in T (float or bf16), on Eigen's packets.
template <class T>
void exp_rows(std::vector<float, Eigen::aligned_allocator<float>>& buf, const T* x, index n, float shift) {
  const index padded = (n + 15) / 16 * 16;
  if (static_cast<index>(buf.size()) < padded) buf.resize(static_cast<std::size_t>(padded));
  for (index i = 0; i < n; ++i) buf[static_cast<std::size_t>(i)] = static_cast<float>(widen(x[i]));
  std::fill(buf.data() + n, buf.data() + padded, shift);
  Eigen::Map<Eigen::ArrayXf, Eigen::Aligned16> b(buf.data(), padded);
  b = (b - shift).exp();
}

}  // namespace detail

}  // namespace weft::host

// Separate compilation of the host kernels, for builds that want it, as gemm.hpp does the GEMM's:
// each op's file lists its Host specialization's entry points in a macro INSTANCES(EXTERN, T) for
// T = float, double and bf16 (and those of other type pairs in one PAIRS(EXTERN)), and declares
// them extern when WEFT_HOST_KERNELS_COMPILED=1, so
// that the one unit that includes weft/ops/host_instances.hpp compiles them, once, and
// may compile them optimized in a Debug build: at -O0 the kernels' Eigen packets are calls, and a
// model test or a trainer spends most of its time in them (more than 10 times slower than at -O2,
// docs/build.md). CMake's weft::host_kernels does both; header-only use is unchanged.
#if defined(WEFT_HOST_KERNELS_COMPILED) && WEFT_HOST_KERNELS_COMPILED
#define WEFT_HOST_KERNELS_EXTERN(INSTANCES) \
  INSTANCES(extern, float) INSTANCES(extern, double) INSTANCES(extern, weft::bf16)
#define WEFT_HOST_KERNELS_EXTERN_ONCE(INSTANCES) INSTANCES(extern)
#else
#define WEFT_HOST_KERNELS_EXTERN(INSTANCES)
#define WEFT_HOST_KERNELS_EXTERN_ONCE(INSTANCES)
#endif
#define WEFT_HOST_KERNELS_DEFINE(INSTANCES) INSTANCES(, float) INSTANCES(, double) INSTANCES(, weft::bf16)
