// The host reduction every host back end shares: out[i - offset] = ins[0][i] (+ or max) ins[1][i]
// ... ins[n-1][i] for i in [lo, hi), accumulated in accumulate_t<T> (bf16 in f32) in rank order and
// rounded once. Back ends that add in this order give bitwise the same results as each other
// (threads and MPI), whichever rank computes an element.
//
// This header is plain C++20.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "weft/comm/communicator.hpp"
#include "weft/core/dtype.hpp"

namespace weft {

template <Element T>
void reduce_in_rank_order(T* out, const std::vector<const T*>& ins, std::int64_t lo, std::int64_t hi, ReduceOp op,
                          std::int64_t offset) {
  using A = accumulate_t<T>;
  constexpr std::int64_t block = 1024;
  A acc[block];
  for (std::int64_t base = lo; base < hi; base += block) {
    const std::int64_t len = std::min(block, hi - base);
    for (std::int64_t i = 0; i < len; ++i) acc[i] = widen(ins[0][base + i]);
    for (std::size_t r = 1; r < ins.size(); ++r) {
      const T* in = ins[r] + base;
      if (op == ReduceOp::sum) {
        for (std::int64_t i = 0; i < len; ++i) acc[i] += widen(in[i]);
      } else {
        for (std::int64_t i = 0; i < len; ++i) {
          const A v = widen(in[i]);
          acc[i] = (v > acc[i] || v != v) ? v : acc[i];  // max that propagates NaN
        }
      }
    }
    for (std::int64_t i = 0; i < len; ++i) out[base - offset + i] = narrow<T>(acc[i]);
  }
}

}  // namespace weft
