// Test helpers for layouts: exact global tensors, their local parts under any layout (Partial
// axes split into random addends that sum exactly), and the inverse reconstruction.
//
// Values are dyadic rationals k/64 with |k| <= 1000, so every sum of a few of them is exact in
// double, whatever the order: redistribution results can then be compared with ==.
#pragma once

#include <cstdint>
#include <vector>

#include "weft/core/philox.hpp"
#include "weft/layout/layout.hpp"
#include "weft/tensor/tensor.hpp"

namespace weft::test {

template <class... Ts> struct List {};

// The layout that places elements like L but treats Partial as full extent (where an element sits).
template <Placement P> using position_of = std::conditional_t<IsPartial<P>, Replicate, P>;
template <LayoutType L>
using positions = Layout<position_of<typename L::data>, position_of<typename L::tensor>, position_of<typename L::pipe>,
                         position_of<typename L::context>>;

inline double dyadic(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  return static_cast<double>(static_cast<std::int64_t>(weft::philox(seed, stream, i)[0] % 2001) - 1000) / 64.0;
}

// The global flat index of each local element of a tensor in layout L (Partial counts as full).
template <LayoutType L, class D>
std::int64_t position(const Tensor<double, L, D>& t, std::int64_t i) {
  auto& self = const_cast<Tensor<double, L, D>&>(t);
  return Tensor<double, positions<L>, D>::view(self.dev(), self.data(), t.global_shape(), t.spread()).global_index(i);
}

// Addend `index` of `degree` for value v: random dyadics, the last one completes the sum exactly.
inline double addend(double v, std::int64_t g, int index, int degree, std::uint64_t salt) {
  double rest = v;
  for (int j = 0; j + 1 < degree; ++j) {
    const double r = dyadic(salt, static_cast<std::uint64_t>(j), static_cast<std::uint64_t>(g));
    if (j == index) return r;
    rest -= r;
  }
  return rest;
}

// This rank's part of global tensor X (flat, row-major) in layout L.
template <LayoutType L, class D>
Tensor<double, L, D> distribute(D& dev, const std::vector<double>& X, const Shape& global, const Spread& s) {
  auto t = Tensor<double, L, D>::empty(dev, global, s);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const std::int64_t g = position(t, i);
    double v = X[static_cast<std::size_t>(g)];
    if constexpr (IsPartial<typename L::data>) v = addend(v, g, s.data_index, s.data_degree, 101);
    if constexpr (IsPartial<typename L::tensor>) v = addend(v, g, s.tensor_index, s.tensor_degree, 202);
    if constexpr (IsPartial<typename L::context>) v = addend(v, g, s.context_index, s.context_degree, 303);
    t[i] = v;
  }
  return t;
}

// Adds this rank's local part into `sum` at its global positions. Summed over all ranks, the result
// is X times the number of replicas (the product of the degrees of Replicate axes).
template <LayoutType L, class D>
void accumulate_global(const Tensor<double, L, D>& t, std::vector<double>& sum) {
  for (std::int64_t i = 0; i < t.numel(); ++i) sum[static_cast<std::size_t>(position(t, i))] += t[i];
}

template <LayoutType L>
int replicas(const Spread& s) {
  return (IsReplicate<typename L::data> ? s.data_degree : 1) * (IsReplicate<typename L::tensor> ? s.tensor_degree : 1) *
         (IsReplicate<typename L::pipe> ? s.pipe_degree : 1) *
         (IsReplicate<typename L::context> ? s.context_degree : 1);
}

}  // namespace weft::test
