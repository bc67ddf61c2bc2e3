// Finite-difference gradient checks in double.
//
// Central differences with step h = 1e-4: truncation error ~ h^2 f''' ~ 1e-8 and round-off
// ~ eps |L| / h ~ 1e-11 for the O(1) losses used here. The error of element i is
// |analytic - numeric| / max(|analytic|, |numeric|, 1e-3): relative, with gradients below 1e-3
// compared absolutely (a masked, exactly-zero gradient must then be below 1e-9).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "weft/core/philox.hpp"

namespace weft::test {

struct GradCheck {
  double worst = 0;
  int checked = 0;
};

// Checks up to `samples` elements of `x` (all of them when it has fewer), drawn without bias.
template <class Loss>
GradCheck gradcheck(std::vector<double>& x, const std::vector<double>& analytic, Loss&& loss, int samples = 100,
                    std::uint64_t seed = 1, double h = 1e-4) {
  GradCheck r;
  const std::size_t n = x.size();
  for (int s = 0; s < samples && s < static_cast<int>(n); ++s) {
    const std::size_t i = n <= static_cast<std::size_t>(samples)
                              ? static_cast<std::size_t>(s)
                              : static_cast<std::size_t>(weft::philox(seed, 77, static_cast<std::uint64_t>(s))[0] % n);
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss();
    x[i] = keep - h;
    const double down = loss();
    x[i] = keep;
    const double numeric = (up - down) / (2 * h);
    const double err = std::fabs(analytic[i] - numeric) / std::max({std::fabs(analytic[i]), std::fabs(numeric), 1e-3});
    r.worst = std::max(r.worst, err);
    ++r.checked;
  }
  return r;
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
