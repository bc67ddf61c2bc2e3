// Finite-difference gradient checks in double.
//
// Five-point central differences, (8 (f(x+h) - f(x-h)) - (f(x+2h) - f(x-2h))) / 12h, with h = 1e-4:
// truncation error ~ h^4 f^(5) / 30, negligible even where LayerNorms and a peaked softmax make
// third derivatives large (the plain two-point rule's h^2 f''' / 6 was ~1e-7 in the tiny GPT), and
// round-off ~ eps |L| / h ~ 1e-11 for the O(1) losses used here. The error of element i is
// |analytic - numeric| / max(|analytic|, |numeric|, 1e-3): relative, with gradients below 1e-3
// compared absolutely (a masked, exactly-zero gradient must then be below 1e-9).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "support/error.hpp"
#include "weft/core/philox.hpp"

namespace weft::test {

struct GradCheck {
  double worst = 0;
  int checked = 0;
};

// Checks up to `samples` elements of `x` (all of them when it has fewer), drawn without bias.
template <class Loss>
GradCheck gradcheck(std::span<double> x, std::span<const double> analytic, Loss&& loss, int samples = 100,
                    std::uint64_t seed = 1, double h = 1e-4) {
  GradCheck r;
  const std::size_t n = x.size();
  for (int s = 0; s < samples && s < static_cast<int>(n); ++s) {
    const std::size_t i = n <= static_cast<std::size_t>(samples)
                              ? static_cast<std::size_t>(s)
                              : static_cast<std::size_t>(weft::philox(seed, 77, static_cast<std::uint64_t>(s))[0] % n);
    const double keep = x[i];
    auto at = [&](double dx) {
      x[i] = keep + dx;
      const double l = loss();
      x[i] = keep;
      return l;
    };
    const double numeric = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h);
    const double err = std::fabs(analytic[i] - numeric) / std::max({std::fabs(analytic[i]), std::fabs(numeric), 1e-3});
    r.worst = worse(r.worst, err);
    ++r.checked;
  }
  return r;
}

template <class Loss>
GradCheck gradcheck(std::vector<double>& x, const std::vector<double>& analytic, Loss&& loss, int samples = 100,
                    std::uint64_t seed = 1, double h = 1e-4) {
  return gradcheck(std::span<double>(x), std::span<const double>(analytic), loss, samples, seed, h);
}

inline std::vector<double> normals(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * weft::normal(seed, 5, i);
  return v;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace weft::test
